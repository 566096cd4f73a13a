"""GPT training samples over one token shard, indexed exactly as Megatron-Core's `GPTDataset`.

Three indices make a sample (`megatron/core/datasets/gpt_dataset.py` and `helpers.cpp`):

- document_index: the split's document ids tiled over E epochs and shuffled with
  `np.random.RandomState(seed)`; when E > 1 and the last epoch would be under 80% of an
  epoch's samples, the last epoch is shuffled on its own and appended, so the short tail is
  not spread over the whole run.
- sample_index [num_samples + 1, 2]: (position in document_index, token offset) where each
  sample starts; sample k is `seq_len + 1` tokens of the shuffled concatenation, consecutive
  samples sharing one token (the last label of one is the first input of the next).
- shuffle_index: a permutation of the samples from the same RNG stream (the separate last
  epoch shuffled separately).

The indices are cached as `.npy` files beside the shard, keyed by everything they depend on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np

from tokenmill.errors import TokenmillError
from tokenmill.infra.atomic import atomic_path
from tokenmill.tokenize import DEFAULT_SPLIT
from tokenmill.tokenize.indexed import IndexedDataset, file_checksum, idx_path

SPLITS = ("train", "valid", "test")
# Megatron's threshold under which the last epoch is shuffled separately.
SEPARATE_LAST_EPOCH_THRESHOLD = 0.80
CACHE_VERSION = 2  # 2: sample_index int32 where it fits, as Megatron's


class SampleDataset(ABC):
    """A map-style dataset of training samples: `ds[i]` is an int64 array of seq_len + 1 tokens."""

    seq_len: int

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, i: int) -> np.ndarray: ...


def parse_split(ratios: str) -> list[float]:
    """ "969,30,1" -> normalised train/valid/test fractions (Megatron's parsing)."""
    values = [float(v) for v in re.findall(r"[.0-9]+", ratios)]
    if not values or len(values) > 3 or not re.fullmatch(r"\s*[.0-9]+(\s*[,/]\s*[.0-9]+)*\s*", ratios):
        raise TokenmillError(f"split ratios {ratios!r} must be up to three non-negative numbers like {DEFAULT_SPLIT!r}")
    values += [0.0] * (3 - len(values))
    weights = np.array(values, dtype=np.float64)
    if weights.sum() <= 0:
        raise TokenmillError(f"split ratios {ratios!r} add up to zero")
    return (weights / weights.sum()).tolist()


def split_document_range(num_documents: int, ratios: str, split: str) -> tuple[int, int] | None:
    """[begin, end) of the split's documents, or None for a split with zero weight.

    Cumulative bookends rounded to the nearest document, as Megatron's builder does."""
    if split not in SPLITS:
        raise TokenmillError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    fractions = parse_split(ratios)
    bookends = functools.reduce(lambda acc, w: acc + [acc[-1] + w], fractions, [0])
    which = SPLITS.index(split)
    low, high = bookends[which], bookends[which + 1]
    if high <= low:
        return None
    return int(round(low * float(num_documents))), int(round(high * float(num_documents)))


def num_epochs_for(tokens_per_epoch: int, num_samples: int, seq_len: int) -> int:
    """Smallest E with E * tokens_per_epoch >= num_samples * seq_len + 1."""
    needed = num_samples * seq_len + 1
    return max(1, -(-needed // tokens_per_epoch))


# MT19937 as NumPy's legacy RandomState runs it (numpy/random/src/mt19937/mt19937.c).
_MT_N = 624
_MT_M = 397
_MT_MATRIX_A = np.uint64(0x9908B0DF)
_MT_UPPER = np.uint64(0x80000000)
_MT_LOWER = np.uint64(0x7FFFFFFF)


@numba.njit(cache=True)
def _mt_regenerate(key):  # pragma: no cover - compiled
    for i in range(_MT_N):
        y = (np.uint64(key[i]) & _MT_UPPER) | (np.uint64(key[(i + 1) % _MT_N]) & _MT_LOWER)
        mag = _MT_MATRIX_A if y & np.uint64(1) else np.uint64(0)
        key[i] = np.uint32(np.uint64(key[(i + _MT_M) % _MT_N]) ^ (y >> np.uint64(1)) ^ mag)


@numba.njit(cache=True)
def _mt_shuffle(x, key, pos):  # pragma: no cover - compiled
    """`RandomState.shuffle(x)` for a 1-D array of fewer than 2**32 items, bit for bit: from the
    last position down, swap with `random_interval(i)` (the smallest all-ones mask >= i, 32-bit
    draws rejected above i). Returns the generator's new position; `key` is updated in place."""
    for i in range(x.shape[0] - 1, 0, -1):
        mask = np.uint64(i)
        mask |= mask >> np.uint64(1)
        mask |= mask >> np.uint64(2)
        mask |= mask >> np.uint64(4)
        mask |= mask >> np.uint64(8)
        mask |= mask >> np.uint64(16)
        while True:
            if pos == _MT_N:
                _mt_regenerate(key)
                pos = 0
            y = np.uint64(key[pos])
            pos += 1
            y ^= y >> np.uint64(11)
            y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
            y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
            y ^= y >> np.uint64(18)
            j = y & mask
            if j <= np.uint64(i):
                break
        k = np.int64(j)
        tmp = x[i]
        x[i] = x[k]
        x[k] = tmp
    return pos


def legacy_shuffle(rng: np.random.RandomState, x: np.ndarray) -> None:
    """`rng.shuffle(x)` for a 1-D array, with the same result and the same generator state after
    it, compiled: NumPy's loop makes an indirect call per draw and a memcpy per move, which was
    most of the index build (Megatron shuffles with NumPy)."""
    state = rng.get_state(legacy=True)
    if state[0] != "MT19937" or x.ndim != 1 or x.shape[0] - 1 > 0xFFFFFFFF:
        rng.shuffle(x)  # 64-bit draws: NumPy's own path
        return
    key = np.array(state[1], dtype=np.uint32)
    pos = _mt_shuffle(x, key, int(state[2]))
    rng.set_state((state[0], key, pos, *state[3:]))


def build_document_index(
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_last: bool
) -> np.ndarray:
    if not separate_last or num_epochs == 1:
        index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        legacy_shuffle(rng, index)
        return index
    first = build_document_index(documents, num_epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


@numba.njit(cache=True)
def _sample_index_kernel(sizes, document_index, seq_len, out):  # pragma: no cover - compiled
    """out[k] = (position in document_index, offset) of token k * seq_len of the shuffled
    concatenation, for k <= num_samples = out.shape[0] - 1 (which must lie inside it).

    Megatron walks document by document with a branch on whether the sample ends inside it
    (a mispredict, and a stalled random read of `sizes`, per document). Here each document
    only writes the first sample start at or after its own start, ceil(start / seq_len): the
    last document to write a k is the one holding token k * seq_len (later ones start after
    it), and a k no document wrote lies inside a long document, one seq_len past k - 1."""
    num_samples = out.shape[0] - 1
    for k in range(num_samples + 1):
        out[k, 0] = -1
    # ceil(start / seq_len) by a float multiply and one correction: exact below 2**51 tokens,
    # without an integer division per document.
    inverse = 1.0 / seq_len
    start = np.int64(0)
    for i in range(document_index.shape[0]):
        k = np.int64(start * inverse)
        k += k * seq_len < start
        if k <= num_samples:
            out[k, 0] = i
            out[k, 1] = k * seq_len - start
        start += sizes[document_index[i]]
    out[0, 0] = 0  # Megatron's first sample starts at (0, 0) even after empty documents
    out[0, 1] = 0
    for k in range(1, num_samples + 1):
        if out[k, 0] < 0:
            out[k, 0] = out[k - 1, 0]
            out[k, 1] = out[k - 1, 1] + seq_len


def build_sample_index(
    sizes: np.ndarray, document_index: np.ndarray, seq_len: int, num_epochs: int, tokens_per_epoch: int
) -> np.ndarray:
    """[num_samples + 1, 2] starts of samples of seq_len + 1 tokens (last partial sample dropped);
    int32 when the positions and offsets fit, as Megatron's `build_sample_idx` chooses."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_len
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    fits = max(document_index.shape[0], int(sizes.max())) <= np.iinfo(np.int32).max
    out = np.empty((num_samples + 1, 2), dtype=np.int32 if fits else np.int64)
    _sample_index_kernel(sizes, document_index, seq_len, out)
    return out


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    legacy_shuffle(rng, first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    legacy_shuffle(rng, last)
    return np.concatenate((first, last))


@dataclass(frozen=True)
class GPTIndexConfig:
    seq_len: int
    num_samples: int
    seed: int
    split: str = "train"
    split_ratios: str = DEFAULT_SPLIT


def build_indices(
    sizes: np.ndarray, documents: np.ndarray, config: GPTIndexConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document_index, sample_index, shuffle_index) for the given documents of a shard."""
    seq_len = config.seq_len
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64))
    if tokens_per_epoch < 2:
        raise TokenmillError(f"the {config.split} split has {tokens_per_epoch} tokens: too few to make a sample")
    num_epochs = num_epochs_for(tokens_per_epoch, config.num_samples, seq_len)
    separate_last = False
    samples_before_last = 0
    if num_epochs > 1:
        samples_before_last = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_len
        samples_from_last = config.num_samples - samples_before_last
        samples_per_epoch = (tokens_per_epoch - 1) // seq_len
        separate_last = samples_from_last < int(SEPARATE_LAST_EPOCH_THRESHOLD * samples_per_epoch)
    rng = np.random.RandomState(config.seed)
    document_index = build_document_index(documents, num_epochs, rng, separate_last)
    sample_index = build_sample_index(sizes, document_index, seq_len, num_epochs, tokens_per_epoch)
    total = sample_index.shape[0] - 1
    shuffle_index = build_shuffle_index(samples_before_last if separate_last else total, total, rng)
    return document_index, sample_index, shuffle_index


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _process_group() -> Any:
    """`torch.distributed` when a process group is up, else None. torch is not imported for
    this: a process that set up a group has imported it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def load_or_build_shared(
    paths: Sequence[Path], build: Callable[[], tuple[np.ndarray, ...]]
) -> tuple[tuple[np.ndarray, ...], bool]:
    """Index arrays memory-mapped from their cache files, or built by `build` and saved (each
    file atomically). Returns (arrays, whether this process built them).

    Under torch.distributed, as Megatron's builder does: rank 0 loads or builds and saves,
    every rank then meets at one barrier (unconditionally, so that the ranks' barrier counts
    agree whatever each one saw on disk), and the other ranks memory-map rank 0's files. A rank
    that still finds no files after the barrier (a cache folder not shared with rank 0) builds
    them itself."""

    def load() -> tuple[np.ndarray, ...] | None:
        if not all(p.is_file() for p in paths):
            return None
        return tuple(np.load(p, mmap_mode="r") for p in paths)

    def build_and_save() -> tuple[np.ndarray, ...]:
        arrays = build()
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for path, array in zip(paths, arrays):
            _save_npy(path, array)
        return arrays

    dist = _process_group()
    if dist is not None and dist.get_rank() != 0:
        dist.barrier()
        loaded = load()
        return (loaded, False) if loaded is not None else (build_and_save(), True)
    loaded = load()
    result = (loaded, False) if loaded is not None else (build_and_save(), True)
    if dist is not None:
        dist.barrier()
    return result


class GPTDataset(SampleDataset):
    """Samples of `seq_len + 1` tokens from one shard's split, built and cached as Megatron does."""

    INDEX_NAMES = ("document_index", "sample_index", "shuffle_index")

    def __init__(
        self,
        prefix: str | Path,
        *,
        seq_len: int,
        num_samples: int,
        seed: int,
        split: str = "train",
        split_ratios: str = DEFAULT_SPLIT,
        cache: bool = True,
    ) -> None:
        if seq_len < 2:
            raise TokenmillError(f"seq_len must be at least 2, got {seq_len}")
        if num_samples < 1:
            raise TokenmillError(f"num_samples must be at least 1, got {num_samples}")
        self.prefix = Path(prefix)
        self.indexed = IndexedDataset(prefix)
        self.seq_len = seq_len
        self.config = GPTIndexConfig(seq_len, num_samples, seed, split, split_ratios)
        bounds = split_document_range(len(self.indexed), split_ratios, split)
        if bounds is None or bounds[1] <= bounds[0]:
            raise TokenmillError(
                f"the {split} split of {self.prefix} is empty ({len(self.indexed)} documents, ratios {split_ratios!r})"
            )
        self.document_range = bounds
        self.build_seconds = 0.0
        self.built = False  # whether this process built the indices (else: read from the cache)
        self.document_index, self.sample_index, self.shuffle_index = self._load_or_build(cache)

    def _cache_paths(self) -> dict[str, Path]:
        description = {
            "class": "GPTDataset",
            "version": CACHE_VERSION,
            "idx_digest": file_checksum(idx_path(self.prefix)),
            **asdict(self.config),
            "documents": list(self.document_range),
        }
        key = hashlib.md5(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
        self.cache_key = key
        cache_dir = Path(f"{self.prefix}.cache")
        return {name: cache_dir / f"{key}-{self.config.split}-{name}.npy" for name in self.INDEX_NAMES}

    def _load_or_build(self, cache: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            started = time.perf_counter()
            documents = np.arange(*self.document_range, dtype=np.int32)
            # Reading the lengths into memory once beats random page faults in the sample loop.
            sizes = np.array(self.indexed.sequence_lengths, dtype=np.int32)
            indices = build_indices(sizes, documents, self.config)
            self.build_seconds = time.perf_counter() - started
            return indices

        paths = self._cache_paths()
        if not cache:
            self.built = True
            return build()
        indices, self.built = load_or_build_shared([paths[name] for name in self.INDEX_NAMES], build)
        return indices  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        k = int(self.shuffle_index[i])
        doc_begin, offset_begin = (int(v) for v in self.sample_index[k])
        doc_end, offset_end = (int(v) for v in self.sample_index[k + 1])
        if doc_begin == doc_end:
            tokens = self.indexed.get(int(self.document_index[doc_begin]), offset_begin, offset_end - offset_begin + 1)
            return tokens.astype(np.int64)
        parts = [self.indexed.get(int(self.document_index[doc_begin]), offset_begin)]
        for position in range(doc_begin + 1, doc_end):
            parts.append(self.indexed[int(self.document_index[position])])
        parts.append(self.indexed.get(int(self.document_index[doc_end]), 0, offset_end + 1))
        return np.concatenate(parts).astype(np.int64)
