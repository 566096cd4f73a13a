"""Deduplication: exact (hash of normalized text) and fuzzy (MinHash LSH), on Dask.

Python API:
    from tokenmill.curate.dedup import DedupConfig, run_dedup, MinHasher
    run_dedup("normalized/", "dedup/", DedupConfig(threshold=0.8, verify=True))

CLI: `tokenmill curate dedup --input DIR --output DIR [--method fuzzy|exact] ...`
"""

from __future__ import annotations

import importlib
from typing import Any

from tokenmill.curate.dedup.options import DedupConfig
from tokenmill.curate.registry import Stage

# The Python API, loaded on first use (PEP 562): the stage's declaration above is all the
# command line and the recipe schema need, and the rest loads numba and pandas.
_LAZY = {
    "LSHParams": "lsh",
    "optimal_bands_rows": "lsh",
    "MinHasher": "minhash",
    "jaccard": "minhash",
    "shingle_sets": "minhash",
    "run_dedup": "pipeline",
    "ShingleConfig": "shingles",
    "TextNormalization": "shingles",
    "python_shingles": "shingles",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "DedupConfig",
    "LSHParams",
    "MinHasher",
    "STAGES",
    "ShingleConfig",
    "TextNormalization",
    "jaccard",
    "optimal_bands_rows",
    "python_shingles",
    "run_dedup",
    "shingle_sets",
]


REASONS = {
    "exact_duplicate": "the same normalized text as a kept document (kept_id) or one in the --index",
    "near_duplicate": "estimated Jaccard similarity >= {threshold} with a kept document of its cluster (kept_id)",
}


def _run(config: DedupConfig, input, output, **runner) -> dict:
    from tokenmill.curate.dedup.pipeline import run_dedup  # numba and pandas: loaded by a run

    return run_dedup(input, output, config, **runner)


_DESCRIPTION = (
    "Exact dedup keeps one document per hash of the normalized text (reason "
    "exact_duplicate). Fuzzy dedup finds documents whose estimated Jaccard similarity of "
    "shingle sets reaches --threshold with MinHash LSH, clusters them (connected components "
    "on Dask) and keeps one per cluster (reason near_duplicate, with cluster_id and kept_id)."
)

STAGES = (
    Stage(
        "dedup",
        DedupConfig,
        run=_run,
        help="remove exact and near-duplicate documents (MinHash LSH, datasketch-compatible)",
        description=_DESCRIPTION,
    ),
)
