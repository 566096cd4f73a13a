"""PIQA (Bisk et al., 2020): physical commonsense, two solutions to a goal.

Harness: `lm_eval/tasks/piqa/piqa.yaml`. Original files (ybisk.github.io/piqa): `valid.jsonl`
with `goal`, `sol1`, `sol2`, and the labels (0/1), one per line, in `valid-labels.lst`.
"""

from __future__ import annotations

from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import Doc, LabelError, Row, SplitFiles, Task, parse_label, read_jsonl


def labels_file(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".jsonl") + "-labels.lst")


def read_with_labels(path: Path) -> list[Row]:
    labels_path = labels_file(path)
    rows = read_jsonl(path)
    if not labels_path.exists():
        raise TokenmillError(f"task piqa: labels file {labels_path} not found (it comes next to {path.name})")
    labels: list[tuple[str, int]] = []
    for line_no, line in enumerate(labels_path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{labels_path}:{line_no}"
        try:
            labels.append((where, parse_label(line, 2)))
        except LabelError as error:
            raise TokenmillError(f"task piqa: {where}: {error}") from error
    if len(labels) != len(rows):
        raise TokenmillError(f"task piqa: {len(rows)} rows in {path} but {len(labels)} labels in {labels_path}")
    # Each row keeps its place in the .jsonl: a field it lacks is named there (a bad label was
    # named at its own line above).
    return [(where, {**doc, "label": label}) for (where, doc), (_, label) in zip(rows, labels, strict=True)]


class Piqa(Task):
    name = "piqa"
    metrics = ("acc", "acc_norm")
    harness_splits = {"train": "train", "validation": "validation", "test": None}
    local_files = {
        "train": SplitFiles(
            ("piqa_train.jsonl", "piqa/train.jsonl"), read_with_labels, "with piqa_train-labels.lst next to it"
        ),
        "validation": SplitFiles(
            ("piqa_valid.jsonl", "piqa/valid.jsonl"), read_with_labels, "with piqa_valid-labels.lst next to it"
        ),
    }
    hf_dataset = ("baber/piqa", None)
    source = "https://yonatanbisk.com/piqa/ (valid.jsonl + valid-labels.lst)"

    def doc_to_text(self, doc: Doc) -> str:
        return f"Question: {doc['goal']}\nAnswer:"

    def process_doc(self, doc: Doc) -> Doc:
        return {**doc, "label": parse_label(doc["label"], 2)}

    def doc_to_target(self, doc: Doc) -> int:
        return int(doc["label"])

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [doc["sol1"], doc["sol2"]]
