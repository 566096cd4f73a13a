"""Ingest: raw corpora (JSONL, Parquet, plain text) -> Parquet documents.

Every input record ends up either kept (id, text, source) or rejected with a reason and, where
it exists, the raw line: `invalid_utf8` (`invalid_encoding` with another `--encoding`),
`invalid_json`, `not_an_object`, `missing_text`, `non_string_text`, `empty_text`, `missing_id`,
`corrupt_file`, `too_large` for a record over `--max-record-bytes` (skipped unread, see
`tokenmill.curate.limits`), `empty_file` for a file that holds no record at all (one rejection
per file, so that an empty input never passes as `in 0`), `binary` for a file read as text that
is binary (a PDF, an image, an executable; a separator-split piece holding a NUL byte past the
first chunk), and `unknown_format` for a file in an input directory whose extension names no
format.

Each file is read by its extension (`.jsonl`/`.json`/`.ndjson`, `.parquet`, `.txt`/`.text`/`.md`,
each of the line formats optionally `.gz` / `.zst` compressed; web archives `.warc`, `.wet`
(optionally `.gz`, e.g. Common Crawl's `.warc.gz` / `.warc.wet.gz`) and saved pages `.html` /
`.htm` (optionally `.gz`), read by `tokenmill.curate.webarchive`) unless `--format` says otherwise.

Ids: the input's id field when given, else `<where>:<offset>`. `<where>` names the file once:
the file name for a file given on its own (it is also the default source), `<dir>:<path inside>`
for a file in a directory; with `--source S` and one input, `S` (`S:<path inside>` for a
directory), with several inputs `S:<file or directory name>[/<path inside>]`. The offset is the
record's byte offset in the (decompressed) file, its row number in a Parquet file, or the byte
offset of a separator-split text piece (a whole text file has none). Offsets do not depend on
how the work is split, so ids are stable across runs and worker counts.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tokenmill.curate import limits, webarchive
from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, DocumentBatcher, StageOptions, run_stage
from tokenmill.curate.text import decode_replacing
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import input_list

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet", "text", "warc", "wet", "html")
# Formats read record by record from an archive, which is only ever gzip-compressed.
ARCHIVE_FORMATS = ("warc", "wet")
ENCODING_ERRORS = ("reject", "replace")
# Extensions (before an optional .gz / .zst) that name a format.
EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".warc": "warc",
    ".wet": "wet",
    ".html": "html",
    ".htm": "html",
}
# Uncompressed JSONL files are split into byte ranges of this size, aligned to line starts.
JSONL_CHUNK_BYTES = 32 * 1024 * 1024
# Records per output batch: bounds a worker's memory on large inputs.
BATCH_RECORDS = 20_000
# Raw lines kept with a rejection are cut to this many characters.
# Text files of a directory handled by one task: many small files, few tasks.
TEXT_FILES_PER_TASK = 256
# Signatures of common binary files that a wrong --format text (or a .txt name) would otherwise
# read as text: PDF, ZIP (docx, epub, jar), gzip, zstd, PNG, JPEG, GIF, ELF, Mach-O, PE, SQLite.
BINARY_SIGNATURES = (
    b"%PDF-",
    b"PK\x03\x04",
    b"\x1f\x8b",
    b"\x28\xb5\x2f\xfd",
    b"\x89PNG",
    b"\xff\xd8\xff",
    b"GIF8",
    b"\x7fELF",
    b"\xcf\xfa\xed\xfe",
    b"MZ\x90\x00",
    b"SQLite format 3\x00",
)
# Bytes that no text holds (C0 controls but tab, newline, vertical tab, form feed, carriage
# return, backspace, bell and escape, which terminal output and old documents use; and DEL).
_CONTROL_BYTES = bytes([*range(0x00, 0x07), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
# Share of such bytes in a file's first BINARY_SAMPLE bytes above which it is binary.
BINARY_CONTROL_SHARE = 0.05
BINARY_SAMPLE = 64 * 1024
# A text file split by --separator is read this many (decompressed) bytes at a time.
SPLIT_CHUNK_BYTES = 8 * 1024 * 1024
# A separator match, with the text its pattern looks at before and after it (`^`, lookbehinds,
# lookaheads), is assumed to span less than this: a match is final once it ends this far before
# the end of the bytes read so far (or at the end of the file), and this much text is kept
# before the point where the search resumes.
SEPARATOR_MARGIN_BYTES = 64 * 1024


def binary_kind(data: bytes) -> str | None:
    """Why `data` (a whole file, or the first chunk of one split by a separator) is binary rather
    than text, or None for text.

    A NUL byte anywhere (no ASCII-compatible text encoding has one, as grep and git judge), a
    known file signature, or more than 5% control bytes in the first 64 KiB.
    """
    for signature in BINARY_SIGNATURES:
        if data.startswith(signature):
            return f"starts with the signature {signature!r}"
    nul = nul_kind(data)
    if nul is not None:
        return nul
    sample = data[:BINARY_SAMPLE]
    controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    if sample and controls / len(sample) > BINARY_CONTROL_SHARE:
        return f"{controls / len(sample):.0%} of its first {len(sample)} bytes are control characters"
    return None


def nul_kind(data: bytes, offset: int = 0) -> str | None:
    """Why `data`, found at byte `offset` of its file, is binary for holding a NUL byte, or None."""
    nul = data.find(b"\x00")
    return None if nul < 0 else f"holds NUL bytes (the first at byte {offset + nul})"


@dataclass
class Piece:
    """A separator-split piece of a text file: its byte offset and size, and its bytes (only the
    first `limits.HEAD_BYTES` when it is over the limit: such a piece is never held whole)."""

    offset: int
    size: int
    data: bytes


def _text_follows(handle: IO[bytes]) -> bool:
    """Whether the rest of the stream holds a byte other than whitespace (read a chunk at a time)."""
    while chunk := handle.read(SPLIT_CHUNK_BYTES):
        if chunk.strip():
            return True
    return False


def split_stream(handle: IO[bytes], first: bytes, separator: re.Pattern[bytes], limit: int) -> Iterator[Piece]:
    """The pieces between `separator`'s matches in a stream whose first bytes, already read, are
    `first`: those of `separator.finditer` over the whole text, a zero-width match at a piece's
    start splitting nothing, read `SPLIT_CHUNK_BYTES` at a time.

    The buffer holds the current piece (or, once it is over `limit`, only what the search still
    needs) and `SEPARATOR_MARGIN_BYTES` before it, so a worker holds at most about limit + chunk
    + twice the margin, however large the file.
    """
    margin = SEPARATOR_MARGIN_BYTES
    buffer, buffer_start = first, 0  # buffer holds the file's bytes from buffer_start on
    position = 0  # where the current piece starts
    resume = 0  # where the search resumes: no separator starts in [position, resume)
    head: bytes | None = None  # the first bytes of a piece over the limit, once it is known to be
    at_end = False
    while True:
        if not at_end:
            chunk = handle.read(SPLIT_CHUNK_BYTES)
            at_end = not chunk
            buffer += chunk
        final_end = len(buffer) if at_end else len(buffer) - margin  # a match ending here is final
        unsure = len(buffer)  # where the first match that is not final starts
        for match in separator.finditer(buffer, resume - buffer_start):
            if match.end() > final_end:
                unsure = match.start()
                break
            start, end = buffer_start + match.start(), buffer_start + match.end()
            if start == end == position:
                continue  # a zero-width split at the start of a piece
            data = buffer[position - buffer_start : match.start()] if head is None else head[: start - position]
            yield Piece(position, start - position, data)
            position = resume = end
            head = None
        if at_end:
            data = buffer[position - buffer_start :] if head is None else head
            yield Piece(position, buffer_start + len(buffer) - position, data)
            return
        # More text cannot move a match that starts before the margin to any place before this.
        resume = max(resume, buffer_start + min(unsure, final_end))
        if head is None and resume - position > limit:
            head = buffer[position - buffer_start : position - buffer_start + limits.HEAD_BYTES]  # too large
        keep_from = max(0, (resume if head is not None else position) - margin)
        if keep_from > buffer_start:
            buffer, buffer_start = buffer[keep_from - buffer_start :], keep_from


# What each rejection reason means (`tokenmill inspect` prints these; `{...}` is the stage config).
REASONS = {
    "invalid_utf8": "bytes that are not valid UTF-8 (another --encoding, or --encoding-errors replace)",
    "invalid_encoding": "bytes that are not valid {encoding} (--encoding-errors replace keeps them as U+FFFD)",
    "invalid_json": "a JSONL line that is not valid JSON",
    "not_an_object": "a JSONL line that is valid JSON but not an object",
    "missing_text": "no {text_field!r} field (see --text-field)",
    "non_string_text": "the {text_field!r} field is not a string",
    "empty_text": "the text is empty or only whitespace",
    "missing_id": "no {id_field!r} field (see --id-field)",
    "corrupt_file": "a truncated or corrupt file: the records before the damage were kept",
    "empty_file": "a file that holds no record (empty, only blank lines, or a Parquet file without rows)",
    "binary": "a file read as text that is binary: NUL bytes, control characters, or a PDF/image/archive signature;"
    " or a separator-split piece past the file's first 8 MiB that holds a NUL byte"
    " (a UTF-16 text file has NUL bytes: convert it to UTF-8 first, e.g. with iconv)",
    "unknown_format": "a file in an input directory whose extension names no format (use --format to read it)",
    **limits.REASONS,
    **webarchive.REASONS,
}


@dataclass
class IngestStage(StageOptions):
    """How records map to documents. The stage reads raw files, not documents: `partitions` splits
    them into partitions (JSONL byte ranges, Parquet row groups, groups of text files, archives)."""

    format: str | None = option(
        None,
        cli={"choices": FORMATS},
        help="read every input file in this format (default: from each file's extension)",
    )
    text_field: str = option("text", help="field or column holding the text (default: text)")
    id_field: str | None = option(None, help="field or column holding a document id (default: made from the position)")
    source: str | None = option(
        None,
        help="source name recorded on every document (default: the file name, or the directory name)",
    )
    separator: str | None = option(
        None,
        help="regex that splits text files into documents; the matched text is dropped, so use a lookahead to keep"
        " a title line, e.g. '^(?= = [^=])' for WikiText articles (default: one document per file)",
    )
    encoding: str = option(
        "utf-8",
        help="encoding of JSONL and text files, e.g. latin-1 or cp1252 (default: utf-8; must be ASCII-compatible)",
    )
    encoding_errors: str = option(
        "reject",
        cli={"choices": ENCODING_ERRORS},
        help="a record with undecodable bytes: reject it (invalid_utf8 / invalid_encoding), or replace the bytes"
        " with U+FFFD and count them in the stats (replaced_bytes) (default: reject)",
    )
    max_record_bytes: int = option(
        limits.DEFAULT_MAX_RECORD_BYTES,
        help="reject a record larger than this many bytes (a JSONL line, a text file or piece, a WARC record or its"
        " decompressed page, a Parquet cell) as too_large, reading past it in bounded chunks"
        f" (default {limits.DEFAULT_MAX_RECORD_BYTES // 2**20} MiB)",
    )

    name = "ingest"

    def __post_init__(self) -> None:
        self.encoding = check_encoding(self.encoding)
        self.max_record_bytes = limits.check_limit(self.max_record_bytes)
        if self.encoding_errors not in ENCODING_ERRORS:
            raise TokenmillError(
                f"--encoding-errors must be one of {', '.join(ENCODING_ERRORS)}, got {self.encoding_errors!r}"
            )
        if self.separator is not None:
            try:
                re.compile(self.separator.encode(self.encoding), re.MULTILINE)
            except UnicodeEncodeError:
                raise TokenmillError(f"--separator {self.separator!r} cannot be written in {self.encoding}") from None
            except re.error as error:
                raise TokenmillError(
                    f"--separator {self.separator!r} is not a valid regular expression: {error}"
                ) from None

    def partitions(self, input: str | Path | list[str | Path]) -> list[Any]:
        return plan_tasks(input_list(input), self)

    def upstream(self, input: Any) -> None:
        return None  # raw files: no stage wrote them


def detect_format(path: Path) -> str | None:
    """The format a file's extension names, or None."""
    name = path.name.lower()
    compression = storage.compression_suffix(name)
    if compression:
        name = name[: -len(compression)]
    fmt = EXTENSIONS.get(Path(name).suffix)
    if fmt == "parquet" and compression:
        return None  # Parquet compresses inside the file; a .parquet.gz cannot be read by row group
    if fmt in ARCHIVE_FORMATS and compression not in (None, ".gz"):
        return None
    return fmt


def check_encoding(encoding: str) -> str:
    """The codec's canonical name; a clear error for an unknown or ASCII-incompatible one."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise TokenmillError(f"unknown --encoding {encoding!r} (e.g. utf-8, latin-1, cp1252)") from None
    # Lines, JSON syntax and separators are found in the raw bytes, so ASCII must map to itself.
    probe = '\n\r {}":,az09=^'
    try:
        ascii_compatible = probe.encode(name) == probe.encode("ascii")
    except UnicodeError:
        ascii_compatible = False
    if not ascii_compatible:
        raise TokenmillError(f"--encoding {encoding} is not ASCII-compatible; convert the input to UTF-8 first (iconv)")
    return name


def _record_to_document(
    record: Any, doc_id: str, options: IngestStage, batch: DocumentBatcher, raw: str | bytes | None
) -> None:
    """Keep a parsed record (a JSON object, a Parquet row), or reject it with the reason."""
    if not isinstance(record, dict):
        batch.reject(doc_id, "not_an_object", raw)
        return
    if options.id_field is not None:
        value = record.get(options.id_field)
        if value is None or value == "":
            batch.reject(doc_id, "missing_id", raw)
            return
        doc_id = limits.repair_surrogates(str(value), batch)
    if options.text_field not in record or record[options.text_field] is None:
        batch.reject(doc_id, "missing_text", raw)
        return
    text = record[options.text_field]
    if not isinstance(text, str):
        batch.reject(doc_id, "non_string_text", raw)
        return
    text = limits.repair_surrogates(text, batch)
    if not text.strip():
        batch.reject(doc_id, "empty_text", raw, text=text)
        return
    batch.keep(doc_id, text)


def _decode(data: bytes, options: IngestStage, batch: DocumentBatcher) -> str | None:
    """Decoded text, or None when it has undecodable bytes and they are to be rejected."""
    try:
        return data.decode(options.encoding)
    except UnicodeDecodeError:
        if options.encoding_errors != "replace":
            return None
    text, replaced = decode_replacing(data, options.encoding)
    batch.count("replaced_bytes", replaced)
    batch.count("docs_with_replaced_bytes")
    return text


def _undecodable_reason(options: IngestStage) -> str:
    return "invalid_utf8" if codecs.lookup(options.encoding).name == "utf-8" else "invalid_encoding"


@dataclass
class JsonlChunk:
    """Lines of a JSONL file starting in [start, end) (uncompressed), or all of a compressed file."""

    path: str
    prefix: str  # ids are `<prefix>:<byte offset>`
    source: str
    options: IngestStage
    start: int = 0
    end: int | None = None

    def run(self) -> Iterator[Batch]:
        batch = DocumentBatcher(self.source)
        undecodable = _undecodable_reason(self.options)
        limit = self.options.max_record_bytes
        records = 0
        at_end = False
        try:
            with storage.open_decompressed(self.path) as handle:
                offset = self.start
                if self.start:
                    # The previous chunk owns the line that straddles our start.
                    handle.seek(self.start - 1)
                    offset += limits.skip_line(handle) - 1
                while self.end is None or offset < self.end:
                    # At most limit + 1 bytes: a longer line is never read whole.
                    line = handle.readline(limit + 1)
                    if not line:
                        at_end = True
                        break
                    line_offset = offset
                    offset += len(line)
                    if len(line) > limit and not line.endswith(b"\n"):
                        skipped = limits.skip_line(handle)
                        offset += skipped
                        records += 1
                        limits.reject_too_large(batch, f"{self.prefix}:{line_offset}", len(line) + skipped, limit, line)
                        continue
                    if line_offset == 0 and line.startswith(codecs.BOM_UTF8) and self.options.encoding == "utf-8":
                        line = line[len(codecs.BOM_UTF8) :]  # a byte-order mark, as Windows editors write
                    stripped = line.strip()
                    if not stripped:
                        continue  # blank lines separate nothing in JSONL
                    records += 1
                    doc_id = f"{self.prefix}:{line_offset}"
                    text = _decode(stripped, self.options, batch)
                    if text is None:
                        batch.reject(doc_id, undecodable, stripped)
                    else:
                        try:
                            record = json.loads(text)
                        except (json.JSONDecodeError, RecursionError):
                            batch.reject(doc_id, "invalid_json", text)
                        else:
                            _record_to_document(record, doc_id, self.options, batch, text)
                    if len(batch) >= BATCH_RECORDS:
                        yield batch.flush()
                if self.start == 0 and records == 0 and not at_end:
                    at_end = not handle.read(1)  # the chunk ended where the file does (an empty file)
        except (OSError, EOFError) as error:
            # A truncated or corrupt compressed file: keep what was read, report the rest.
            batch.reject(f"{self.prefix}:corrupt", "corrupt_file", f"{type(error).__name__}: {error}")
        else:
            if self.start == 0 and at_end and records == 0:
                # This chunk read the whole file and found no record: say so rather than `in 0`.
                batch.reject(
                    f"{self.prefix}:empty",
                    "empty_file",
                    f"{storage.redact(self.path)}: no record (empty or blank lines only)",
                )
        yield batch.flush()


def _cell_sizes(column: Any) -> list[int | None]:
    """Each cell's size in bytes (None for a null or a value that is not text or bytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (
        pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type)
    ):
        return [None] * len(column)
    return pc.binary_length(column).to_pylist()


def _cell_head(cell: Any) -> bytes:
    """The first bytes of a text or bytes cell, without copying the rest."""
    return cell.as_buffer()[: limits.HEAD_BYTES].to_pybytes()


def _without_cells(record_batch: Any, column: str, rows: set[int]) -> Any:
    """`record_batch` with the cells of `column` at `rows` set to null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pa.array([index in rows for index in range(record_batch.num_rows)])
    position = record_batch.schema.get_field_index(column)
    values = record_batch.column(position)
    return record_batch.set_column(position, column, pc.if_else(mask, pa.scalar(None, values.type), values))


@dataclass
class ParquetChunk:
    """Row groups [first, last) of a Parquet file with arbitrary columns."""

    path: str
    prefix: str  # ids are `<prefix>:<row>`
    source: str
    options: IngestStage
    row_groups: list[int] = field(default_factory=list)
    first_row: int = 0

    def run(self) -> Iterator[Batch]:

        parquet_file = storage.parquet_file(self.path)
        names = parquet_file.schema_arrow.names
        if self.options.text_field not in names:
            raise TokenmillError(
                f"{self.path} has no column {self.options.text_field!r} (columns: {', '.join(names)}); set --text-field"
            )
        if self.options.id_field is not None and self.options.id_field not in names:
            raise TokenmillError(f"{self.path} has no id column {self.options.id_field!r}; set --id-field")
        columns = [self.options.text_field] + ([self.options.id_field] if self.options.id_field else [])
        row = self.first_row
        batch = DocumentBatcher(self.source)
        limit = self.options.max_record_bytes
        for record_batch in parquet_file.iter_batches(
            batch_size=BATCH_RECORDS, row_groups=self.row_groups, columns=columns
        ):
            # Cells over the limit are rejected from Arrow's buffer, never copied into Python.
            sizes = _cell_sizes(record_batch.column(self.options.text_field))
            oversized = {index for index, size in enumerate(sizes) if size is not None and size > limit}
            if oversized:
                texts = record_batch.column(self.options.text_field)
                heads = {index: _cell_head(texts[index]) for index in oversized}
                record_batch = _without_cells(record_batch, self.options.text_field, oversized)
            for index, record in enumerate(record_batch.to_pylist()):
                doc_id = f"{self.prefix}:{row}"
                if index in oversized:
                    if self.options.id_field is not None and record.get(self.options.id_field) not in (None, ""):
                        doc_id = limits.repair_surrogates(str(record[self.options.id_field]), batch)
                    limits.reject_too_large(batch, doc_id, sizes[index], limit, heads[index])
                else:
                    _record_to_document(record, doc_id, self.options, batch, None)
                row += 1
            yield batch.flush()
        if len(batch):
            yield batch.flush()


@dataclass
class TextChunk:
    """Plain-text files: one document per file, or documents split by a separator regex."""

    files: list[tuple[str, str]]  # (path, id prefix)
    source: str
    options: IngestStage

    def run(self) -> Iterator[Batch]:
        batch = DocumentBatcher(self.source)
        undecodable = _undecodable_reason(self.options)
        separator = (
            re.compile(self.options.separator.encode(self.options.encoding), re.MULTILINE)
            if self.options.separator
            else None
        )
        for path, prefix in self.files:
            try:
                yield from self._read(batch, path, prefix, separator, undecodable)
            except (OSError, EOFError) as error:
                batch.reject(f"{prefix}:corrupt", "corrupt_file", f"{type(error).__name__}: {error}")
        yield batch.flush()

    def _read(
        self, batch: DocumentBatcher, path: str, prefix: str, separator: re.Pattern[bytes] | None, undecodable: str
    ) -> Iterator[Batch]:
        """Add one file's documents to `batch`, yielding it whenever it is full."""
        limit = self.options.max_record_bytes
        with storage.open_decompressed(path) as handle:
            if separator is None:
                first, size = limits.read_limited(handle, limit)
                if size > limit:
                    limits.reject_too_large(batch, prefix, size, limit, first)
                    return
            else:
                first = handle.read(SPLIT_CHUNK_BYTES)  # what judges the file binary, or empty
            kind = binary_kind(first)
            if kind is not None:
                # A PDF or an image read as text would become a document of mojibake.
                batch.reject(prefix, "binary", f"{storage.redact(path)}: {kind}")
                return
            if separator is None:
                self._add(batch, prefix, Piece(0, size, first), path, undecodable, split=False)
                return
            if first.strip():
                pieces = split_stream(handle, first, separator, limit)
            elif _text_follows(handle):
                # Text only after a chunk of whitespace, which the split needs: from the start again.
                handle.close()
                handle = storage.open_decompressed(path)
                pieces = split_stream(handle, b"", separator, limit)
            else:
                batch.reject(f"{prefix}:empty", "empty_file", f"{storage.redact(path)}: no text to split")
                return
            with handle:
                for piece in pieces:
                    self._add(batch, f"{prefix}:{piece.offset}", piece, path, undecodable, split=True)
                    if len(batch) >= BATCH_RECORDS:
                        yield batch.flush()

    def _add(self, batch: DocumentBatcher, doc_id: str, piece: Piece, path: str, undecodable: str, split: bool) -> None:
        """Keep one piece (a whole file when not `split`), or reject it with the reason."""
        limit = self.options.max_record_bytes
        if piece.size > limit:
            limits.reject_too_large(batch, doc_id, piece.size, limit, piece.data)
            return
        kind = nul_kind(piece.data, piece.offset) if split else None
        if kind is not None:  # a NUL past the first chunk, which decided that the file is text
            batch.reject(doc_id, "binary", f"{storage.redact(path)}: {kind}")
            return
        text = _decode(piece.data, self.options, batch)
        if text is None:
            batch.reject(doc_id, undecodable, piece.data)
        elif not text.strip():
            if split and not piece.data:
                return  # two adjacent separators: no document between them
            batch.reject(doc_id, "empty_text", piece.data, text=text)
        else:
            batch.keep(doc_id, text)


@dataclass
class UnknownFile:
    """A file in an input directory whose extension names no format: one counted rejection."""

    path: str
    prefix: str
    source: str

    def run(self) -> Iterator[Batch]:
        batch = DocumentBatcher(self.source)
        batch.reject(
            self.prefix,
            "unknown_format",
            f"{storage.redact(self.path)}: no known extension ({', '.join(sorted(EXTENSIONS))}, optionally .gz/.zst); pass --format to read it",
        )
        yield batch.flush()


@dataclass
class FileRejection:
    """A whole file rejected before any record is read: one counted rejection."""

    path: str
    doc_id: str
    source: str
    reason: str
    raw: str

    def run(self) -> Iterator[Batch]:
        batch = DocumentBatcher(self.source)
        batch.reject(self.doc_id, self.reason, self.raw)
        yield batch.flush()


@dataclass
class WithColumns:
    """Another task's output with extra (null) columns, so that every part of a stage that also
    read web archives has their columns and the kept/ directory reads as one table."""

    task: Any
    columns: tuple[str, ...]

    def run(self) -> Iterator[Batch]:
        import pandas as pd

        for output in self.task.run():
            for frame in (output.kept, output.rejected):
                for column in self.columns:
                    if column not in frame.columns:
                        frame[column] = pd.Series([None] * len(frame), index=frame.index, dtype=object)
            yield output


def _file_tasks(path: str, prefix: str, source: str, fmt: str, options: IngestStage) -> list[Any]:
    if fmt == "jsonl":
        if storage.compression_suffix(path):
            return [JsonlChunk(str(path), prefix, source, options)]
        size = storage.size(path)
        return [
            JsonlChunk(str(path), prefix, source, options, start, min(start + JSONL_CHUNK_BYTES, size))
            for start in range(0, max(size, 1), JSONL_CHUNK_BYTES)
        ]
    if fmt == "parquet":
        metadata = storage.parquet_file(path).metadata
        if metadata.num_rows == 0:
            return [
                FileRejection(str(path), f"{prefix}:empty", source, "empty_file", f"{storage.redact(path)}: no rows")
            ]
        tasks: list[Any] = []
        first_row = 0
        for index in range(metadata.num_row_groups):
            tasks.append(ParquetChunk(str(path), prefix, source, options, [index], first_row))
            first_row += metadata.row_group(index).num_rows
        return tasks
    if fmt in ARCHIVE_FORMATS:
        return [webarchive.WarcFile(str(path), source, fmt, options.max_record_bytes)]
    if fmt == "html":
        return [webarchive.HtmlFiles([(str(path), prefix)], source, options.max_record_bytes)]
    return [TextChunk([(str(path), prefix)], source, options)]


def plan_tasks(paths: list[str | Path], options: IngestStage) -> list[Any]:
    """Split the inputs into partition tasks (deterministic order)."""
    if options.format is not None and options.format not in FORMATS:
        raise TokenmillError(f"unknown format {options.format!r}; choose one of {', '.join(FORMATS)}")
    tasks: list[Any] = []
    owners: dict[str, str] = {}  # id prefix -> the file that owns it: ids must be unique

    def claim(prefix: str, path: str) -> None:
        if prefix in owners:
            raise TokenmillError(
                f"{storage.redact(owners[prefix])} and {storage.redact(path)} would give documents the same ids"
                f" ({prefix}:...): "
                "rename one, or ingest them separately"
            )
        owners[prefix] = path

    # One --source over several inputs: each id names its input too, so ids stay unique.
    shared_source = options.source is not None and len(paths) > 1
    for raw_path in paths:
        # A local path or a URL (s3://, gs://, hf://, https://), named as given.
        path = storage.Location(raw_path).path
        name = storage.public_name(path)
        if not storage.exists(path):
            raise TokenmillError(f"input not found: {storage.redact(path)}")
        # Named as typed in messages; read by Dask workers, whose working directory on a cluster
        # (--scheduler, DASK_SCHEDULER_ADDRESS) is not this one.
        where = storage.absolute(path)
        if storage.isdir(where):
            files = storage.list_files(where)
            if not files:
                raise TokenmillError(f"input directory {storage.redact(path)} holds no files")
            source = options.source or name
            pending_text: list[tuple[str, str]] = []
            pending_html: list[tuple[str, str]] = []
            for file, relative in files:
                prefix = f"{source}:{name}/{relative}" if shared_source else f"{source}:{relative}"
                claim(prefix, file)
                fmt = options.format or detect_format(Path(relative))
                if fmt is None:
                    tasks.append(UnknownFile(file, prefix, source))
                elif fmt == "text":
                    pending_text.append((file, prefix))  # grouped: one task per many small files
                elif fmt == "html":
                    pending_html.append((file, prefix))
                else:
                    tasks.extend(_file_tasks(file, prefix, source, fmt, options))
            for start in range(0, len(pending_text), TEXT_FILES_PER_TASK):
                tasks.append(TextChunk(pending_text[start : start + TEXT_FILES_PER_TASK], source, options))
            for start in range(0, len(pending_html), TEXT_FILES_PER_TASK):
                tasks.append(
                    webarchive.HtmlFiles(
                        pending_html[start : start + TEXT_FILES_PER_TASK], source, options.max_record_bytes
                    )
                )
            continue
        fmt = options.format or detect_format(Path(name))
        if fmt is None:
            raise TokenmillError(
                f"cannot tell the format of {storage.redact(path)} from its extension; pass --format"
                f" ({', '.join(FORMATS)})"
            )
        source = options.source or name
        prefix = f"{source}:{name}" if shared_source else source
        claim(prefix, path)
        tasks.extend(_file_tasks(where, prefix, source, fmt, options))
    if not tasks:
        raise TokenmillError("no input files given")
    web = (webarchive.WarcFile, webarchive.HtmlFiles)
    if any(isinstance(task, web) for task in tasks) and not all(isinstance(task, web) for task in tasks):
        tasks = [task if isinstance(task, web) else WithColumns(task, webarchive.WEB_COLUMNS) for task in tasks]
    return tasks


def ingest(
    paths: str | Path | list[str | Path],
    output: str | Path,
    *,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """Read raw corpora into a document stage directory (`options`: `IngestStage`'s fields);
    returns its manifest."""
    return run_stage(
        IngestStage(**options), paths, output, client=client, scheduler=scheduler, workers=workers, progress=progress
    )


def _report(manifest: dict[str, Any], args: Any) -> None:
    counts = manifest["counts"]
    if counts["kept"] == 0:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(counts["rejected"].items())) or "no record"
        log.warning(f"ingest kept no document ({reasons}): the stages after it will have nothing to read")
    stats = manifest["stats"]
    if stats.get("replaced_bytes"):
        log.info(
            f"  replaced {stats['replaced_bytes']} undecodable bytes in {stats['docs_with_replaced_bytes']} documents"
        )


STAGES = (
    Stage(
        "ingest",
        IngestStage,
        io="files",
        in_recipes=False,
        report=_report,
        help="read JSONL / Parquet / text corpora and web archives (WARC, WET, HTML) into Parquet documents",
        description="Read raw corpora into Parquet documents, each file by its extension (.jsonl, .json,"
        " .ndjson, .parquet, .txt, .md; line formats also .gz / .zst), web archives (.warc, .warc.gz, .warc.wet.gz:"
        " one document per HTML response or WET text record) and saved pages (.html, .htm, .html.gz). Bad records, undecodable text and files of"
        " unknown format in a directory are rejected with a reason.",
    ),
)
