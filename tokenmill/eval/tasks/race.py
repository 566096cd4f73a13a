"""RACE, high-school subset (Lai et al., 2017): reading comprehension of English exams.

Harness: `lm_eval/tasks/race/` groups the questions of one article into one document; earlier
questions are shown answered in the prompt and the last one is scored. Original files
(cs.cmu.edu/~glai1/data/race: `RACE/test/high/<id>.txt`, one JSON object per article with
`article`, `questions`, `options`, `answers`) are grouped the same way; a JSON-lines file in the
harness dataset's own layout (`article`, `problems`) is read too.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import Doc, SplitFiles, Task, read_jsonl

LETTERS = {"A": 0, "B": 1, "C": 2, "D": 3}


def _sort_key(path: Path) -> tuple[int, str]:
    return (int(path.stem), path.name) if path.stem.isdigit() else (1 << 62, path.name)


def read_race(path: Path) -> list[Doc]:
    if path.is_file():
        return read_jsonl(path)
    docs: list[Doc] = []
    files = sorted(path.glob("*.txt"), key=_sort_key)
    if not files:
        raise TokenmillError(f"task race: no <id>.txt articles in {path}")
    for file in files:
        raw = json.loads(file.read_text(encoding="utf-8"))
        problems = [
            {"answer": a, "options": o, "question": q}
            for a, o, q in zip(raw["answers"], raw["options"], raw["questions"], strict=True)
        ]
        docs.append({"article": raw["article"], "problems": repr(problems), "example_id": raw.get("id", file.name)})
    return docs


def problems(doc: Doc) -> list[dict]:
    value = doc["problems"]
    return ast.literal_eval(value) if isinstance(value, str) else value


def answer_option(problem: dict) -> str:
    return problem["options"][LETTERS[problem["answer"]]]


class RaceHigh(Task):
    name = "race"
    metrics = ("acc",)
    harness_splits = {"train": None, "validation": None, "test": "test"}
    local_files = {
        "test": SplitFiles(("RACE/test/high", "race/test/high", "race_high_test.jsonl"), read_race),
    }
    hf_dataset = ("EleutherAI/race", "high")
    source = "https://www.cs.cmu.edu/~glai1/data/race/ (RACE.tar.gz)"

    def doc_to_text(self, doc: Doc) -> str:
        probs = problems(doc)
        text = "Article: " + doc["article"] + "\n\n"
        for problem in probs[:-1]:
            if problem["question"][-6:] == "  _  .":
                text += problem["question"][:-5] + answer_option(problem) + "\n"
            else:
                text += "Question: " + problem["question"] + "\n" + "Answer: " + answer_option(problem) + "\n"
        return text + probs[-1]["question"]

    def doc_to_target(self, doc: Doc) -> int:
        return LETTERS[problems(doc)[-1]["answer"]]

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [problems(doc)[-1]["options"][i] for i in range(4)]
