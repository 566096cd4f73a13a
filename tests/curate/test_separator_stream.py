"""A text file split by --separator is read a chunk at a time, and gives the documents of the
whole file split in memory: the same ids, texts and rejections, whatever the chunk boundaries."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import pandas as pd
import pytest

from tokenmill.curate import ingest, limits


def split_in_memory(data: bytes, separator: str, limit: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(kept (id, text), rejected (id, reason)) of `data` held whole and split by `separator`:
    a zero-width match at a piece's start splits nothing, an empty piece is no document."""
    pieces, position = [], 0
    for match in re.finditer(separator.encode(), data, re.MULTILINE):
        if match.start() == match.end() == position:
            continue
        pieces.append((position, data[position : match.start()]))
        position = match.end()
    pieces.append((position, data[position:]))
    kept, rejected = [], []
    for offset, piece in pieces:
        doc_id = f"f:{offset}"
        if len(piece) > limit:
            rejected.append((doc_id, "too_large"))
        elif b"\x00" in piece:
            rejected.append((doc_id, "binary"))
        elif piece.decode().strip():
            kept.append((doc_id, piece.decode()))
        elif piece:
            rejected.append((doc_id, "empty_text"))
    return kept, rejected


def split_streaming(path: Path, separator: str, limit: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    options = ingest.IngestStage(separator=separator, max_record_bytes=limit)
    batches = list(ingest.TextChunk([(str(path), "f")], "s", options).run())
    kept = pd.concat([batch.kept for batch in batches])
    rejected = pd.concat([batch.rejected for batch in batches])
    return list(zip(kept["id"], kept["text"])), list(zip(rejected["id"], rejected["reason"]))


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks and margin small enough that separators and pieces straddle many boundaries."""
    monkeypatch.setattr(ingest, "SPLIT_CHUNK_BYTES", 64)
    monkeypatch.setattr(ingest, "SEPARATOR_MARGIN_BYTES", 256)  # above limits.HEAD_BYTES


@pytest.mark.parametrize(
    ("name", "separator"), [("wikitext2_valid.txt", "^(?= = [^=])"), ("tinyshakespeare.txt", "\n\n")]
)
@pytest.mark.parametrize("limit", [limits.DEFAULT_MAX_RECORD_BYTES, 3000])
def test_real_corpora_split_in_chunks_equal_the_whole_file_split(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch, name: str, separator: str, limit: int
) -> None:
    monkeypatch.setattr(ingest, "SPLIT_CHUNK_BYTES", 4096)
    monkeypatch.setattr(ingest, "SEPARATOR_MARGIN_BYTES", 512)
    path = shared_data / "corpus" / name
    expected = split_in_memory(path.read_bytes(), separator, limit)
    kept, rejected = expected
    assert len(kept) + len(rejected) >= 60  # wikitext2_valid holds 60 articles
    assert (limit == 3000) == any(reason == "too_large" for _, reason in rejected)
    assert split_streaming(path, separator, limit) == expected


SYNTHETIC = {
    # separators straddling chunk boundaries (chunks of 64 bytes), adjacent ones, a file ending in one
    "straddling": (b"a" * 60 + b"\n\n" + b"b" * 62 + b"\n\n\n\n" + b"c" * 100 + b"\n\n", "\n\n"),
    "zero-width at each line": (b"".join(b"line %d\n" % i for i in range(60)), "^"),
    "zero-width lookahead": (b"= T =\nxx\n" * 40 + b"= T =\n", "^(?= = |= )"),
    "lookbehind across a boundary": (b"ab" * 200, "(?<=a)b"),
    "pieces over the limit at boundaries": (
        b"\n\n".join(bytes([65 + i % 26]) * size for i, size in enumerate([10, 63, 64, 65, 200, 700, 130, 5])),
        "\n\n",
    ),
    "over the limit to the end": (b"x\n\n" + b"y" * 1000, "\n\n"),
    "whitespace pieces": (b"a\n\n \n\n\n\n  \t\n\nb", "\n\n"),
    "a NUL past the first chunk": (b"a" * 100 + b"\n\nbad\x00piece\n\ngood", "\n\n"),
    "whitespace for chunks, then text": (b" \n" * 300 + b"text\n\nmore", "\n\n"),
}


@pytest.mark.parametrize("case", list(SYNTHETIC))
def test_synthetic_splits_in_chunks_equal_the_whole_file_split(tmp_path: Path, small_chunks: None, case: str) -> None:
    data, separator = SYNTHETIC[case]
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    expected = split_in_memory(data, separator, 128)
    assert split_streaming(path, separator, 128) == expected


def test_a_nul_in_the_first_chunk_rejects_the_file_and_a_blank_file_is_empty(tmp_path: Path, small_chunks) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"a\x00b\n\n" + b"text " * 100)
    assert split_streaming(path, "\n\n", 128) == ([], [("f", "binary")])
    path.write_bytes(b" \n" * 500)  # whitespace over many chunks
    assert split_streaming(path, "\n\n", 128) == ([], [("f:empty", "empty_file")])


def test_random_texts_split_by_stream_equal_the_whole_split(small_chunks) -> None:
    """split_stream's pieces (offsets, sizes, bytes) against the whole text's, for random texts,
    separators (zero-width, lookbehind, line anchors), limits and chunk sizes."""
    rng = random.Random(7)
    separators = ["\n\n", "^(?= = [^=])", "(?=x)", "x*", "(?<=a)b", "^", "$", "\n+", "ab|b", r"\b"]
    for _ in range(300):
        data = bytes(rng.choice(b"ab x=\n") for _ in range(rng.randint(0, 2000)))
        separator = rng.choice(separators)
        limit = rng.randint(1, 600)
        ingest.SPLIT_CHUNK_BYTES = rng.randint(1, 300)
        pattern = re.compile(separator.encode(), re.MULTILINE)
        expected, position = [], 0
        for match in pattern.finditer(data):
            if match.start() == match.end() == position:
                continue
            expected.append((position, data[position : match.start()]))
            position = match.end()
        expected.append((position, data[position:]))
        stream = io.BytesIO(data)
        pieces = list(ingest.split_stream(stream, stream.read(ingest.SPLIT_CHUNK_BYTES), pattern, limit))
        assert [(p.offset, p.size) for p in pieces] == [(offset, len(piece)) for offset, piece in expected]
        for piece, (_, whole) in zip(pieces, expected, strict=True):
            if len(whole) <= limit:
                assert piece.data == whole
            else:  # only its first bytes, for the rejection
                assert whole.startswith(piece.data) and len(piece.data) >= min(len(whole), limits.HEAD_BYTES)


def test_a_huge_file_split_by_a_separator_is_never_held_whole(tmp_path: Path, monkeypatch) -> None:
    """24 MiB in one piece over the 1 MiB limit, then a document: the split holds a few chunks
    (1 MiB here) at a time, where it used to read the whole file first."""
    import tracemalloc

    monkeypatch.setattr(ingest, "SPLIT_CHUNK_BYTES", 2**20)
    path = tmp_path / "huge.txt"
    with path.open("wb") as handle:
        for _ in range(24):
            handle.write(b"x" * 2**20)
        handle.write(b"\n\nthe document after it")
    tracemalloc.start()
    try:
        found = split_streaming(path, "\n\n", 2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == ([(f"f:{24 * 2**20 + 2}", "the document after it")], [("f:0", "too_large")])
    assert peak < 6 * 2**20, peak
