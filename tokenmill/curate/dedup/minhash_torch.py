"""The MinHash permutations of the 32-bit schemes (affine32, fast) on a torch device: the
`min over shingles of (a*h + b) mod 2**32` of `hashing.minhash_batch32`, bit for bit, on a
GPU when there is one (`--minhash-device cuda`).

The shingles' base hashes are computed on the CPU (`hashing.base_hashes32_batch`: SHA-1 or
XXH64 per shingle); the device does the num_perm affine maps of every shingle and the minimum
per document, which is where the CPU spends its time. torch has no uint32 arithmetic, so the
maps run in int64 with masks, split so that no product overflows.
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
# Shingles per step: 65536 x 128 permutations of int64 is 64 MiB of temporaries.
CHUNK_SHINGLES = 1 << 16


def affine32_min(hashes: np.ndarray, n_shingles: np.ndarray, a: np.ndarray, b: np.ndarray, device: str) -> np.ndarray:
    """uint32[n_docs, num_perm]: for each document, the minimum over its shingles' base hashes
    `hashes` (uint64 < 2**32, documents one after the other, `n_shingles` each) of
    `(a * h + b) mod 2**32`; 2**32 - 1 for a document without shingles."""
    dev = torch.device(device)
    n_docs, num_perm = len(n_shingles), len(a)
    a_t = torch.from_numpy(a.astype(np.int64)).to(dev)
    b_t = torch.from_numpy(b.astype(np.int64)).to(dev)
    h_all = torch.from_numpy(hashes.astype(np.int64)).to(dev)
    docs = torch.repeat_interleave(torch.arange(n_docs, device=dev), torch.from_numpy(n_shingles).to(dev))
    out = torch.full((n_docs, num_perm), MASK32, dtype=torch.int64, device=dev)
    for start in range(0, len(h_all), CHUNK_SHINGLES):
        h = h_all[start : start + CHUNK_SHINGLES, None]
        # a*h mod 2**32 with h = hi * 2**16 + lo: a*lo < 2**48 and (a*hi mod 2**16) * 2**16
        # < 2**32, so nothing exceeds int64 (a*h itself could reach 2**64).
        low, high = h & 0xFFFF, h >> 16
        values = (a_t * low + (((a_t * high) & 0xFFFF) << 16) + b_t) & MASK32
        index = docs[start : start + CHUNK_SHINGLES, None].expand(-1, num_perm)
        out.scatter_reduce_(0, index, values, reduce="amin", include_self=True)
    return out.cpu().numpy().astype(np.uint32)
