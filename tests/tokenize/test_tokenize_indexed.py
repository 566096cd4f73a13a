"""The Megatron .bin/.idx format: round trip, byte layout, dtype choice, corrupt files."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from shard_writing import add_each

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.indexed import IndexedDataset, IndexedDatasetWriter, dtype_for_vocab, file_checksum


def _write(prefix, docs, dtype=np.uint16):
    writer = IndexedDatasetWriter(prefix, dtype)
    add_each(writer, docs)
    return writer.finalize()


def test_round_trip_documents_and_slices(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 60000, size=n) for n in (5, 1, 17, 300, 2)]
    _write(tmp_path / "s", docs)
    ds = IndexedDataset(tmp_path / "s")
    assert len(ds) == 5 and ds.dtype == np.uint16 and ds.num_tokens == sum(map(len, docs))
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
    np.testing.assert_array_equal(ds.get(3, 10, 7), docs[3][10:17])
    np.testing.assert_array_equal(ds.get(3, 290), docs[3][290:])
    np.testing.assert_array_equal(ds[-1], docs[-1])
    assert [len(d) for d in ds[1:3]] == [1, 17]
    # Zero-copy: the document is a view of the memory map, not a copy.
    assert isinstance(ds[3].base, np.memmap) or isinstance(ds[3], np.memmap)
    with pytest.raises(IndexError):
        ds[5]
    with pytest.raises(IndexError):
        ds.get(0, 3, 5)


def test_idx_byte_layout_field_by_field(tmp_path):
    docs = [[1, 2, 3], [70000, 5], [9]]
    _write(tmp_path / "s", docs, np.int32)
    raw = (tmp_path / "s.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", raw, 9) == (1,)  # version
    assert raw[17] == 4  # dtype code: int32
    sequence_count, document_count = struct.unpack_from("<QQ", raw, 18)
    assert (sequence_count, document_count) == (3, 4)
    at = 34
    assert struct.unpack_from("<3i", raw, at) == (3, 2, 1)  # sequence_lengths int32
    at += 3 * 4
    assert struct.unpack_from("<3q", raw, at) == (0, 12, 20)  # byte pointers int64
    at += 3 * 8
    assert struct.unpack_from("<4q", raw, at) == (0, 1, 2, 3)  # document_indices
    at += 4 * 8
    assert len(raw) == at  # no padding, nothing after
    assert (tmp_path / "s.bin").read_bytes() == np.array([1, 2, 3, 70000, 5, 9], dtype="<i4").tobytes()


def test_uint16_dtype_code_and_bytes(tmp_path):
    _write(tmp_path / "s", [[65535, 0], [7]], np.uint16)
    raw = (tmp_path / "s.idx").read_bytes()
    assert raw[17] == 8  # uint16
    assert struct.unpack_from("<2q", raw, 34 + 2 * 4) == (0, 4)  # pointers advance by 2 bytes a token
    assert (tmp_path / "s.bin").read_bytes() == np.array([65535, 0, 7], dtype="<u2").tobytes()


@pytest.mark.parametrize(
    "vocab, expected", [(2000, np.uint16), (65499, np.uint16), (65500, np.int32), (128256, np.int32)]
)
def test_dtype_follows_megatron_rule(vocab, expected):
    assert dtype_for_vocab(vocab) == np.dtype(expected)


def test_merge_parts_equals_single_write(tmp_path):
    a, b = [[1, 2], [3]], [[4, 5, 6], [7, 8]]
    _write(tmp_path / "a", a)
    _write(tmp_path / "b", b)
    _write(tmp_path / "ab", a + b)
    merged = IndexedDatasetWriter(tmp_path / "m", np.uint16)
    merged.add_index(tmp_path / "a")
    merged.add_index(tmp_path / "b")
    merged.finalize()
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"m{ext}").read_bytes() == (tmp_path / f"ab{ext}").read_bytes()


def test_empty_shard_reads(tmp_path):
    _write(tmp_path / "e", [])
    ds = IndexedDataset(tmp_path / "e")
    assert len(ds) == 0 and ds.num_tokens == 0


def test_corrupt_or_missing_files_give_clear_errors(tmp_path):
    _write(tmp_path / "s", [[1, 2, 3], [4]])
    idx = tmp_path / "s.idx"
    good = idx.read_bytes()

    with pytest.raises(TokenmillError, match="not found: .*missing.idx"):
        IndexedDataset(tmp_path / "missing")

    idx.write_bytes(b"NOTMAGIC!" + good[9:])
    with pytest.raises(TokenmillError, match="s.idx: bad magic"):
        IndexedDataset(tmp_path / "s")

    idx.write_bytes(good[:-8])  # truncated
    with pytest.raises(TokenmillError, match="corrupt index .*s.idx"):
        IndexedDataset(tmp_path / "s")

    idx.write_bytes(good[:17] + bytes([42]) + good[18:])
    with pytest.raises(TokenmillError, match="unknown dtype code 42"):
        IndexedDataset(tmp_path / "s")

    idx.write_bytes(good)
    (tmp_path / "s.bin").write_bytes(b"\x00" * 6)  # 3 tokens where the index says 4
    with pytest.raises(TokenmillError, match="s.bin has 6 bytes"):
        IndexedDataset(tmp_path / "s")


def test_interrupted_writer_leaves_no_shard(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "s", np.uint16)
    add_each(writer, [[1, 2]])
    writer.abort()
    assert not list(tmp_path.iterdir())


# Where the arrays of a .idx begin (after the 34-byte header), for S sequences.
def _pointer_offset(sequences: int, i: int) -> int:
    return 34 + sequences * 4 + i * 8


def _document_offset(sequences: int, j: int) -> int:
    return 34 + sequences * 12 + j * 8


def _damaged_copy(tmp_path, docs, change) -> str:
    """A shard of `docs` whose .idx bytes `change(bytearray)` then alters in place."""
    prefix = tmp_path / "s"
    _write(prefix, docs)
    raw = bytearray((tmp_path / "s.idx").read_bytes())
    change(raw)
    (tmp_path / "s.idx").write_bytes(bytes(raw))
    return prefix


DOCS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16, 17, 18, 19]]


def test_flipped_pointer_bytes_are_refused_naming_the_shard_and_the_sequence(tmp_path):
    """The issue's first case: before this check the document read as 0 tokens and training
    died 15 steps later in np.stack, naming nothing."""

    def flip(raw):
        raw[_pointer_offset(5, 3)] ^= 0xFF  # sequence 3's pointer, lowest byte: 18 -> 237

    prefix = _damaged_copy(tmp_path, DOCS, flip)
    with pytest.raises(TokenmillError) as caught:
        IndexedDataset(prefix)
    assert str(caught.value) == (
        f"corrupt index {tmp_path / 's.idx'}: sequence 3 starts at byte 237, but sequence 2 (4 tokens of uint16"
        " from byte 10) ends at byte 18 (the shard is damaged: encode it again or restore it from a copy)"
    )


def test_lengths_swapped_between_two_documents_are_refused(tmp_path):
    """Same total, so the .bin size still matches: only the pointers give it away."""

    def swap(raw):
        first, second = 34 + 1 * 4, 34 + 2 * 4  # lengths of sequences 1 (2 tokens) and 2 (4 tokens)
        raw[first : first + 4], raw[second : second + 4] = raw[second : second + 4], raw[first : first + 4]

    prefix = _damaged_copy(tmp_path, DOCS, swap)
    with pytest.raises(TokenmillError, match=r"s\.idx: sequence 2 starts at byte 10, but sequence 1 \(4 tokens"):
        IndexedDataset(prefix)


def test_flipped_document_indices_are_refused(tmp_path):
    def flip(raw):
        raw[_document_offset(5, 2)] ^= 0xFF  # document index 2: 2 -> 253

    prefix = _damaged_copy(tmp_path, DOCS, flip)
    with pytest.raises(TokenmillError, match=r"s\.idx: document 2 runs from sequence 253 back to 3 "):
        IndexedDataset(prefix)

    def start(raw):
        raw[_document_offset(5, 0)] = 1

    with pytest.raises(TokenmillError, match=r"s\.idx: document indices start at 1, not 0"):
        IndexedDataset(_damaged_copy(tmp_path, DOCS, start))

    def end(raw):
        raw[_document_offset(5, 5)] = 4

    with pytest.raises(
        TokenmillError, match=r"s\.idx: document indices end at sequence 4, not at the sequence count 5"
    ):
        IndexedDataset(_damaged_copy(tmp_path, DOCS, end))


def test_negative_length_and_first_pointer_are_refused(tmp_path):
    def negative(raw):
        raw[34 + 4 * 4 + 3] = 0xFF  # sequence 4's length, highest byte

    with pytest.raises(TokenmillError, match=r"s\.idx: sequence 4 has length -16777211"):
        IndexedDataset(_damaged_copy(tmp_path, DOCS, negative))

    def first(raw):
        raw[_pointer_offset(5, 0)] = 2

    with pytest.raises(TokenmillError, match=r"s\.idx: sequence 0 starts at byte 2, not 0"):
        IndexedDataset(_damaged_copy(tmp_path, DOCS, first))


def test_truncated_bin_is_refused_naming_both_files(tmp_path):
    _write(tmp_path / "s", DOCS)
    data = tmp_path / "s.bin"
    data.write_bytes(data.read_bytes()[:-4])  # the last document loses 2 of its 5 tokens
    with pytest.raises(TokenmillError) as caught:
        IndexedDataset(tmp_path / "s")
    assert str(caught.value).startswith(
        f"{data} has 26 bytes but {tmp_path / 's.idx'} describes 15 tokens of uint16 (30 bytes): the pair does not match"
    )


def test_a_read_past_the_bin_raises_instead_of_returning_a_short_document(tmp_path):
    _write(tmp_path / "s", DOCS)
    ds = IndexedDataset(tmp_path / "s")
    ds._bin = ds._bin[:-2]  # a mapping shorter than the index says (checked on open, so forced here)
    np.testing.assert_array_equal(ds[3], [14])
    with pytest.raises(TokenmillError, match=r"document 4 of .*s reads tokens \[10, 15\) past the end of .*s\.bin"):
        ds[4]
    with pytest.raises(TokenmillError, match="document 4 .* past the end"):
        ds.get(4, 1, 4)
    np.testing.assert_array_equal(ds.get(4, 0, 3), [15, 16, 17])


def test_the_writer_records_the_checksums_of_the_files_it_wrote(tmp_path):
    import xxhash

    writer = IndexedDatasetWriter(tmp_path / "s", np.uint16)
    writer.add_documents(np.arange(10, dtype=np.uint16), np.array([3, 7], dtype=np.int32))
    add_each(writer, [[1, 2]])
    checksums = writer.seal()
    assert not (tmp_path / "s.bin").exists()  # sealed, not yet published
    writer.finalize()
    assert checksums == {
        "bin": xxhash.xxh64((tmp_path / "s.bin").read_bytes()).hexdigest(),
        "idx": xxhash.xxh64((tmp_path / "s.idx").read_bytes()).hexdigest(),
    }
    assert file_checksum(tmp_path / "s.bin") == checksums["bin"]
    merged = IndexedDatasetWriter(tmp_path / "m", np.uint16)
    merged.add_index(tmp_path / "s")
    assert merged.seal() == checksums  # a merge hashes the bytes it copies


def test_open_checks_a_million_sequences_in_milliseconds(tmp_path):
    lengths = np.random.default_rng(0).integers(1, 64, size=1_000_000).astype(np.int32)
    writer = IndexedDatasetWriter(tmp_path / "big", np.uint16)
    writer.add_documents(np.zeros(int(lengths.sum()), dtype=np.uint16), lengths)
    writer.finalize()
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        ds = IndexedDataset(tmp_path / "big")
        timings.append(time.perf_counter() - started)
    assert len(ds) == 1_000_000
    # About 5 ms on an idle core, 13 ms with 10 processes on 2 cores: the bound leaves room for a
    # heavily loaded machine and still catches a check that loops in Python (seconds).
    assert min(timings) < 0.5, f"open took {min(timings) * 1000:.1f} ms"
