"""Ingest: raw corpora (JSONL, Parquet, plain text) -> Parquet documents.

Every input record ends up either kept (id, text, source) or rejected with a reason and, where
it exists, the raw line: `invalid_utf8`, `invalid_json`, `not_an_object`, `missing_text`,
`non_string_text`, `empty_text`.

Ids: the input's id field when given, else `<source>:<offset>` where offset is the record's
byte offset in the (decompressed) file, its row number in a Parquet file, or its path inside a
text directory. Offsets do not depend on how the work is split, so ids are stable across runs
and worker counts.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tokenmill.curate.stage import StageOutput, run_tasks
from tokenmill.errors import TokenmillError

FORMATS = ("jsonl", "parquet", "text")
# Uncompressed JSONL files are split into byte ranges of this size, aligned to line starts.
JSONL_CHUNK_BYTES = 32 * 1024 * 1024
# Records per output batch: bounds a worker's memory on large inputs.
BATCH_RECORDS = 20_000
# Raw lines kept with a rejection are cut to this many characters.
RAW_PREVIEW_CHARS = 2_000


@dataclass
class IngestOptions:
    """How records map to documents."""

    format: str | None = None  # jsonl | parquet | text; None: from the file extension
    text_field: str = "text"
    id_field: str | None = None
    source: str | None = None  # default: the file name (the directory name for a text directory)
    separator: str | None = None  # regex splitting text files into documents (matched text is dropped)
    encoding_errors: str = "strict"  # invalid UTF-8 is rejected; "replace" keeps it with U+FFFD


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if path.is_dir():
        return "text"
    if name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".txt", ".text", ".md")):
        return "text"
    raise TokenmillError(f"cannot tell the format of {path}; pass --format ({', '.join(FORMATS)})")


class _Batcher:
    """Accumulates kept and rejected records and emits `StageOutput` batches."""

    def __init__(self) -> None:
        self.kept: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []

    def keep(self, doc_id: str, text: str, source: str) -> None:
        self.kept.append({"id": doc_id, "text": text, "source": source})

    def reject(self, doc_id: str, source: str, reason: str, raw: str | bytes | None, text: str | None = None) -> None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="backslashreplace")
        if raw is not None and len(raw) > RAW_PREVIEW_CHARS:
            raw = raw[:RAW_PREVIEW_CHARS] + "..."
        self.rejected.append({"id": doc_id, "text": text, "source": source, "reason": reason, "raw": raw})

    def __len__(self) -> int:
        return len(self.kept) + len(self.rejected)

    def flush(self) -> StageOutput:
        kept = pd.DataFrame(self.kept, columns=["id", "text", "source"])
        rejected = pd.DataFrame(self.rejected, columns=["id", "text", "source", "reason", "raw"])
        output = StageOutput(n_in=len(kept) + len(rejected), kept=kept, rejected=rejected)
        self.kept, self.rejected = [], []
        return output


def _record_to_document(
    record: Any, doc_id: str, source: str, options: IngestOptions, batch: _Batcher, raw: str | bytes | None
) -> None:
    if not isinstance(record, dict):
        batch.reject(doc_id, source, "not_an_object", raw)
        return
    if options.id_field is not None:
        value = record.get(options.id_field)
        if value is None or value == "":
            batch.reject(doc_id, source, "missing_id", raw)
            return
        doc_id = str(value)
    if options.text_field not in record or record[options.text_field] is None:
        batch.reject(doc_id, source, "missing_text", raw)
        return
    text = record[options.text_field]
    if not isinstance(text, str):
        batch.reject(doc_id, source, "non_string_text", raw)
        return
    if not text.strip():
        batch.reject(doc_id, source, "empty_text", raw, text)
        return
    batch.keep(doc_id, text, source)


def _decode(data: bytes, options: IngestOptions) -> str | None:
    try:
        return data.decode("utf-8", errors=options.encoding_errors)
    except UnicodeDecodeError:
        return None


@dataclass
class JsonlChunk:
    """Lines of a JSONL file starting in [start, end) (uncompressed), or all of a compressed file."""

    path: str
    source: str
    options: IngestOptions
    start: int = 0
    end: int | None = None

    def _open(self) -> io.BufferedIOBase:
        name = self.path.lower()
        if name.endswith(".gz"):
            return gzip.open(self.path, "rb")
        if name.endswith(".zst"):
            import zstandard

            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(self.path, "rb")))
        return open(self.path, "rb")

    def run(self) -> Iterator[StageOutput]:
        batch = _Batcher()
        try:
            with self._open() as handle:
                offset = self.start
                if self.start:
                    # The previous chunk owns the line that straddles our start.
                    handle.seek(self.start - 1)
                    offset += len(handle.readline()) - 1
                while self.end is None or offset < self.end:
                    line = handle.readline()
                    if not line:
                        break
                    line_offset = offset
                    offset += len(line)
                    stripped = line.strip()
                    if not stripped:
                        continue  # blank lines separate nothing in JSONL
                    doc_id = f"{self.source}:{line_offset}"
                    text = _decode(stripped, self.options)
                    if text is None:
                        batch.reject(doc_id, self.source, "invalid_utf8", stripped)
                    else:
                        try:
                            record = json.loads(text)
                        except (json.JSONDecodeError, RecursionError):
                            batch.reject(doc_id, self.source, "invalid_json", text)
                        else:
                            _record_to_document(record, doc_id, self.source, self.options, batch, text)
                    if len(batch) >= BATCH_RECORDS:
                        yield batch.flush()
        except (OSError, EOFError) as error:
            # A truncated or corrupt compressed file: keep what was read, report the rest.
            batch.reject(f"{self.source}:corrupt", self.source, "corrupt_file", f"{type(error).__name__}: {error}")
        yield batch.flush()


@dataclass
class ParquetChunk:
    """Row groups [first, last) of a Parquet file with arbitrary columns."""

    path: str
    source: str
    options: IngestOptions
    row_groups: list[int] = field(default_factory=list)
    first_row: int = 0

    def run(self) -> Iterator[StageOutput]:
        import pyarrow.parquet as pq

        parquet_file = pq.ParquetFile(self.path)
        names = parquet_file.schema_arrow.names
        if self.options.text_field not in names:
            raise TokenmillError(
                f"{self.path} has no column {self.options.text_field!r} (columns: {', '.join(names)}); set --text-field"
            )
        if self.options.id_field is not None and self.options.id_field not in names:
            raise TokenmillError(f"{self.path} has no id column {self.options.id_field!r}; set --id-field")
        columns = [self.options.text_field] + ([self.options.id_field] if self.options.id_field else [])
        row = self.first_row
        batch = _Batcher()
        for record_batch in parquet_file.iter_batches(batch_size=BATCH_RECORDS, row_groups=self.row_groups, columns=columns):
            for record in record_batch.to_pylist():
                _record_to_document(record, f"{self.source}:{row}", self.source, self.options, batch, None)
                row += 1
            yield batch.flush()
        if len(batch):
            yield batch.flush()


@dataclass
class TextChunk:
    """Plain-text files: one document per file, or documents split by a separator regex."""

    paths: list[str]
    root: str
    source: str
    options: IngestOptions

    def run(self) -> Iterator[StageOutput]:
        batch = _Batcher()
        separator = re.compile(self.options.separator.encode(), re.MULTILINE) if self.options.separator else None
        for path in self.paths:
            relative = str(Path(path).relative_to(self.root)) if Path(path) != Path(self.root) else Path(path).name
            data = Path(path).read_bytes()
            if separator is None:
                pieces = [(relative, data)]
            else:
                pieces = []
                position = 0
                for match in separator.finditer(data):
                    if match.start() == match.end() == position:
                        continue  # a zero-width split at the start of a piece
                    pieces.append((f"{relative}:{position}", data[position : match.start()]))
                    position = match.end()
                pieces.append((f"{relative}:{position}", data[position:]))
            for key, piece in pieces:
                doc_id = f"{self.source}:{key}"
                text = _decode(piece, self.options)
                if text is None:
                    batch.reject(doc_id, self.source, "invalid_utf8", piece)
                elif not text.strip():
                    if separator is not None and not piece:
                        continue  # two adjacent separators: no document between them
                    batch.reject(doc_id, self.source, "empty_text", piece, text)
                else:
                    batch.keep(doc_id, text, self.source)
                if len(batch) >= BATCH_RECORDS:
                    yield batch.flush()
        yield batch.flush()


def plan_tasks(paths: list[str | Path], options: IngestOptions) -> list[Any]:
    """Split the inputs into partition tasks (deterministic order)."""
    tasks: list[Any] = []
    for raw_path in paths:
        path = Path(raw_path)
        if not path.exists():
            raise TokenmillError(f"input not found: {path}")
        fmt = options.format or detect_format(path)
        if fmt not in FORMATS:
            raise TokenmillError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if path.is_dir() and fmt != "text":
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            tasks.extend(plan_tasks(files, IngestOptions(**{**asdict(options), "format": fmt})))
            continue
        if fmt == "jsonl":
            source = options.source or path.name
            if path.name.lower().endswith((".gz", ".zst")):
                tasks.append(JsonlChunk(str(path), source, options))
            else:
                size = path.stat().st_size
                for start in range(0, max(size, 1), JSONL_CHUNK_BYTES):
                    tasks.append(JsonlChunk(str(path), source, options, start, min(start + JSONL_CHUNK_BYTES, size)))
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            try:
                metadata = pq.ParquetFile(path).metadata
            except Exception as error:
                raise TokenmillError(f"cannot read Parquet file {path}: {error}") from None
            source = options.source or path.name
            first_row = 0
            group_rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            for index, rows in enumerate(group_rows):
                tasks.append(ParquetChunk(str(path), source, options, [index], first_row))
                first_row += rows
        else:
            if path.is_dir():
                files = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
                if not files:
                    raise TokenmillError(f"text directory {path} holds no files")
                source = options.source or path.name
                for start in range(0, len(files), 256):
                    tasks.append(TextChunk(files[start : start + 256], str(path), source, options))
            else:
                tasks.append(TextChunk([str(path)], str(path.parent), options.source or path.name, options))
    if not tasks:
        raise TokenmillError("no input files given")
    return tasks


def ingest(
    paths: str | Path | list[str | Path],
    output: str | Path,
    *,
    format: str | None = None,
    text_field: str = "text",
    id_field: str | None = None,
    source: str | None = None,
    separator: str | None = None,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Read raw corpora into a document stage directory; returns its manifest."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if separator is not None:
        try:
            re.compile(separator.encode(), re.MULTILINE)
        except re.error as error:
            raise TokenmillError(f"--separator {separator!r} is not a valid regular expression: {error}") from None
    options = IngestOptions(format, text_field, id_field, source, separator)
    tasks = plan_tasks(list(paths), options)
    return run_tasks(
        "ingest",
        asdict(options),
        tasks,
        output,
        inputs=[str(Path(p).resolve()) for p in paths],
        client=client,
        scheduler=scheduler,
        workers=workers,
        progress=progress,
    )


def add_command(stages: argparse._SubParsersAction) -> None:
    from tokenmill.curate.cli import add_stage_arguments, print_summary, runner_options

    parser = stages.add_parser(
        "ingest",
        help="read JSONL / Parquet / text corpora into Parquet documents",
        description="Read raw corpora into Parquet documents; bad records are rejected with a reason.",
    )
    parser.add_argument("--input", required=True, nargs="+", help="files or directories (.jsonl[.gz|.zst], .parquet, text)")
    add_stage_arguments(parser, document_input=False)
    parser.add_argument("--format", choices=FORMATS, default=None, help="input format (default: from the extension)")
    parser.add_argument("--text-field", default="text", help="field or column holding the text (default: text)")
    parser.add_argument("--id-field", default=None, help="field or column holding a document id (default: made from the position)")
    parser.add_argument("--source", default=None, help="source name recorded on every document (default: the file name)")
    parser.add_argument(
        "--separator", default=None,
        help="regex that splits text files into documents; the matched text is dropped, so use a lookahead to keep"
        " a title line, e.g. '^(?= = [^=])' for WikiText articles (default: one document per file)",
    )

    def run(args: argparse.Namespace) -> int:
        manifest = ingest(
            args.input, args.output, format=args.format, text_field=args.text_field, id_field=args.id_field,
            source=args.source, separator=args.separator, **runner_options(args),
        )
        print_summary(manifest, args.output)
        return 0

    parser.set_defaults(func=run)
