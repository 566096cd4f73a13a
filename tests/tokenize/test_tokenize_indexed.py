"""The Megatron .bin/.idx format: round trip, byte layout, dtype choice, corrupt files."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.indexed import IndexedDataset, IndexedDatasetWriter, dtype_for_vocab


def _write(prefix, docs, dtype=np.uint16):
    writer = IndexedDatasetWriter(prefix, dtype)
    for doc in docs:
        writer.add_document(doc)
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
    writer.add_document([1, 2])
    writer.abort()
    assert not list(tmp_path.iterdir())
