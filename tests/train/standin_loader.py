"""A stand-in for `tokenmill.tokenize.loader` with the same API, used by these tests only when
the real loader is not importable (it is developed at the same time). It reads the same
Megatron `.bin/.idx` shards, but samples windows more simply than Megatron's index."""

from __future__ import annotations

import numpy as np
import torch

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


class SampleDataset:
    def __init__(self, tokens: np.ndarray, seq_len: int, num_samples: int, seed: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        starts = np.arange(0, len(tokens) - seq_len - 1, seq_len)
        epochs = -(-num_samples // len(starts))
        rng = np.random.RandomState(seed)
        self.order = np.concatenate([rng.permutation(starts) for _ in range(epochs)])[:num_samples]

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> np.ndarray:
        s = self.order[i]
        return np.asarray(self.tokens[s : s + self.seq_len + 1], dtype=np.int64)


def build_dataset(data, *, seq_len, num_samples, seed, split="train", split_ratios="969,30,1"):
    with open(f"{data}.idx", "rb") as handle:
        header = handle.read(18)
    tokens = np.memmap(f"{data}.bin", dtype=DTYPES[header[17]], mode="r")
    ratios = np.array([float(r) for r in split_ratios.split(",")])
    bounds = np.concatenate([[0], np.cumsum(ratios / ratios.sum())]) * len(tokens)
    index = ["train", "valid", "test"].index(split)
    part = tokens[int(bounds[index]) : int(bounds[index + 1])]
    return SampleDataset(part, seq_len, num_samples, seed)


class SampleStream:
    def __init__(self, dataset, *, dp_rank, dp_size, consumed_samples=0) -> None:
        self.dataset, self.dp_rank, self.dp_size = dataset, dp_rank, dp_size
        self.consumed_samples = consumed_samples

    def next_global_batch(self, global_batch_size: int) -> torch.Tensor:
        local = global_batch_size // self.dp_size
        start = self.consumed_samples + self.dp_rank * local
        rows = [self.dataset[(start + i) % len(self.dataset)] for i in range(local)]
        self.consumed_samples += global_batch_size
        return torch.from_numpy(np.stack(rows))
