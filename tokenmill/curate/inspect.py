"""`tokenmill inspect`: what a stage did — counts by reason and sample documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from tokenmill.curate.documents import KEPT_DIR, REJECTED_DIR, read_manifest


def _samples(directory: Path, reason: str | None, n: int, chars: int) -> list[dict[str, Any]]:
    files = sorted(directory.glob("*.parquet"))
    if not files or n <= 0:
        return []
    dataset = ds.dataset([str(f) for f in files], format="parquet")
    names = dataset.schema.names
    columns = [c for c in ("id", "text", "reason", "raw") if c in names]
    expression = ds.field("reason") == reason if reason is not None and "reason" in names else None
    rows = dataset.head(n, columns=columns, filter=expression).to_pylist()
    for row in rows:
        for key in ("text", "raw"):
            if isinstance(row.get(key), str) and len(row[key]) > chars:
                row[key] = row[key][:chars] + "..."
    return rows


def inspect_stage(stage_dir: str | Path, samples: int = 2, chars: int = 300) -> dict[str, Any]:
    stage_dir = Path(stage_dir)
    manifest = read_manifest(stage_dir)
    counts = manifest["counts"]
    report: dict[str, Any] = {
        "stage": manifest.get("stage"),
        "counts": counts,
        "stats": manifest.get("stats", {}),
        "seconds": manifest.get("timings", {}).get("seconds"),
        "balanced": counts["in"] == counts["kept"] + sum(counts["rejected"].values()),
        "kept_samples": _samples(stage_dir / KEPT_DIR, None, samples, chars),
        "rejected_samples": {
            reason: _samples(stage_dir / REJECTED_DIR, reason, samples, chars) for reason in counts["rejected"]
        },
    }
    return report


def format_report(report: dict[str, Any]) -> str:
    counts = report["counts"]
    total_rejected = sum(counts["rejected"].values())
    lines = [
        f"stage {report['stage']}: in {counts['in']}, kept {counts['kept']}, rejected {total_rejected}"
        + ("" if report["balanced"] else "  (COUNTS DO NOT ADD UP)"),
    ]
    for reason, n in sorted(counts["rejected"].items(), key=lambda item: -item[1]):
        share = n / counts["in"] if counts["in"] else 0.0
        lines.append(f"  {reason:<40} {n:>10}  {share:6.1%}")
    if report["stats"]:
        lines.append("stats:")
        lines.extend(f"  {key:<40} {value:>10}" for key, value in report["stats"].items())

    def show(title: str, rows: list[dict[str, Any]]) -> None:
        lines.append(title)
        for row in rows:
            body = row.get("text") if row.get("text") is not None else row.get("raw")
            lines.append(f"  - {row.get('id')}: {body!r}")

    show("kept samples:", report["kept_samples"])
    for reason, rows in report["rejected_samples"].items():
        show(f"rejected ({reason}):", rows)
    return "\n".join(lines)
