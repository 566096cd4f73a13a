"""Batched MinHash signatures, bit-identical to `datasketch.MinHash` of the same scheme.

    hasher = MinHasher(num_perm=128, seed=1)       # the legacy scheme
    signatures = hasher.signatures(texts)          # uint64[n_docs, 128]
    datasketch.MinHash(128, seed=1, scheme="legacy").update_batch([s.encode() for s in python_shingles(t)])
        .hashvalues == signatures[i]               # for every document i

datasketch 2's default `MinHash(128, seed=1)` (no scheme) is the affine32 scheme: it equals
`MinHasher(128, 1, scheme="affine32")`, not the default `MinHasher`.

Schemes:
- "legacy" (default): datasketch 1.x, and 2.x with `scheme="legacy"`:
  SHA-1 first 4 bytes, `((a*h + b) mod 2**61-1) & 2**32-1` with uint64 wrap-around.
- "affine32": datasketch 2.x's default scheme (`MinHash(num_perm, seed)` with no scheme):
  SHA-1 first 4 bytes, MurmurHash3 fmix32 pre-mix, `(a*h + b) mod 2**32`.
- "fast": XXH64 folded to 32 bits + affine maps mod 2**32 in 32-bit SIMD lanes: faster, same
  estimator quality,
  but NOT comparable with datasketch signatures (an index records its scheme and refuses a
  run in another one).

`device`: "numba" (default) runs the permutations in compiled CPU loops; a torch device
("cpu", "cuda", "cuda:N") runs them there (`minhash_torch`), with the same signatures bit for
bit, for the 32-bit schemes (affine32, fast).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tokenmill.curate.dedup.hashing import (
    AFFINE32,
    FAST,
    LEGACY,
    MAX_HASH_32,
    MERSENNE_61,
    base_hashes32_batch,
    minhash_batch,
    minhash_batch32,
    shingle_hashes_batch,
)
from tokenmill.curate.dedup.shingles import ShingleConfig, encode_batch
from tokenmill.errors import ConfigError


def datasketch_permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's (a, b): drawn interleaved a0, b0, a1, b1, ... from RandomState(seed)."""
    gen = np.random.RandomState(seed)
    pairs = [
        (gen.randint(1, MERSENNE_61, dtype=np.uint64), gen.randint(0, MERSENNE_61, dtype=np.uint64))
        for _ in range(num_perm)
    ]
    params = np.array(pairs, dtype=np.uint64).T
    return np.ascontiguousarray(params[0]), np.ascontiguousarray(params[1])


def affine32_permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch 2.x affine32: all odd a's (uint32) drawn first, then all b's."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a.astype(np.uint64), b.astype(np.uint64)


def fast_permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Odd 32-bit multipliers and random offsets (affine maps mod 2**32 of a folded XXH64)."""
    gen = np.random.default_rng(seed)
    a = gen.integers(0, 2**31, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = gen.integers(0, 2**32, size=num_perm, dtype=np.uint64)
    return a, b


SCHEMES = {
    "legacy": (LEGACY, datasketch_permutations),
    "affine32": (AFFINE32, affine32_permutations),
    "fast": (FAST, fast_permutations),
}


@dataclass
class MinHasher:
    num_perm: int = 128
    seed: int = 1
    scheme: str = "legacy"
    shingles: ShingleConfig = field(default_factory=ShingleConfig)
    device: str = "numba"

    def __post_init__(self) -> None:
        if self.num_perm < 2:
            raise ConfigError(f"num_perm must be at least 2, got {self.num_perm}")
        if self.scheme not in SCHEMES:
            raise ConfigError(f"unknown MinHash scheme {self.scheme!r}; choose one of {', '.join(SCHEMES)}")
        if self.device != "numba" and self.scheme == "legacy":
            raise ConfigError(
                f"MinHash device {self.device}: the legacy scheme (mod 2**61-1) runs with numba only; "
                "use scheme affine32 or fast on a torch device"
            )
        self._a, self._b = SCHEMES[self.scheme][1](self.num_perm, self.seed)

    def signatures_with_counts(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """Signatures (uint64[n, num_perm], values < 2**32) and shingle counts (int64[n]).
        A document without shingles keeps the all-MAX signature, as datasketch does."""
        batch = encode_batch(texts, self.shingles)
        n = batch.n_docs
        out = np.empty((n, self.num_perm), dtype=np.uint64)
        counts = np.zeros(n, dtype=np.int64)
        if n and self.scheme == "legacy":
            minhash_batch(
                batch.buf,
                batch.offsets,
                batch.kinds,
                self.shingles.ngram,
                self.shingles.char_ngram,
                self._a,
                self._b,
                LEGACY,
                np.uint64(self.seed),
                out,
                counts,
            )
        elif n and self.device != "numba":
            from tokenmill.curate.dedup.minhash_torch import affine32_min  # torch: only for this path

            hashes = base_hashes32_batch(
                batch.buf,
                batch.offsets,
                batch.kinds,
                self.shingles.ngram,
                self.shingles.char_ngram,
                SCHEMES[self.scheme][0],
                np.uint64(self.seed),
                counts,
            )
            out[:] = affine32_min(hashes, counts, self._a, self._b, self.device)
        elif n:
            out32 = np.empty((n, self.num_perm), dtype=np.uint32)
            minhash_batch32(
                batch.buf,
                batch.offsets,
                batch.kinds,
                self.shingles.ngram,
                self.shingles.char_ngram,
                self._a.astype(np.uint32),
                self._b.astype(np.uint32),
                SCHEMES[self.scheme][0],
                np.uint64(self.seed),
                out32,
                counts,
            )
            out[:] = out32
        return out, counts

    def signatures(self, texts) -> np.ndarray:
        return self.signatures_with_counts(texts)[0]


def shingle_sets(texts, config: ShingleConfig, seed: int = 0) -> list[np.ndarray]:
    """The set of 64-bit shingle hashes of each document (sorted, unique): the exact Jaccard
    of two documents is the Jaccard of these sets up to a 2**-64 collision chance."""
    batch = encode_batch(texts, config)
    if not batch.n_docs:
        return []
    hashes, doc_offsets, _, _ = shingle_hashes_batch(
        batch.buf, batch.offsets, batch.kinds, config.ngram, config.char_ngram, np.uint64(seed)
    )
    return [np.unique(hashes[doc_offsets[i] : doc_offsets[i + 1]]) for i in range(batch.n_docs)]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted unique arrays."""
    if a.size == 0 and b.size == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (a.size + b.size - inter)


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    return float(np.mean(sig_a == sig_b))


__all__ = [
    "MAX_HASH_32",
    "MinHasher",
    "datasketch_permutations",
    "estimated_jaccard",
    "fast_permutations",
    "jaccard",
    "shingle_sets",
]
