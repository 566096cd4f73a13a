"""Deduplication: exact (hash of normalized text) and fuzzy (MinHash LSH), on Dask.

Python API:
    from tokenmill.curate.dedup import DedupConfig, run_dedup, MinHasher
    run_dedup("normalized/", "dedup/", DedupConfig(threshold=0.8, verify=True))

CLI: `tokenmill curate dedup --input DIR --output DIR [--method fuzzy|exact] ...`
"""

from __future__ import annotations

from tokenmill.curate.dedup.lsh import LSHParams, optimal_bands_rows
from tokenmill.curate.dedup.minhash import MinHasher, jaccard, shingle_sets
from tokenmill.curate.dedup.pipeline import DedupConfig, run_dedup
from tokenmill.curate.dedup.shingles import (
    ShingleConfig,
    TextNormalization,
    python_shingles,
)
from tokenmill.curate.registry import Stage

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
        _run,
        help="remove exact and near-duplicate documents (MinHash LSH, datasketch-compatible)",
        description=_DESCRIPTION,
    ),
)
