"""What a benchmark task is: its splits, how its documents are read, prompted and scored.

Each task mirrors one lm-evaluation-harness 0.4.x task YAML (`lm_eval/tasks/...`): the same
`doc_to_text` / `doc_to_target` / `doc_to_choice`, the same split roles and metrics, so that the
requests built here are the requests the harness builds. Documents are plain dicts, in the order
of the harness's dataset. A task reads its benchmark's original public files from a data
directory (`local_files`), the harness's Hugging Face dataset saved in the hub's layout in that
directory, or (without a data directory) that dataset through `datasets` (`hub.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks import hub

Doc = dict[str, Any]
# A document and where it was read ("path:line"), so that a bad row can be named.
Row = tuple[str, Doc]
SplitRole = Literal["train", "validation", "test"]
OutputType = Literal["multiple_choice", "loglikelihood"]


class MissingDataError(TokenmillError):
    """A task's data is not where the task expects it (or `datasets` cannot fetch it)."""


class RowError(ValueError):
    """A row whose fields do not make a document of its task (reported with the row's place)."""


class LabelError(RowError):
    """A stored label that names no class."""


_TRUE = ("true", "yes")
_FALSE = ("false", "no")


def parse_label(value: object, n_classes: int, names: Sequence[str] = (), indexes: bool = True) -> int:
    """The class index a stored label stands for, whatever type the file stored it as.

    Labels arrive as ints (0/1), bools, digit strings ("1"), "true"/"false" in any case, or names
    ("e"/"n"/"c", "A"-"D", WinoGrande's "1"/"2" for options 1 and 2). `names` lists the names in
    class order and wins over the digit reading; `indexes=False` accepts names only (WinoGrande's
    "0" is no option). Truth-testing a string would read "false" as true, so every task parses
    its labels here.
    """
    if isinstance(value, str):
        text = value.strip()
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer()):
        text = str(int(value))
    else:
        raise LabelError(f"label {value!r} is not a class label")
    if text in names:
        return list(names).index(text)
    lowered = text.lower()
    if indexes and n_classes == 2 and lowered in _TRUE + _FALSE:
        return int(lowered in _TRUE)
    if indexes and text.isdigit() and int(text) < n_classes:
        return int(text)
    expected = [", ".join(repr(n) for n in names)] if names else []
    if indexes:
        expected.append(f"an integer 0..{n_classes - 1}" + (" or true/false" if n_classes == 2 else ""))
    raise LabelError(f"label {value!r} is not {' or '.join(expected)}")


@dataclass(frozen=True)
class SplitFiles:
    """Where a split's original files may lie in a data directory, first match wins."""

    candidates: tuple[str, ...]
    # Reads the first existing candidate (a file or a folder) into (where, document) rows.
    reader: Callable[[Path], list[Row]] = field(default=lambda path: read_jsonl(path))
    # Files that must sit next to the candidate (named in messages), e.g. PIQA's labels file.
    companion: str = ""


def require_fields(doc: Doc, *paths: str) -> None:
    """Raise KeyError naming the first of `paths` ("choices.text": a field inside a field) that
    `doc` lacks, so that a bad row stops the run as it is read, not mid-evaluation. A None counts
    as lacking: `datasets` gives a row the columns of the others, None where it had none."""
    for path in paths:
        value: Any = doc
        for key in path.split("."):
            if not isinstance(value, dict) or value.get(key) is None:
                raise KeyError(path)
            value = value[key]


def answer_key(doc: Doc, keys: Sequence[str] | None = None) -> str:
    """`answerKey` as one of `keys` (default: the row's `choices.label`), for the AI2-style
    datasets (ARC, OpenBookQA, CommonsenseQA); RowError if it names none."""
    require_fields(doc, "choices.text", "choices.label", "answerKey")
    names = [str(key) for key in (doc["choices"]["label"] if keys is None else keys)]
    return names[parse_label(doc["answerKey"], len(names), names, indexes=False)]


def exported_files(name: str, splits: Sequence[SplitRole]) -> dict[SplitRole, SplitFiles]:
    """A task's splits as JSON lines exported from its Hugging Face dataset, in the dataset's own
    schema: `<name>_<split>.jsonl` or `<name>/<split>.jsonl` in the data directory."""
    return {split: SplitFiles((f"{name}_{split}.jsonl", f"{name}/{split}.jsonl")) for split in splits}


def read_jsonl(path: Path) -> list[Row]:
    rows: list[Row] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{line_no}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise TokenmillError(f"{path}:{line_no}: not a JSON line ({error.msg})") from error
    return rows


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
    # (dataset_path, dataset_name) of the Hugging Face dataset the harness YAML loads.
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

    def process_doc(self, doc: Doc) -> Doc:
        """One row (original files or the hub's) -> the document the harness's dataset holds.

        Labels are parsed here with `parse_label`; a LabelError is reported with the row's place.
        """
        return doc

    def group_hub_rows(self, rows: list[Row]) -> list[Row]:
        """Rows of a hub dataset -> rows of documents (RACE groups questions by article)."""
        return rows

    def to_docs(self, rows: list[Row]) -> list[Doc]:
        """Each row as the harness's document, checked as it is read: a bad label or a field the
        task's prompts need and the row lacks is one error naming the row's place (file and line)."""
        docs = []
        for where, row in rows:
            try:
                doc = self.process_doc(row)
                # The prompts read the fields that process_doc does not: rendered once here, a
                # missing one is named now rather than as a KeyError in the middle of scoring.
                self.doc_to_text(doc)
                self.doc_to_target(doc)
                self.doc_to_choice(doc)
            except (RowError, KeyError) as error:
                raise self.row_error(where, row, error) from error
            docs.append(doc)
        return docs

    def row_error(self, where: str, row: Doc, error: RowError | KeyError) -> TokenmillError:
        """One line naming the row's place and its problem: a bad value, or a field it lacks."""
        if isinstance(error, KeyError):
            fields = ", ".join(sorted(key for key, value in row.items() if value is not None))
            return TokenmillError(f"task {self.name}: {where}: no field {error} (the row has {fields})")
        return TokenmillError(f"task {self.name}: {where}: {error}")

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

    def find_hub_split(self, role: SplitRole, data_dir: Path) -> hub.LocalSplit | None:
        split = self.harness_splits.get(role)
        if not split:
            return None
        path, config = self.hf_dataset
        return hub.find_local_split(data_dir, path, config, split)

    def has_split(self, role: SplitRole, data_dir: Path) -> bool:
        return self.find_file(role, data_dir) is not None or self.find_hub_split(role, data_dir) is not None

    def file_names(self, role: SplitRole) -> str:
        """The original file of a split, as a user would put it in a data directory."""
        spec = self.local_files.get(role)
        if spec is None:
            return ""
        return f"{spec.candidates[0]} ({spec.companion})" if spec.companion else spec.candidates[0]

    def missing_message(self, role: SplitRole, data_dir: Path) -> str:
        spec = self.local_files.get(role)
        expected = [str(data_dir / c) for c in spec.candidates] if spec else []
        if spec and spec.companion:
            expected[0] += f" ({spec.companion})"
        split = self.harness_splits.get(role)
        if split:
            path, config = self.hf_dataset
            expected.append(f"the {split} split of {path} saved in {hub.expected_dir(data_dir, path, config)}/")
        hint = f" (original files: {self.source})" if self.source else ""
        return f"task {self.name}: {role} split not found: expected {' or '.join(expected)}{hint}"

    def load(self, role: SplitRole, data_dir: Path | None) -> tuple[list[Doc], str]:
        """The documents of a split, in the harness's order, and where they were read.

        With a data directory: its original files, else its hub-layout copy. Without: the
        harness's own `datasets.load_dataset` call.
        """
        split = self.harness_splits.get(role)
        path, config = self.hf_dataset
        if data_dir is not None:
            file = self.find_file(role, data_dir)
            if file is not None:
                return self.to_docs(self.local_files[role].reader(file)), str(file)
            found = self.find_hub_split(role, data_dir)
            if found is None:
                raise MissingDataError(self.missing_message(role, data_dir))
            rows = hub.read_local_split(found)
            where = found.describe()
        else:
            if not split:
                raise MissingDataError(f"task {self.name} has no {role} split")
            try:
                rows = hub.load_hub_split(path, config, split)
            except hub.HubUnavailable as error:
                raise MissingDataError(self.unavailable_message(role, str(error))) from error
            where = f"{path}{'/' + config if config else ''} [{split}]"
        located = [(f"{where} row {i}", row) for i, row in enumerate(rows)]
        return self.to_docs(self.group_hub_rows(located)), where

    def unavailable_message(self, role: SplitRole, reason: str) -> str:
        path, config = self.hf_dataset
        split = self.harness_splits.get(role)
        name = f"{path}{' ' + config if config else ''}"
        source = f" from {self.source}" if self.source else ""
        return (
            f"task {self.name}: `datasets` cannot load {name} [{split}] ({reason}); offline, put "
            f"{self.file_names(role)}{source} in a folder and pass --data-dir FOLDER "
            f"(or save that dataset there as FOLDER/{hub.expected_dir(Path(''), path, config)}/)"
        )

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
