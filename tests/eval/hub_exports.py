"""Small JSON-lines files in the Hugging Face schemas of ARC, OpenBookQA, Social IQa, COPA,
CommonsenseQA and WSC273, rebuilt from the real questions of llm-foundry's ICL files.

The ICL files keep each question's prompt, choices and gold; the fields they dropped are rebuilt:
ARC's and OpenBookQA's ids and labels (every fifth ARC row labelled "1"-"4", as part of ARC is),
COPA's premise, question and capitalised choices, Social IQa's third answer and CommonsenseQA's
fifth (another row's answer, a distractor), WSC273's pronoun, its offset, the quote and the
capitalised options (the ICL file substituted the options for the pronoun).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

POOL_ROWS = 24  # the train split's rows (the few-shot pool); WSC273's pool is its test split
LETTERS = "ABCDE"


def _icl(icl_dir: Path, rel: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (icl_dir / rel).read_text(encoding="utf-8").splitlines() if line.strip()]


def _after(text: str, marker: str) -> str:
    return text.split(marker, 1)[1].split("\n", 1)[0]


def _arc(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        labels = list("1234") if i % 5 == 4 else list(LETTERS[: len(row["choices"])])
        out.append(
            {
                "id": f"{name}_{i}",
                "question": row["query"].removeprefix("Question: "),
                "choices": {"text": row["choices"], "label": labels},
                "answerKey": labels[row["gold"]],
            }
        )
    return out


def _openbookqa(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    labels = list(LETTERS[:4])
    return [
        {
            "id": f"obqa_{i}",
            "question_stem": row["query"],
            "choices": {"text": row["choices"], "label": labels},
            "answerKey": labels[row["gold"]],
        }
        for i, row in enumerate(rows)
    ]


def _answers(query: str) -> list[str]:
    return [_after(query, f"\n{letter}. ") for letter in LETTERS if f"\n{letter}. " in query]


def _social_iqa(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        answers = _answers(row["query"]) + [_answers(rows[(i + 7) % len(rows)]["query"])[0]]
        gold = row["gold"]
        if i % 3 == 2:  # the correct answer third, as a third of the real labels are
            answers[gold], answers[2] = answers[2], answers[gold]
            gold = 2
        out.append(
            {
                "context": _after(row["query"], "Context: "),
                "question": _after(row["query"], "Question: "),
                "answerA": answers[0],
                "answerB": answers[1],
                "answerC": answers[2],
                "label": str(gold + 1),
            }
        )
    return out


def _copa(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        premise, connector = row["query"].rsplit(", ", 1)
        choice1, choice2 = (c[0].upper() + c[1:] for c in row["choices"])
        question = {"because": "cause", "therefore": "effect"}[connector]
        out.append(
            {
                "premise": premise + ".",
                "choice1": choice1,
                "choice2": choice2,
                "question": question,
                "idx": i,
                "label": row["gold"],
            }
        )
    return out


def _commonsense_qa(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        texts = _answers(row["query"]) + [_answers(rows[(i + 11) % len(rows)]["query"])[-1]]
        out.append(
            {
                "id": f"csqa_{i}",
                "question": _after(row["query"], "Question: "),
                "question_concept": "",
                "choices": {"label": list(LETTERS), "text": texts},
                "answerKey": LETTERS[row["gold"]],
            }
        )
    return out


def _wsc273(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        first, second = row["context_options"]
        prefix = os.path.commonprefix([first, second])
        prefix = prefix[: prefix.rfind(" ") + 1]  # back to a word boundary ("Sue"/"Sally")
        options = [first[len(prefix) :], second[len(prefix) :]]
        if prefix.endswith("the "):  # the harness's dataset writes "The trophy" for the pronoun
            prefix = prefix[: -len("the ")]
            options = [f"The {option}" for option in options]
        pronoun = "they" if options[0].endswith("s") else "it" if options[0].startswith("The ") else "he"
        # A double space, which the harness's preprocessing collapses, in every fourth text.
        gap = "  " if i % 4 == 3 else " "
        text = f"{prefix}{pronoun}{gap}{row['continuation']}"
        out.append(
            {
                "text": text,
                "pronoun": pronoun,
                "pronoun_loc": len(prefix),
                "quote": f"{pronoun}{gap}{row['continuation']}".rstrip("."),
                "quote_loc": len(prefix),
                "options": options,
                "label": row["gold"],
                "source": "(Levesque et al., 2012)",
            }
        )
    return out


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


# Our task -> (ICL file, converter, the split evaluated, the split of few-shot examples or None).
EXPORTS = {
    "arc_easy": ("world_knowledge/arc_easy.jsonl", lambda rows: _arc(rows, "arc_easy"), "test", "train"),
    "arc_challenge": ("world_knowledge/arc_challenge.jsonl", lambda rows: _arc(rows, "arc_challenge"), "test", "train"),
    "openbookqa": ("commonsense_reasoning/openbook_qa.jsonl", _openbookqa, "test", "train"),
    "social_iqa": ("commonsense_reasoning/siqa.jsonl", _social_iqa, "validation", "train"),
    "copa": ("commonsense_reasoning/copa.jsonl", _copa, "validation", "train"),
    "commonsense_qa": ("commonsense_reasoning/commonsense_qa.jsonl", _commonsense_qa, "validation", "train"),
    "wsc273": ("language_understanding/winograd_wsc.jsonl", _wsc273, "test", None),
}


def write_hub_exports(icl_dir: Path, out: Path, n_eval: int) -> dict[str, dict[str, Path]]:
    """Write `<task>_<split>.jsonl` files into `out`: up to `n_eval` rows of the evaluated split
    and POOL_ROWS of the few-shot split; returns task -> {split: file}."""
    written: dict[str, dict[str, Path]] = {}
    for task, (rel, convert, eval_split, pool_split) in EXPORTS.items():
        rows = convert(_icl(icl_dir, rel))
        n = min(n_eval, len(rows) - POOL_ROWS) if pool_split else min(n_eval, len(rows))
        files = {eval_split: _write(out / f"{task}_{eval_split}.jsonl", rows[:n])}
        if pool_split:
            files[pool_split] = _write(out / f"{task}_{pool_split}.jsonl", rows[n : n + POOL_ROWS])
        written[task] = files
    return written
