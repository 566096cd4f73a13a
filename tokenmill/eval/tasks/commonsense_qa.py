"""CommonsenseQA (Talmor et al., 2019): five-way questions on ConceptNet relations.

Harness: `lm_eval/tasks/commonsense_qa/default.yaml`. Its dataset, `tau/commonsense_qa`, has
`id`, `question`, `question_concept`, `choices` (`label` "A"-"E", `text`) and `answerKey`. The
five answers are listed in the prompt and the model scores the letters " A" ... " E" (an MMLU-style
prompt). It has no labelled test split, so the validation split is evaluated and few-shot
examples come from train.
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, RowError, Task, answer_key, exported_files, require_fields

LETTERS = ("A", "B", "C", "D", "E")


class CommonsenseQA(Task):
    name = "commonsense_qa"
    metrics = ("acc",)
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = exported_files("commonsense_qa", ("train", "validation"))
    hf_dataset = ("tau/commonsense_qa", None)
    source = "https://huggingface.co/datasets/tau/commonsense_qa (as JSON lines)"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "question")
        key = answer_key(doc, LETTERS)
        if len(doc["choices"]["text"]) != len(LETTERS):
            raise RowError(f"choices.text has {len(doc['choices']['text'])} answers, not {len(LETTERS)}")
        return {**doc, "answerKey": key}

    def doc_to_text(self, doc: Doc) -> str:
        listed = "".join(f"\n{letter}. {text}" for letter, text in zip(LETTERS, doc["choices"]["text"], strict=True))
        return f"Question: {doc['question'].strip()}{listed}\nAnswer:"

    def doc_to_target(self, doc: Doc) -> str:
        return doc["answerKey"]

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return list(LETTERS)
