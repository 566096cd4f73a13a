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
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path

import numba
import numpy as np

from tokenmill.errors import TokenmillError
from tokenmill.infra.atomic import atomic_path
from tokenmill.tokenize.indexed import IndexedDataset, file_checksum, idx_path

SPLITS = ("train", "valid", "test")
# Megatron's threshold under which the last epoch is shuffled separately.
SEPARATE_LAST_EPOCH_THRESHOLD = 0.80
CACHE_VERSION = 1


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
        raise TokenmillError(f"split ratios {ratios!r} must be up to three non-negative numbers like '969,30,1'")
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


def build_document_index(
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_last: bool
) -> np.ndarray:
    if not separate_last or num_epochs == 1:
        index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(documents, num_epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


@numba.njit(cache=True)
def _sample_index_kernel(sizes, document_index, seq_len, num_samples, extra):  # pragma: no cover - compiled
    out = np.empty((num_samples + 1, 2), dtype=np.int64)
    doc_pos = 0
    offset = 0
    out[0, 0] = 0
    out[0, 1] = 0
    last = document_index.shape[0] - 1
    for k in range(1, num_samples + 1):
        remaining = seq_len + extra
        while remaining != 0:
            doc_length = sizes[document_index[doc_pos]] - offset
            remaining -= doc_length
            if remaining <= 0:
                # The sample ends inside this document; the next one starts on its last token.
                offset += remaining + doc_length - extra
                remaining = 0
            else:
                if doc_pos == last:
                    offset = sizes[document_index[doc_pos]] - extra
                    break
                doc_pos += 1
                offset = 0
        out[k, 0] = doc_pos
        out[k, 1] = offset
    return out


def build_sample_index(
    sizes: np.ndarray, document_index: np.ndarray, seq_len: int, num_epochs: int, tokens_per_epoch: int
) -> np.ndarray:
    """[num_samples + 1, 2] starts of samples of seq_len + 1 tokens (last partial sample dropped)."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_len
    return _sample_index_kernel(np.ascontiguousarray(sizes, dtype=np.int32), document_index, seq_len, num_samples, 1)


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


@dataclass(frozen=True)
class GPTIndexConfig:
    seq_len: int
    num_samples: int
    seed: int
    split: str = "train"
    split_ratios: str = "969,30,1"


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
        split_ratios: str = "969,30,1",
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
        paths = self._cache_paths()
        if not cache:
            paths = {}
        if paths and all(p.is_file() for p in paths.values()):
            return tuple(np.load(paths[name], mmap_mode="r") for name in self.INDEX_NAMES)  # type: ignore[return-value]
        started = time.perf_counter()
        documents = np.arange(*self.document_range, dtype=np.int32)
        # Reading the lengths into memory once beats random page faults in the sample loop.
        sizes = np.array(self.indexed.sequence_lengths, dtype=np.int32)
        indices = build_indices(sizes, documents, self.config)
        self.build_seconds = time.perf_counter() - started
        if paths:
            next(iter(paths.values())).parent.mkdir(parents=True, exist_ok=True)
            for name, array in zip(self.INDEX_NAMES, indices):
                _save_npy(paths[name], array)
        return indices

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
