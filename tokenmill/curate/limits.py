"""The limit on one input record's size, and reading that never holds more than it.

A record over `max_record_bytes` (a JSONL line, a text file or separator-split piece, a WARC
record's content or its decompressed HTTP payload, a saved page, a Parquet cell) is rejected as
`too_large`: its bytes are skipped in bounded chunks, never held whole, so one record costs a
worker at most a few times the limit however large it is (a decompression bomb included).
"""

from __future__ import annotations

import re
from typing import IO

from tokenmill.curate.stage import DocumentBatcher
from tokenmill.errors import TokenmillError

# 64 MiB: far above real documents (a long book is a few MB, Common Crawl cuts WARC records at
# 1 MiB), yet a record this size, held as bytes, str and Arrow at once, stays well inside a
# worker with a few GiB of memory.
DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024
# Bytes read at a time while an oversized record is skipped.
SKIP_CHUNK_BYTES = 1024 * 1024
# Leading bytes of an oversized record kept in its rejection's `raw`, to show what it was.
HEAD_BYTES = 200
REASON = "too_large"
REASONS = {REASON: "a record larger than --max-record-bytes ({max_record_bytes} bytes); skipped unread"}

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_limit(max_record_bytes: int) -> int:
    if max_record_bytes < 1:
        raise TokenmillError(f"--max-record-bytes must be at least 1, got {max_record_bytes}")
    return max_record_bytes


def skip_line(handle: IO[bytes]) -> int:
    """Read past the end of the current line in bounded chunks; the number of bytes skipped."""
    skipped = 0
    while True:
        chunk = handle.readline(SKIP_CHUNK_BYTES)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


def read_limited(handle: IO[bytes], limit: int) -> tuple[bytes, int]:
    """(everything, its size) when the stream holds at most `limit` bytes, else (its first
    `limit` bytes, its whole size), the rest read in bounded chunks and dropped."""
    data = handle.read(limit + 1)
    if len(data) <= limit:
        return data, len(data)
    size = len(data)
    while chunk := handle.read(SKIP_CHUNK_BYTES):
        size += len(chunk)
    return data[:limit], size


def reject_too_large(
    batch: DocumentBatcher, doc_id: str, size: int | str, limit: int, head: bytes, meta: dict | None = None
) -> None:
    """Count a record over the limit: its id, its size and its first bytes, never its text."""
    batch.reject(
        doc_id,
        REASON,
        f"{size} bytes, over --max-record-bytes {limit}: "
        + head[:HEAD_BYTES].decode("utf-8", errors="backslashreplace"),
        meta,
    )


def repair_surrogates(text: str, batch: DocumentBatcher) -> str:
    """`text` with lone surrogates (JSON's `"\\ud800"`, which no UTF-8 file can hold) replaced by
    U+FFFD and counted (`replaced_surrogates`), so that the record can be written."""
    if _SURROGATE.search(text) is None:
        return text
    repaired, replaced = _SURROGATE.subn("\ufffd", text)
    batch.count("replaced_surrogates", replaced)
    return repaired
