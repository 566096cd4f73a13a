"""What the trainer reads: a sample dataset (one shard or a blend) and a resumable,
data-parallel stream of global batches over it.

The stream is a pure function of `consumed_samples`: global batch b covers samples
`[consumed, consumed + global_batch_size)` of the dataset, and rank r takes the contiguous
slice `[r * local, (r + 1) * local)` of it. Resuming with the saved `consumed_samples` therefore
gives exactly the samples an uninterrupted run would have seen, whatever the batch ramp-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.tokenize import DEFAULT_SPLIT
from tokenmill.tokenize.blend import BlendedDataset, BlendEntry, load_blend_file, parse_blend
from tokenmill.tokenize.gpt_dataset import GPTDataset, SampleDataset
from tokenmill.tokenize.indexed import cached_shard, idx_path

__all__ = ["SampleDataset", "SampleStream", "build_dataset", "resolve_blend"]


def resolve_blend(data: str | Path | list[dict[str, Any]]) -> list[BlendEntry] | str:
    """A shard prefix (returned as a string), or a blend (file or list) as checked entries."""
    if isinstance(data, (list, tuple)):
        return parse_blend(list(data))
    location = storage.Location(data)
    if not location.is_local:
        url = location.path
        if url.endswith((".yaml", ".yml", ".json")) and not storage.isfile(f"{url}.idx"):
            return load_blend_file(url)
        return cached_shard(url)
    path = Path(data)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file() and not idx_path(path).is_file():
        return load_blend_file(path)
    if idx_path(path).is_file():
        return str(path)
    if path.suffix in (".yaml", ".yml", ".json"):
        raise TokenmillError(f"blend file not found: {path}")
    raise TokenmillError(
        f"token shard not found: {idx_path(path)} (give a shard prefix, a blend file or a list of {{prefix, weight}})"
    )


def build_dataset(
    data: str | Path | list[dict[str, Any]],
    *,
    seq_len: int,
    num_samples: int,
    seed: int,
    split: str = "train",
    split_ratios: str = DEFAULT_SPLIT,
    same_source_order: bool = False,
) -> SampleDataset:
    """Samples of `seq_len + 1` tokens from a shard prefix, a blend file (YAML/JSON list of
    {prefix, weight}) or such a list. At least `num_samples` samples; indices are cached.
    `same_source_order`: a blend reads each source's samples in an order that does not depend
    on the weights (`BlendedDataset`)."""
    resolved = resolve_blend(data)
    options = dict(seq_len=seq_len, num_samples=num_samples, seed=seed, split=split, split_ratios=split_ratios)
    if isinstance(resolved, str):
        return GPTDataset(resolved, **options)
    # Like Megatron, a weighted list is always a blend, even of one shard.
    return BlendedDataset(resolved, **options, same_source_order=same_source_order)


class SampleStream:
    """This data-parallel rank's slices of consecutive global batches."""

    def __init__(self, dataset: SampleDataset, *, dp_rank: int, dp_size: int, consumed_samples: int = 0) -> None:
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise TokenmillError(f"dp_rank {dp_rank} is not in [0, dp_size={dp_size})")
        if consumed_samples < 0:
            raise TokenmillError(f"consumed_samples must be >= 0, got {consumed_samples}")
        self.dataset = dataset
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.consumed_samples = consumed_samples

    def next_global_batch(self, global_batch_size: int):
        """A LongTensor [global_batch_size // dp_size, seq_len + 1]: this rank's rows of the next
        global batch. Advances `consumed_samples` by the whole global batch."""
        import torch

        if global_batch_size < 1 or global_batch_size % self.dp_size:
            raise TokenmillError(
                f"global batch size {global_batch_size} is not a positive multiple of the data-parallel size {self.dp_size}"
            )
        end = self.consumed_samples + global_batch_size
        if end > len(self.dataset):
            raise TokenmillError(
                f"the dataset has {len(self.dataset)} samples but the stream needs {end}; build it with a larger num_samples"
            )
        local = global_batch_size // self.dp_size
        start = self.consumed_samples + self.dp_rank * local
        rows = np.stack([self.dataset[i] for i in range(start, start + local)])
        self.consumed_samples = end
        return torch.from_numpy(rows.astype(np.int64, copy=False))
