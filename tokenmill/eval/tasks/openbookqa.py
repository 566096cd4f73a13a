"""OpenBookQA (Mihaylov et al., 2018): elementary science questions that need a fact and common sense.

Harness: `lm_eval/tasks/openbookqa/openbookqa.yaml`. Its dataset, `allenai/openbookqa` `main`,
has `id`, `question_stem`, `choices` (`text`, `label` "A"-"D") and `answerKey`; the question stem
alone is the prompt (no "Question:"/"Answer:"). Choices, target and metrics are ARC's; the test
split is evaluated, few-shot examples come from train.
"""

from __future__ import annotations

from tokenmill.eval.tasks.arc import ArcEasy
from tokenmill.eval.tasks.base import Doc, exported_files


class OpenBookQA(ArcEasy):
    name = "openbookqa"
    local_files = exported_files("openbookqa", ("train", "validation", "test"))
    hf_dataset = ("allenai/openbookqa", "main")
    source = "https://huggingface.co/datasets/allenai/openbookqa (main, as JSON lines)"
    question_field = "question_stem"

    def doc_to_text(self, doc: Doc) -> str:
        return doc["question_stem"]
