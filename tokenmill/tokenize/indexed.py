"""Megatron's memory-mapped indexed dataset: `PREFIX.bin` (tokens) + `PREFIX.idx` (index).

Layout (little-endian, no padding), as `megatron/core/datasets/indexed_dataset.py` reads it:

    magic  b"MMIDIDX\\x00\\x00"      9 bytes
    version                          u64 = 1
    dtype code                       u8  (see DTYPE_CODES)
    sequence count S                 u64
    document count D                 u64 (documents + 1)
    sequence_lengths                 S x int32
    sequence_pointers                S x int64 (byte offsets into .bin)
    document_indices                 D x int64 (0, then the sequence count at each document end)

We write one sequence per document, so `document_indices` is `0, 1, ..., S`. The `.bin` holds
every sequence's tokens back to back in the index dtype, with no header.

Megatron trusts the index. We check it on every open (`check_index`, one vectorised pass over
the mapped arrays): a damaged pointer or length would otherwise read as an empty or shifted
document and train on wrong boundaries. The writer also computes the xxh64 of both files as it
writes them, which the encoder records in `PREFIX.json` for `tokenmill tokenize inspect --verify`.
"""

from __future__ import annotations

import os
import struct
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import xxhash

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.atomic import atomic_path, remove_leftovers

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8  # 34 bytes before the arrays

DTYPE_CODES: dict[int, type[np.number]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(dtype): code for code, dtype in DTYPE_CODES.items()}

# Megatron's rule: token ids fit uint16 when the vocabulary is below this size.
UINT16_VOCAB_LIMIT = 65500
# Bytes read at a time when a file is hashed: bounded memory whatever the shard's size.
CHECKSUM_CHUNK = 16 * 1024 * 1024
CHECKSUM_ALGORITHM = "xxh64"
# Index entries checked at a time on open (buffers that stay in the CPU cache).
CHECK_CHUNK = 1 << 16
# What a user can do about a damaged shard.
CORRUPT_HINT = "the shard is damaged: encode it again or restore it from a copy"


def file_checksum(path: str | Path) -> str:
    """The xxh64 of a file (hex), read in chunks of `CHECKSUM_CHUNK` bytes."""
    digest = xxhash.xxh64()
    buffer = bytearray(CHECKSUM_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when the vocabulary has fewer than 65,500 tokens, else int32 (Megatron's choice)."""
    if vocab_size <= 0:
        raise TokenmillError(f"vocabulary size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)


def bin_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def write_index(path: str | Path, dtype: np.dtype, sequence_lengths: np.ndarray, document_indices: np.ndarray) -> str:
    """Write a `.idx` file for sequences of the given lengths (pointers are derived); returns
    the file's xxh64."""
    dtype = np.dtype(dtype)
    if dtype not in CODE_OF_DTYPE:
        raise TokenmillError(f"dtype {dtype} has no Megatron dtype code")
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_idx = np.asarray(document_indices, dtype=np.int64)
    digest = xxhash.xxh64()
    with open(path, "wb") as f:
        for piece in (
            MAGIC,
            struct.pack("<Q", VERSION),
            struct.pack("<B", CODE_OF_DTYPE[dtype]),
            struct.pack("<Q", len(lengths)),
            struct.pack("<Q", len(doc_idx)),
            lengths.astype("<i4").tobytes(order="C"),
            pointers.astype("<i8").tobytes(order="C"),
            doc_idx.astype("<i8").tobytes(order="C"),
        ):
            digest.update(piece)
            f.write(piece)
    return digest.hexdigest()


class IndexedDatasetWriter:
    """Append documents to `PREFIX.bin` and write `PREFIX.idx` on `finalize()`.

    Both files are written under temporary names and renamed into place by `finalize()`, so an
    interrupted writer never leaves a `.bin`/`.idx` pair that looks complete. `seal()` finishes
    the files without publishing them, for a caller that must act in between (remove an old
    `PREFIX.json`); `checksums` then holds their xxh64, computed from the bytes as written.
    """

    def __init__(self, prefix: str | Path, dtype: np.dtype | type) -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise TokenmillError(f"dtype {self.dtype} has no Megatron dtype code")
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        for path in (bin_path(self.prefix), idx_path(self.prefix)):
            remove_leftovers(path)  # of a writer of this prefix that was killed
        # both files are published by closing this stack (the .bin first), or never
        self._publish = ExitStack()
        self._tmp_idx = self._publish.enter_context(atomic_path(idx_path(self.prefix)))
        self._tmp_bin = self._publish.enter_context(atomic_path(bin_path(self.prefix)))
        self._bin = open(self._tmp_bin, "wb")
        self._bin_digest = xxhash.xxh64()
        self._lengths: list[np.ndarray] = []
        self._count = 0
        self.tokens = 0
        self.checksums: dict[str, str] | None = None  # {"bin": xxh64, "idx": xxh64} once sealed

    def _write(self, data: bytes | memoryview) -> None:
        self._bin_digest.update(data)
        self._bin.write(data)

    def add_documents(self, flat_tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append many documents at once: their tokens back to back and each one's length."""
        flat = np.asarray(flat_tokens)
        lengths = np.asarray(lengths, dtype=np.int32)
        if int(lengths.sum(dtype=np.int64)) != len(flat):
            raise ValueError("lengths do not add up to the number of tokens")
        self._write(flat.astype(self.dtype, copy=False).tobytes(order="C"))
        self._lengths.append(lengths)
        self._count += len(lengths)
        self.tokens += len(flat)

    def add_index(self, other_prefix: str | Path) -> None:
        """Append every document of another shard with the same dtype (used to merge parts)."""
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise TokenmillError(f"cannot merge {other_prefix} ({other.dtype}) into a {self.dtype} shard")
        buffer = bytearray(CHECKSUM_CHUNK)
        view = memoryview(buffer)
        with open(bin_path(other_prefix), "rb", buffering=0) as source:
            while n := source.readinto(buffer):
                self._write(view[:n])
        self._lengths.append(np.array(other.sequence_lengths, dtype=np.int32))
        self._count += len(other)
        self.tokens += int(other.sequence_lengths.sum(dtype=np.int64))
        other.close()

    def __len__(self) -> int:
        return self._count

    def seal(self) -> dict[str, str]:
        """Close the `.bin` and write the `.idx`, both still under their temporary names.
        Returns (and keeps in `checksums`) the xxh64 of each."""
        if self.checksums is None:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int32)
            idx_digest = write_index(self._tmp_idx, self.dtype, lengths, np.arange(len(lengths) + 1, dtype=np.int64))
            self.checksums = {"bin": self._bin_digest.hexdigest(), "idx": idx_digest}
        return self.checksums

    def finalize(self) -> Path:
        """Seal the files and move both into place. Returns the prefix."""
        self.seal()
        self._publish.close()
        return self.prefix

    def abort(self) -> None:
        if not self._bin.closed:
            self._bin.close()
        self._publish.pop_all()  # publish nothing
        for path in (self._tmp_bin, self._tmp_idx):
            path.unlink(missing_ok=True)


class IndexedDataset:
    """Zero-copy reader of a Megatron `.bin`/`.idx` pair.

    `ds[i]` is document (sequence) i as a read-only view into the memory-mapped `.bin`;
    `ds.get(i, offset, length)` a slice of it. Nothing is read until it is touched.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        index_file, data_file = idx_path(prefix), bin_path(prefix)
        for path in (index_file, data_file):
            if not path.is_file():
                raise TokenmillError(f"token shard file not found: {path}")
        size = index_file.stat().st_size
        if size < HEADER_SIZE:
            raise TokenmillError(
                f"corrupt index {index_file}: {size} bytes is shorter than the {HEADER_SIZE}-byte header"
            )
        with open(index_file, "rb") as f:
            header = f.read(HEADER_SIZE)
        if header[: len(MAGIC)] != MAGIC:
            raise TokenmillError(
                f"corrupt index {index_file}: bad magic {header[: len(MAGIC)]!r} (not a Megatron MMIDIDX file)"
            )
        offset = len(MAGIC)
        (version,) = struct.unpack_from("<Q", header, offset)
        if version != VERSION:
            raise TokenmillError(f"corrupt index {index_file}: version {version}, expected {VERSION}")
        (code,) = struct.unpack_from("<B", header, offset + 8)
        if code not in DTYPE_CODES:
            raise TokenmillError(f"corrupt index {index_file}: unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        sequence_count, document_count = struct.unpack_from("<QQ", header, offset + 9)
        expected = HEADER_SIZE + sequence_count * 4 + sequence_count * 8 + document_count * 8
        if size != expected:
            raise TokenmillError(
                f"corrupt index {index_file}: {size} bytes, but its header ({sequence_count} sequences, "
                f"{document_count} document indices) implies {expected}"
            )
        self._index = np.memmap(index_file, mode="r", dtype=np.uint8)
        self.sequence_lengths = np.frombuffer(self._index, dtype="<i4", count=sequence_count, offset=HEADER_SIZE)
        self.sequence_pointers = np.frombuffer(
            self._index, dtype="<i8", count=sequence_count, offset=HEADER_SIZE + sequence_count * 4
        )
        self.document_indices = np.frombuffer(
            self._index, dtype="<i8", count=document_count, offset=HEADER_SIZE + sequence_count * 12
        )
        bin_size = data_file.stat().st_size
        self._check(index_file, data_file, bin_size)
        # np.memmap cannot map an empty file; an empty shard reads as an empty array.
        self._bin = np.memmap(data_file, mode="r", dtype=self.dtype) if bin_size else np.zeros(0, dtype=self.dtype)

    def _check(self, index_file: Path, data_file: Path, bin_size: int) -> None:
        """Refuse an index that does not describe the `.bin` sequence by sequence: lengths are
        not negative, pointers start at 0 and advance by length x itemsize, the last sequence
        ends where the `.bin` ends, and document indices run from 0 to the sequence count
        without decreasing. One vectorised pass (about 5 ms for a million sequences); the first
        bad sequence or document is named."""
        lengths, pointers, documents = self.sequence_lengths, self.sequence_pointers, self.document_indices
        itemsize = self.dtype.itemsize

        def corrupt(detail: str) -> TokenmillError:
            return TokenmillError(f"corrupt index {index_file}: {detail} ({CORRUPT_HINT})")

        count = len(lengths)
        end = 0
        if count:
            if int(lengths.min()) < 0:
                i = int(np.argmax(lengths < 0))
                raise corrupt(f"sequence {i} has length {int(lengths[i])}")
            if int(pointers[0]) != 0:
                raise corrupt(f"sequence 0 starts at byte {int(pointers[0])}, not 0")
            # Where each sequence must start given the one before it, minus where it does start,
            # a chunk at a time: small reused buffers stay in cache, and the arrays (unaligned in
            # the file) are read once.
            gaps = np.empty(min(count, CHECK_CHUNK), dtype=np.int64)
            for begin in range(0, count - 1, CHECK_CHUNK):
                stop = min(begin + CHECK_CHUNK, count - 1)
                gap = gaps[: stop - begin]
                np.multiply(lengths[begin:stop], itemsize, out=gap, dtype=np.int64)
                gap += pointers[begin:stop]
                gap -= pointers[begin + 1 : stop + 1]
                if gap.any():
                    i = begin + int(np.flatnonzero(gap)[0]) + 1
                    before = int(pointers[i - 1]) + int(lengths[i - 1]) * itemsize
                    raise corrupt(
                        f"sequence {i} starts at byte {int(pointers[i])}, but sequence {i - 1} ({int(lengths[i - 1])}"
                        f" tokens of {self.dtype} from byte {int(pointers[i - 1])}) ends at byte {before}"
                    )
            end = int(pointers[-1]) + int(lengths[-1]) * itemsize
        if bin_size != end:
            raise TokenmillError(
                f"{data_file} has {bin_size} bytes but {index_file} describes {end // itemsize} tokens of {self.dtype} "
                f"({end} bytes): the pair does not match ({CORRUPT_HINT})"
            )
        if len(documents) == 0:
            raise corrupt("no document indices (there is at least the leading 0)")
        if int(documents[0]) != 0:
            raise corrupt(f"document indices start at {int(documents[0])}, not 0")
        decreasing = np.empty(min(len(documents), CHECK_CHUNK), dtype=bool)
        for begin in range(0, len(documents) - 1, CHECK_CHUNK):
            stop = min(begin + CHECK_CHUNK, len(documents) - 1)
            down = np.less(documents[begin + 1 : stop + 1], documents[begin:stop], out=decreasing[: stop - begin])
            if down.any():
                j = begin + int(np.flatnonzero(down)[0])
                raise corrupt(
                    f"document {j} runs from sequence {int(documents[j])} back to {int(documents[j + 1])}"
                    " (document indices must not decrease)"
                )
        if int(documents[-1]) != count:
            raise corrupt(f"document indices end at sequence {int(documents[-1])}, not at the sequence count {count}")

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def _start(self, i: int) -> int:
        return int(self.sequence_pointers[i]) // self.dtype.itemsize

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"document {i} out of range for {n} documents in {self.prefix}")
        return self._read(i, self._start(i), int(self.sequence_lengths[i]))

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset : offset + length` of document i (to its end when length is None)."""
        doc_length = int(self.sequence_lengths[i])
        if length is None:
            length = doc_length - offset
        if offset < 0 or length < 0 or offset + length > doc_length:
            raise IndexError(f"slice [{offset}, {offset + length}) outside document {i} of length {doc_length}")
        return self._read(i, self._start(i) + offset, length)

    def _read(self, i: int, start: int, length: int) -> np.ndarray:
        # A slice past the end of a memmap is silently short; a short document would break
        # every sample built on it, so it is an error.
        if start < 0 or start + length > len(self._bin):
            raise TokenmillError(
                f"document {i} of {self.prefix} reads tokens [{start}, {start + length}) past the end of"
                f" {bin_path(self.prefix)} ({len(self._bin)} tokens) ({CORRUPT_HINT})"
            )
        return self._bin[start : start + length]

    def close(self) -> None:
        # Dropping the references lets the OS unmap the files.
        self._bin = None  # type: ignore[assignment]
        self._index = None  # type: ignore[assignment]


def cached_shard(prefix: str | Path) -> str:
    """The local prefix of a shard: the prefix itself on local disk; for one on object storage,
    its files downloaded once into the cache (shards are memory-mapped, so they must be local
    files). A shard counts as published when its `PREFIX.json` exists: the encoder uploads it last."""
    location = storage.Location(prefix)
    if location.is_local:
        return str(prefix)
    url = location.path
    if not storage.isfile(f"{url}.idx"):
        raise TokenmillError(
            f"token shard not found: {url}.idx (give a shard prefix, a blend file or a list of {{prefix, weight}})"
        )
    if not storage.isfile(f"{url}.json"):
        raise TokenmillError(f"token shard {url} is incomplete ({url}.json is missing): its upload was interrupted")
    shards = storage.Mirror(str(location.parent), "shards")
    shards.pull([f"{location.name}{suffix}" for suffix in (".json", ".idx", ".bin")])
    return str(shards.local / location.name)
