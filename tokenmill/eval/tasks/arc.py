"""ARC (Clark et al., 2018): grade-school science questions, Easy and Challenge sets.

Harness: `lm_eval/tasks/arc/arc_easy.yaml` (`arc_challenge.yaml` includes it). Its dataset,
`allenai/ai2_arc` (`ARC-Easy` / `ARC-Challenge`), has `id`, `question`, `choices` (`text`,
`label`: "A"-"E" or "1"-"5") and `answerKey`; the test split is evaluated, few-shot examples come
from train.
"""

from __future__ import annotations

from typing import ClassVar

from tokenmill.eval.tasks.base import Doc, Task, answer_key, exported_files, require_fields


class ArcEasy(Task):
    name = "arc_easy"
    metrics = ("acc", "acc_norm")
    harness_splits = {"train": "train", "validation": "validation", "test": "test"}
    local_files = exported_files("arc_easy", ("train", "validation", "test"))
    hf_dataset = ("allenai/ai2_arc", "ARC-Easy")
    source = "https://huggingface.co/datasets/allenai/ai2_arc (ARC-Easy, as JSON lines)"
    question_field: ClassVar[str] = "question"

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, self.question_field)
        # answerKey as it is among choices.label (a stray space is dropped, as OpenBookQA's lstrip).
        return {**doc, "answerKey": answer_key(doc)}

    def doc_to_text(self, doc: Doc) -> str:
        return f"Question: {doc['question']}\nAnswer:"

    def doc_to_target(self, doc: Doc) -> int:
        # answerKey is text (process_doc); labels stored as numbers are compared as text.
        return [str(label) for label in doc["choices"]["label"]].index(doc["answerKey"])

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return list(doc["choices"]["text"])


class ArcChallenge(ArcEasy):
    name = "arc_challenge"
    local_files = exported_files("arc_challenge", ("train", "validation", "test"))
    hf_dataset = ("allenai/ai2_arc", "ARC-Challenge")
    source = "https://huggingface.co/datasets/allenai/ai2_arc (ARC-Challenge, as JSON lines)"
