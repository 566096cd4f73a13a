"""What a benchmark task is: its splits, how its documents are read, prompted and scored.

Each task mirrors one lm-evaluation-harness 0.4.x task YAML (`lm_eval/tasks/...`): the same
`doc_to_text` / `doc_to_target` / `doc_to_choice`, the same split roles and metrics, so that the
requests built here are the requests the harness builds. Documents are plain dicts; every task
reads its benchmark's original public files from a data directory (`local_files`), or the
Hugging Face dataset the harness uses (`hf_dataset`) when the `datasets` library is online.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from tokenmill.errors import TokenmillError

Doc = dict[str, Any]
SplitRole = Literal["train", "validation", "test"]
OutputType = Literal["multiple_choice", "loglikelihood"]


class MissingDataError(TokenmillError):
    """A task's data file is not where the task expects it."""


@dataclass(frozen=True)
class SplitFiles:
    """Where a split's original files may lie in a data directory, first match wins."""

    candidates: tuple[str, ...]
    # Reads the first existing candidate (a file or a folder) into documents.
    reader: Callable[[Path], list[Doc]] = field(default=lambda path: read_jsonl(path))


def read_jsonl(path: Path) -> list[Doc]:
    docs: list[Doc] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise TokenmillError(f"{path}:{line_no}: not a JSON line ({error.msg})") from error
    return docs


class Task:
    """One benchmark, prompted and scored as lm-evaluation-harness 0.4.x does."""

    name: ClassVar[str]
    output_type: ClassVar[OutputType] = "multiple_choice"
    metrics: ClassVar[tuple[str, ...]] = ("acc",)
    # Split roles as in the harness YAML (`training_split`, `validation_split`, `test_split`).
    # The evaluated split is the test split if the YAML names one, else the validation split;
    # few-shot examples come from train, else validation, else test.
    harness_splits: ClassVar[dict[SplitRole, str | None]] = {}
    # Original public files for each split role, relative to --data-dir.
    local_files: ClassVar[dict[SplitRole, SplitFiles]] = {}
    # (path, name) of the Hugging Face dataset the harness loads.
    hf_dataset: ClassVar[tuple[str, str | None]] = ("", None)
    # Where the original files can be downloaded, for the missing-file message.
    source: ClassVar[str] = ""
    # Winogrande-style tasks: the choices are contexts and the target is a shared continuation.
    multiple_input: ClassVar[bool] = False
    target_delimiter: ClassVar[str] = " "
    fewshot_delimiter: ClassVar[str] = "\n\n"

    # ----- prompts (the harness YAML's doc_to_* fields) -----
    def doc_to_text(self, doc: Doc) -> str | int:
        raise NotImplementedError

    def doc_to_target(self, doc: Doc) -> str | int:
        raise NotImplementedError

    def doc_to_choice(self, doc: Doc) -> list[str] | None:
        return None

    def process_docs(self, docs: list[Doc]) -> list[Doc]:
        """Turn original-format rows into the rows the harness's dataset holds."""
        return docs

    # ----- splits -----
    @property
    def eval_role(self) -> SplitRole:
        return "test" if self.harness_splits.get("test") else "validation"

    @property
    def fewshot_excludes_eval_doc(self) -> bool:
        # The harness passes the evaluated document to its sampler (which then draws k+1 and drops
        # it) only when `fewshot_split == test_split`; with neither set that is `None == None`.
        return self.harness_splits.get("test") is None

    def fewshot_roles(self) -> list[SplitRole]:
        return [role for role in ("train", "validation", "test") if self.harness_splits.get(role)]

    def find_file(self, role: SplitRole, data_dir: Path) -> Path | None:
        spec = self.local_files.get(role)
        if spec is None:
            return None
        for candidate in spec.candidates:
            path = data_dir / candidate
            if path.exists():
                return path
        return None

    def missing_message(self, role: SplitRole, data_dir: Path) -> str:
        spec = self.local_files[role]
        names = " or ".join(str(data_dir / c) for c in spec.candidates)
        hint = f" (original files: {self.source})" if self.source else ""
        return f"task {self.name}: {role} split not found: expected {names}{hint}"

    def load_local(self, role: SplitRole, data_dir: Path) -> tuple[list[Doc], Path]:
        path = self.find_file(role, data_dir)
        if path is None:
            raise MissingDataError(self.missing_message(role, data_dir))
        return self.process_docs(self.local_files[role].reader(path)), path

    def load_hf(self, role: SplitRole) -> list[Doc]:
        """The harness's own dataset through the `datasets` library (needs network or its cache)."""
        try:
            import datasets
        except ImportError as error:  # pragma: no cover - exercised only without datasets
            raise TokenmillError("reading tasks without --data-dir needs `pip install datasets`") from error
        split = self.harness_splits.get(role)
        if not split:
            raise MissingDataError(f"task {self.name} has no {role} split")
        path, name = self.hf_dataset
        try:
            rows = datasets.load_dataset(path, name, split=split)
        except Exception as error:  # datasets raises many types for offline/missing data
            raise TokenmillError(
                f"task {self.name}: could not load {path}/{name or ''} [{split}] with `datasets` "
                f"({type(error).__name__}: {error}); pass --data-dir with the original files"
            ) from error
        return self.process_docs(self.hf_rows_to_docs([dict(row) for row in rows]))

    def hf_rows_to_docs(self, rows: list[Doc]) -> list[Doc]:
        """Rows of the harness's Hugging Face dataset -> this task's documents."""
        return rows

    # ----- scoring helpers -----
    def gold(self, doc: Doc) -> int:
        """Index of the correct choice, as the harness's process_results derives it."""
        gold = self.doc_to_text(doc) if self.multiple_input else self.doc_to_target(doc)
        choices = self.doc_to_choice(doc) or []
        if isinstance(gold, str):
            return choices.index(gold) if gold in choices else -100
        return gold if gold < len(choices) else -100

    def fewshot_answer(self, doc: Doc) -> tuple[str, str]:
        """(question, answer) of a few-shot example, as the harness's build_qa_turn renders it."""
        q, choices, a = self.doc_to_text(doc), self.doc_to_choice(doc), self.doc_to_target(doc)
        if self.multiple_input:
            assert choices is not None and isinstance(q, int)
            q, choices = choices[q], None
        assert isinstance(q, str)
        answer = choices[a] if (choices and isinstance(a, int)) else a
        assert isinstance(answer, str), f"task {self.name}: few-shot answer is not text: {answer!r}"
        return q, answer


def digits_to_int(text: str) -> str | int:
    """The harness turns a rendered template that is all digits into an int (choice index)."""
    return int(text) if text.isdigit() else text


def choices_of(doc: Doc, keys: Sequence[str]) -> list[str]:
    return [doc[k] for k in keys]
