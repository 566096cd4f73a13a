"""Reading a work directory's outputs, to compare two runs of a recipe."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def documents(stage_dir: Path) -> list[tuple[str, str]]:
    """A curate stage's kept documents as sorted (id, text) pairs."""
    rows = []
    for path in sorted((stage_dir / "kept").glob("*.parquet")):
        table = pq.read_table(path, columns=["id", "text"])
        rows += list(zip(table["id"].to_pylist(), table["text"].to_pylist()))
    return sorted(rows)
