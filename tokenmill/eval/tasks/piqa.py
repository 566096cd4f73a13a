"""PIQA (Bisk et al., 2020): physical commonsense, two solutions to a goal.

Harness: `lm_eval/tasks/piqa/piqa.yaml`. Original files (ybisk.github.io/piqa): `valid.jsonl`
with `goal`, `sol1`, `sol2`, and the labels (0/1), one per line, in `valid-labels.lst`.
"""

from __future__ import annotations

from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import Doc, SplitFiles, Task, read_jsonl


def read_with_labels(path: Path) -> list[Doc]:
    labels_path = path.with_name(path.name.removesuffix(".jsonl") + "-labels.lst")
    docs = read_jsonl(path)
    if not labels_path.exists():
        raise TokenmillError(f"task piqa: labels file {labels_path} not found (it comes next to {path.name})")
    labels = [line.strip() for line in labels_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(labels) != len(docs):
        raise TokenmillError(f"task piqa: {len(docs)} rows in {path} but {len(labels)} labels in {labels_path}")
    return [{**doc, "label": int(label)} for doc, label in zip(docs, labels, strict=True)]


class Piqa(Task):
    name = "piqa"
    metrics = ("acc", "acc_norm")
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = {
        "train": SplitFiles(("piqa_train.jsonl", "piqa/train.jsonl"), read_with_labels),
        "validation": SplitFiles(("piqa_valid.jsonl", "piqa/valid.jsonl"), read_with_labels),
    }
    hf_dataset = ("baber/piqa", None)
    source = "https://yonatanbisk.com/piqa/ (valid.jsonl + valid-labels.lst)"

    def doc_to_text(self, doc: Doc) -> str:
        return f"Question: {doc['goal']}\nAnswer:"

    def doc_to_target(self, doc: Doc) -> int:
        return int(doc["label"])

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [doc["sol1"], doc["sol2"]]
