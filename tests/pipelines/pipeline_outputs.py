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


def report_rows(markdown: str, section: str) -> dict[str, list[str]]:
    """The table rows of a report.md section, by their first cell."""
    text = markdown.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def assert_blend_table_is_the_draw(markdown: str, blend_file: Path, config: dict, samples: int, sources: list[str]):
    """Each source's realised share and epochs seen in report.md's blend table are those of the
    first `samples` samples of the trainer's own blended dataset (`sources` in the blend file's
    order). Returns the table's rows."""
    import numpy as np

    from tokenmill.pipelines.report import number_cell
    from tokenmill.tokenize.loader import build_dataset

    drawn = build_dataset(
        str(blend_file),
        seq_len=config["dataset"]["seq_len"],
        num_samples=samples,
        seed=config["schedule"]["seed"],
        split_ratios=config["dataset"]["split"],
    )
    counts = np.bincount(np.asarray(drawn.dataset_index[:samples]), minlength=len(sources))
    blend = report_rows(markdown, "Blend")
    for source, count, dataset in zip(sources, counts, drawn.datasets, strict=True):
        begin, end = dataset.document_range
        split_tokens = int(dataset.indexed.sequence_lengths[begin:end].sum())
        assert blend[source][3] == number_cell(round(count / samples, 4)), source
        assert blend[source][4] == number_cell(round(count * config["dataset"]["seq_len"] / split_tokens, 3)), source
    return blend
