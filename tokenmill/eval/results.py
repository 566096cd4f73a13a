"""Eval results: the JSON file and the Markdown table (docs/architecture.md, format 6)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenmill import __version__
from tokenmill.infra.atomic import atomic_write_text


def _fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric == "perplexity":
        return f"{value:.4g}" if value >= 1e6 else f"{value:.2f}"
    return f"{value:.4f}"


RESULT_COLUMNS = ["task", "shots", "n", "metric", "value", "± stderr"]


def result_cells(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The cells of the results table, one list per (task, shots, metric), in `RESULT_COLUMNS`
    order; a result without a count (held-out perplexity) or a shot count (a suite's aggregate)
    shows `-` there."""
    return [
        [
            str(r["task"]),
            "-" if r.get("shots") is None else str(r["shots"]),
            "-" if r.get("n") is None else str(r["n"]),
            str(r["metric"]),
            _fmt(r["value"], r["metric"]),
            _fmt(r.get("stderr"), r["metric"]),
        ]
        for r in rows
    ]


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The results table of `tokenmill eval`, a recipe's eval step and its report: one line
    per (task, shots, metric); `±` is the harness's standard error. A row's `note` (what a
    suite's aggregate is over) follows the table."""
    lines = ["| " + " | ".join(RESULT_COLUMNS) + " |", "|---|---:|---:|---|---:|---:|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in result_cells(rows)]
    notes = [r["note"] for r in rows if r.get("note")]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def write_results(rows: Sequence[dict[str, Any]], path: str | Path, config: dict[str, Any] | None = None) -> Path:
    """Write `path` (JSON: config + results) and `path` with `.md` (the table), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"tokenmill_version": __version__, "config": config or {}, "results": list(rows)}
    atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(path.with_suffix(".md"), markdown_table(rows))
    return path
