"""RACE, high-school subset (Lai et al., 2017): reading comprehension of English exams.

Harness: `lm_eval/tasks/race/` reads `EleutherAI/race` (`high`, test): one document per article,
its questions grouped in the order they appear; earlier questions are shown answered in the prompt
and the last one is scored. That dataset groups the rows of the Hugging Face `race` dataset (now
`ehovy/race`), which reads the articles in the order of the members of the published
`RACE.tar.gz`, by article text in order of first appearance.

Local sources, in the order they are looked for:

- `RACE.tar.gz` as published (cs.cmu.edu/~glai1/data/race): read in archive order, which is the
  harness's order, so `--limit N` scores the harness's first N articles;
- `race_high_test.jsonl`, the harness dataset's own rows (`article`, `problems`), in file order;
- the extracted `RACE/test/high/<id>.txt` files (one JSON object per article with `article`,
  `questions`, `options`, `answers`): extraction loses the archive order, so they are read in
  numeric file order, which is not the harness's (a warning says so).
"""

from __future__ import annotations

import ast
import json
import logging
import tarfile
from collections.abc import Iterable
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import (
    Doc,
    LabelError,
    Row,
    SplitFiles,
    Task,
    parse_label,
    read_jsonl,
    require_fields,
)

log = logging.getLogger(__name__)

LETTERS = ("A", "B", "C", "D")
ARCHIVE_SPLIT = "RACE/test/high/"


def _sort_key(path: Path) -> tuple[int, str]:
    return (int(path.stem), path.name) if path.stem.isdigit() else (1 << 62, path.name)


def _article_rows(where: str, raw: dict) -> list[Row]:
    """One article file -> one row per question, as the Hugging Face `race` dataset has them."""
    try:
        questions = zip(raw["questions"], raw["answers"], raw["options"], strict=True)
        return [
            (
                where,
                {"example_id": raw.get("id", ""), "article": raw["article"], "question": q, "answer": a, "options": o},
            )
            for q, a, o in questions
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise TokenmillError(f"task race: {where}: not a RACE article ({type(error).__name__}: {error})") from error


def group_by_article(rows: Iterable[Row]) -> list[Row]:
    """Per-question rows -> one document per article text, in order of first appearance."""
    groups: dict[str, tuple[str, Doc, list[dict]]] = {}
    for where, row in rows:
        if row["article"] not in groups:
            groups[row["article"]] = (where, row, [])
        groups[row["article"]][2].append(
            {"question": row["question"], "answer": row["answer"], "options": list(row["options"])}
        )
    return [
        (where, {"article": article, "problems": repr(problems), "example_id": first.get("example_id", "")})
        for article, (where, first, problems) in groups.items()
    ]


def read_archive(path: Path) -> list[Row]:
    rows: list[Row] = []
    try:
        with tarfile.open(path) as archive:
            for member in archive:  # archive order: the order the harness's dataset has
                name = member.name.removeprefix("./")
                if not (member.isfile() and name.startswith(ARCHIVE_SPLIT) and name.endswith(".txt")):
                    continue
                handle = archive.extractfile(member)
                assert handle is not None
                rows += _article_rows(f"{path}:{name}", json.loads(handle.read().decode("utf-8")))
    except (tarfile.TarError, OSError, json.JSONDecodeError) as error:
        raise TokenmillError(f"task race: cannot read {path} ({type(error).__name__}: {error})") from error
    if not rows:
        raise TokenmillError(f"task race: no {ARCHIVE_SPLIT}<id>.txt articles in {path}")
    return group_by_article(rows)


def read_race(path: Path) -> list[Row]:
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return read_archive(path)
    if path.is_file():
        return read_jsonl(path)
    files = sorted(path.glob("*.txt"), key=_sort_key)
    if not files:
        raise TokenmillError(f"task race: no <id>.txt articles in {path}")
    log.warning(
        "task race: %s is read in numeric file order, not the harness's (RACE.tar.gz's) order; "
        "put RACE.tar.gz in the data directory for the harness's documents under --limit",
        path,
    )
    rows: list[Row] = []
    for file in files:
        rows += _article_rows(str(file), json.loads(file.read_text(encoding="utf-8")))
    return group_by_article(rows)


def problems(doc: Doc) -> list[dict]:
    value = doc["problems"]
    return ast.literal_eval(value) if isinstance(value, str) else value


def answer_option(problem: dict) -> str:
    return problem["options"][LETTERS.index(problem["answer"])]


class RaceHigh(Task):
    name = "race"
    metrics = ("acc",)
    harness_splits = {"train": None, "validation": None, "test": "test"}
    local_files = {
        "test": SplitFiles(("RACE.tar.gz", "race_high_test.jsonl", "RACE/test/high", "race/test/high"), read_race),
    }
    hf_dataset = ("EleutherAI/race", "high")
    source = "https://www.cs.cmu.edu/~glai1/data/race/ (RACE.tar.gz)"

    def group_hub_rows(self, rows: list[Row]) -> list[Row]:
        # EleutherAI/race holds grouped documents; `ehovy/race` saved in its place holds questions.
        if rows and "problems" not in rows[0][1]:
            for where, row in rows:  # grouping reads them: a row without one is named first
                try:
                    require_fields(row, "article", "question", "answer", "options")
                except KeyError as error:
                    raise self.row_error(where, row, error) from error
            return group_by_article(rows)
        return rows

    def process_doc(self, doc: Doc) -> Doc:
        require_fields(doc, "article", "problems")
        for problem in problems(doc):
            parse_label(problem["answer"], 4, LETTERS, indexes=False)  # a letter outside A-D names no option
            if len(problem["options"]) != 4:
                raise LabelError(f"{len(problem['options'])} options instead of 4")
        return doc

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
        return LETTERS.index(problems(doc)[-1]["answer"])

    def doc_to_choice(self, doc: Doc) -> list[str]:
        return [problems(doc)[-1]["options"][i] for i in range(4)]
