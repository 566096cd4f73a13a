"""Blend several shards by weight with Megatron-Core's greedy blending (`BlendedDataset`).

For a request of N samples with normalised weights w:
- dataset j is built with `ceil(ceil(N * w[j]) * 1.005)` samples (Megatron's 0.5% surplus),
  or, with `same_source_order`, with `ceil(N * 1.005)` whatever its weight, so that its sample
  order (which depends on the number of samples built) is the same in every blend of it;
- the blend has `sum_j ceil(N * w[j])` samples (>= N; Megatron-Core >= 0.10 sizes it so);
- sample i goes to the dataset with the largest error `w[j] * max(i, 1) - count[j]` (ties to
  the lowest index), and is that dataset's sample `count[j]`.
The two index arrays are cached as `.npy` beside the first shard.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np

from tokenmill.errors import TokenmillError, YamlSyntaxError
from tokenmill.infra import storage
from tokenmill.tokenize import DEFAULT_SPLIT
from tokenmill.tokenize.gpt_dataset import CACHE_VERSION, GPTDataset, SampleDataset, load_or_build_shared
from tokenmill.tokenize.indexed import bin_path, cached_shard, idx_path

MID_LEVEL_SURPLUS = 0.005


@dataclass(frozen=True)
class BlendEntry:
    prefix: str
    weight: float


def normalize_weights(weights: list[float]) -> list[float]:
    w = np.array(weights, dtype=np.float64)
    return (w / w.sum()).tolist()


def parse_blend(data: Any, *, base_dir: Path | str | None = None, where: str = "blend") -> list[BlendEntry]:
    """Check a blend given as a list of {prefix, weight}; relative prefixes are resolved
    against `base_dir` (the blend file's directory)."""
    if isinstance(data, dict) and "blend" in data:
        data = data["blend"]
    if not isinstance(data, list) or not data:
        raise TokenmillError(f"{where}: a blend is a non-empty list of {{prefix, weight}} entries")
    entries = []
    for position, item in enumerate(data):
        if not isinstance(item, dict) or "prefix" not in item:
            raise TokenmillError(f"{where}: entry {position} lacks the key 'prefix'")
        unknown = set(item) - {"prefix", "weight"}
        if unknown:
            raise TokenmillError(f"{where}: entry {position} has unknown key(s) {', '.join(sorted(unknown))}")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise TokenmillError(
                f"{where}: entry {position} ({item['prefix']}) has weight {weight!r}; weights must be positive numbers"
            )
        name = str(item["prefix"])
        location = storage.Location(name)
        if base_dir is not None and location.is_local and not Path(name).is_absolute():
            location = storage.Location(base_dir).join(name)  # beside the blend file, wherever it is
        if not location.is_local:
            # A shard on object storage (or relative to a blend file there): read from the cache.
            entries.append(BlendEntry(cached_shard(location.path), float(weight)))
            continue
        prefix = location.local_path
        for path in (idx_path(prefix), bin_path(prefix)):
            if not path.is_file():
                raise TokenmillError(f"{where}: entry {position}: token shard file not found: {path}")
        entries.append(BlendEntry(str(prefix), float(weight)))
    return entries


def load_blend_file(path: str | Path) -> list[BlendEntry]:
    """A YAML or JSON file holding the list of {prefix, weight}."""
    import yaml

    if not storage.isfile(path):
        raise TokenmillError(f"blend file not found: {path}")
    text = storage.read_text(path)
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise YamlSyntaxError(str(path), error) from None
    except json.JSONDecodeError as error:
        raise TokenmillError(f"cannot parse blend file {path}: {error}") from None
    return parse_blend(data, base_dir=storage.parent(path), where=str(path))


@numba.njit(cache=True)
def _blending_kernel(weights, size):  # pragma: no cover - compiled
    n = weights.shape[0]
    dataset_index = np.empty(size, dtype=np.int16)
    dataset_sample_index = np.empty(size, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    for i in range(size):
        scale = max(float(i), 1.0)
        best = 0
        best_error = weights[0] * scale - counts[0]
        for j in range(1, n):
            error = weights[j] * scale - counts[j]
            if error > best_error:
                best_error = error
                best = j
        dataset_index[i] = best
        dataset_sample_index[i] = counts[best]
        counts[best] += 1
    return dataset_index, dataset_sample_index


def build_blending_indices(weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index int16, dataset_sample_index int64) of a greedy blend of `size` samples."""
    if len(weights) >= 32767:
        raise TokenmillError("a blend holds at most 32766 datasets")
    return _blending_kernel(np.asarray(weights, dtype=np.float64), int(size))


def blend_sizes(weights: list[float], num_samples: int, surplus: float = 0.0) -> list[int]:
    return [int(math.ceil(math.ceil(num_samples * w) * (1 + surplus))) for w in weights]


class BlendedDataset(SampleDataset):
    """Samples drawn from several `GPTDataset`s in the proportions of their weights."""

    def __init__(
        self,
        entries: list[BlendEntry],
        *,
        seq_len: int,
        num_samples: int,
        seed: int,
        split: str = "train",
        split_ratios: str = DEFAULT_SPLIT,
        cache: bool = True,
        same_source_order: bool = False,
    ) -> None:
        if not entries:
            raise TokenmillError("a blend needs at least one shard")
        self.entries = entries
        self.seq_len = seq_len
        self.weights = normalize_weights([e.weight for e in entries])
        # A source's shuffle depends on the samples it is built for: built for all N, blends
        # that differ only in weights read each source's samples in the same order.
        build_weights = [1.0] * len(entries) if same_source_order else self.weights
        build_sizes = blend_sizes(build_weights, num_samples, MID_LEVEL_SURPLUS)
        self.datasets = [
            GPTDataset(
                e.prefix, seq_len=seq_len, num_samples=n, seed=seed, split=split, split_ratios=split_ratios, cache=cache
            )
            for e, n in zip(entries, build_sizes)
        ]
        self.size = sum(blend_sizes(self.weights, num_samples))
        # Megatron normalises once in the builder and again in BlendedDataset; doing the same
        # keeps the floating-point weights, and so every tie-break, identical.
        blend_weights = normalize_weights(self.weights)
        self.dataset_index, self.dataset_sample_index = self._load_or_build(blend_weights, cache)
        counts = np.bincount(self.dataset_index, minlength=len(self.datasets))
        for dataset, count, entry in zip(self.datasets, counts, entries):
            if count > len(dataset):
                raise TokenmillError(
                    f"the blend draws {count} samples from {entry.prefix}, which has only {len(dataset)}"
                )

    def _load_or_build(self, weights: list[float], cache: bool) -> tuple[np.ndarray, np.ndarray]:
        if not cache:
            return build_blending_indices(weights, self.size)
        description = {
            "class": "BlendedDataset",
            "version": CACHE_VERSION,
            "datasets": [d.cache_key for d in self.datasets],
            "weights": weights,
            "size": self.size,
        }
        key = hashlib.md5(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
        cache_dir = Path(f"{self.entries[0].prefix}.cache")
        paths = [cache_dir / f"{key}-blend-dataset_index.npy", cache_dir / f"{key}-blend-dataset_sample_index.npy"]
        (dataset_index, dataset_sample_index), _ = load_or_build_shared(
            paths, lambda: build_blending_indices(weights, self.size)
        )
        return dataset_index, dataset_sample_index

    def __len__(self) -> int:
        return int(self.size)

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} out of range for {self.size} samples")
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]
