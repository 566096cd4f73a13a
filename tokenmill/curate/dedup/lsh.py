"""LSH banding: bands x rows from a Jaccard threshold (datasketch's rule) and candidate pairs
from documents that share a band key.

Candidates come from a Dask shuffle of the long table (key, uid): every document contributes
one row per band, rows with equal keys meet in one partition, and each bucket becomes edges
there. Nothing is gathered into one process; a partition holds ~1/npartitions of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
from numba import njit

from tokenmill.curate.dedup.hashing import band_keys
from tokenmill.errors import ConfigError


def _false_positive_area(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad

    return quad(lambda s: 1 - (1 - s ** float(r)) ** float(b), 0.0, threshold)[0]


def _false_negative_area(threshold: float, b: int, r: int) -> float:
    from scipy.integrate import quad

    return quad(lambda s: 1 - (1 - (1 - s ** float(r)) ** float(b)), threshold, 1.0)[0]


@lru_cache(maxsize=64)
def optimal_bands_rows(
    threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5
) -> tuple[int, int]:
    """datasketch `MinHashLSH._optimal_param`: over b in 1..n, r in 1..n//b, minimise the
    weighted areas of false positives and false negatives; the first minimum wins."""
    if not 0.0 < threshold < 1.0:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold}")
    best = (float("inf"), (0, 0))
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            error = fp_weight * _false_positive_area(threshold, b, r) + fn_weight * _false_negative_area(
                threshold, b, r
            )
            if error < best[0]:
                best = (error, (b, r))
    return best[1]


@dataclass(frozen=True)
class LSHParams:
    bands: int
    rows: int

    @classmethod
    def resolve(cls, num_perm: int, threshold: float, bands: int | None = None, rows: int | None = None) -> LSHParams:
        if (bands is None) != (rows is None):
            raise ConfigError("give both --bands and --rows, or neither (then they follow from --threshold)")
        if bands is None:
            bands, rows = optimal_bands_rows(threshold, num_perm)
        if bands < 1 or rows < 1 or bands * rows > num_perm:
            raise ConfigError(f"bands x rows = {bands} x {rows} does not fit num_perm={num_perm}")
        return cls(bands, rows)

    def keys(self, signatures: np.ndarray) -> np.ndarray:
        """uint64[n_docs, bands] keys of a uint64[n_docs, num_perm] signature matrix."""
        sig = np.ascontiguousarray(signatures, dtype=np.uint64)
        # The row width spelled out: -1 cannot be inferred for zero documents (an empty part).
        return band_keys(sig.view(np.uint8).reshape(sig.shape[0], sig.shape[1] * 8), self.bands, self.rows)


@njit(cache=True)
def _bucket_edges(keys, uids, all_pairs_limit):
    """keys/uids sorted by (key, uid). For each bucket of size k > 1: every pair when
    k <= all_pairs_limit (so that verification can look at each pair), else a star from the
    bucket's smallest uid (k-1 edges, same connectivity, linear size)."""
    n = keys.shape[0]
    count = 0
    i = 0
    while i < n:
        j = i + 1
        while j < n and keys[j] == keys[i]:
            j += 1
        k = j - i
        if k > 1:
            count += k * (k - 1) // 2 if k <= all_pairs_limit else k - 1
        i = j
    src = np.empty(count, dtype=np.int64)
    dst = np.empty(count, dtype=np.int64)
    e = 0
    i = 0
    while i < n:
        j = i + 1
        while j < n and keys[j] == keys[i]:
            j += 1
        k = j - i
        if k > 1:
            if k <= all_pairs_limit:
                for x in range(i, j):
                    for y in range(x + 1, j):
                        src[e] = uids[x]
                        dst[e] = uids[y]
                        e += 1
            else:
                for y in range(i + 1, j):
                    src[e] = uids[i]
                    dst[e] = uids[y]
                    e += 1
        i = j
    return src, dst


def bucket_edges(frame: pd.DataFrame, all_pairs_limit: int) -> pd.DataFrame:
    """Edges (u < v) of one shuffled partition of the (key, uid) table, duplicates removed."""
    if frame.empty:
        return pd.DataFrame({"u": np.zeros(0, np.int64), "v": np.zeros(0, np.int64)})
    order = np.lexsort((frame["uid"].to_numpy(), frame["key"].to_numpy()))
    keys = frame["key"].to_numpy()[order]
    uids = frame["uid"].to_numpy(np.int64)[order]
    src, dst = _bucket_edges(keys, uids, all_pairs_limit)
    edges = pd.DataFrame({"u": np.minimum(src, dst), "v": np.maximum(src, dst)})
    return edges.drop_duplicates(ignore_index=True)


def melt_bands(frame: pd.DataFrame, band_columns: list[str]) -> pd.DataFrame:
    """Wide (uid, b0..bB-1) -> long (key, uid)."""
    if frame.empty:
        return pd.DataFrame({"key": np.zeros(0, np.int64), "uid": np.zeros(0, np.int64)})
    keys = frame[band_columns].to_numpy(np.int64)
    uids = frame["uid"].to_numpy(np.int64)
    return pd.DataFrame({"key": keys.reshape(-1), "uid": np.repeat(uids, len(band_columns))})
