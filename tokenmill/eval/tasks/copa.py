"""COPA (Roemmele et al., 2011): the more plausible cause or effect of a premise.

Harness: `lm_eval/tasks/super_glue/copa/` (default.yaml + utils.py). Its dataset,
`aps/super_glue` `copa`, has `premise`, `choice1`, `choice2`, `question` ("cause"/"effect") and
`label` (0/1). The premise loses its final period and gains "because"/"therefore"; each choice,
its first letter lowered, is the continuation. The harness's choices start with a space and its
target delimiter adds another, so each continuation starts with two. The validation split is
evaluated, few-shot examples come from train.
"""

from __future__ import annotations

from tokenmill.eval.tasks.base import Doc, RowError, Task, exported_files, parse_label, require_fields

CONNECTORS = {"cause": "because", "effect": "therefore"}


def convert_choice(choice: str) -> str:
    return choice[0].lower() + choice[1:]


class Copa(Task):
    name = "copa"
    metrics = ("acc",)
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = exported_files("copa", ("train", "validation"))
    hf_dataset = ("aps/super_glue", "copa")
    source = "https://huggingface.co/datasets/aps/super_glue (copa, as JSON lines)"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "premise", "choice1", "choice2", "question", "label")
        if doc["question"] not in CONNECTORS:
            raise RowError(f"question {doc['question']!r} is not 'cause' or 'effect'")
        return {**doc, "label": parse_label(doc["label"], 2)}

    def doc_to_text(self, doc: Doc) -> str:
        # The premise's final period is dropped.
        return doc["premise"].strip()[:-1] + f" {CONNECTORS[doc['question']]}"

    def doc_to_target(self, doc: Doc) -> str:
        correct = doc["choice1"] if doc["label"] == 0 else doc["choice2"]
        return " " + convert_choice(correct)

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [" " + convert_choice(doc["choice1"]), " " + convert_choice(doc["choice2"])]
