"""Social IQa (Sap et al., 2019): reasoning about people's motives, reactions and what comes next.

Harness: `lm_eval/tasks/siqa/siqa.yaml`. Its dataset, `lighteval/siqa`, has `context`,
`question`, `answerA`, `answerB`, `answerC` and `label` ("1"-"3"); it has no test split, so the
validation split is evaluated and few-shot examples come from train.
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, Task, exported_files, parse_label, require_fields


class SocialIQa(Task):
    name = "social_iqa"
    metrics = ("acc",)
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = exported_files("social_iqa", ("train", "validation"))
    hf_dataset = ("lighteval/siqa", None)
    source = "https://huggingface.co/datasets/lighteval/siqa (as JSON lines)"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "context", "question", "answerA", "answerB", "answerC", "label")
        # `label` names answer 1, 2 or 3 ("1"-"3", as the harness's dataset stores it).
        return {**doc, "label": str(parse_label(doc["label"], 3, ("1", "2", "3"), indexes=False) + 1)}

    def doc_to_text(self, doc: Doc) -> str:
        return f"Q: {doc['context']} {doc['question']}\nA:"

    def doc_to_target(self, doc: Doc) -> int:
        return int(doc["label"]) - 1

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [doc["answerA"], doc["answerB"], doc["answerC"]]
