"""`tokenmill inspect`: what a stage did — counts by reason, what each reason means, and sample
documents."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from tokenmill.curate.registry import all_reasons
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import KEPT_DIR, REJECTED_DIR, read_manifest


def _samples(directory: Path | str, reason: str | None, n: int, chars: int) -> list[dict[str, Any]]:
    files = [name for name, relative in storage.list_files(directory, ".parquet") if "/" not in relative]
    if not files or n <= 0:
        return []
    dataset = storage.parquet_dataset(files)
    names = dataset.schema.names
    columns = [c for c in ("id", "text", "reason", "raw") if c in names]
    expression = ds.field("reason") == reason if reason is not None and "reason" in names else None
    rows = dataset.head(n, columns=columns, filter=expression).to_pylist()
    for row in rows:
        for key in ("text", "raw"):
            if isinstance(row.get(key), str) and len(row[key]) > chars:
                row[key] = row[key][:chars] + "..."
    return rows


class _Config(dict):
    """A stage config for explanation templates: a value the manifest lacks shows as `?`."""

    def __missing__(self, key: str) -> str:
        return "?"


def explain_reason(reason: str, manifest: dict[str, Any]) -> str | None:
    """One line on what a rejection reason (or a `c4.lines_removed.<rule>` stat) means, with the
    thresholds the stage ran with; None for a reason nobody declared."""
    config = manifest.get("config") or {}
    # `c4.lines_removed.<rule>` counts lines a C4 line rule removed: explained by that rule.
    rule_reason = "c4." + reason.removeprefix("c4.lines_removed.") if reason.startswith("c4.lines_removed.") else reason
    family_name, _, rule = rule_reason.partition(".")
    from tokenmill.curate.rules import FAMILIES, RuleSet

    if family_name in FAMILIES and rule:
        rules = RuleSet()
        if isinstance(config.get("rules"), dict):
            rules.update(config["rules"])
        return rules.family(family_name).explain(rule)
    templates = all_reasons()
    template = templates.get(reason) or next(
        (t for key, t in templates.items() if key.endswith(":") and reason.startswith(key)), None
    )
    if template is None:
        return None
    values = _Config({k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in config.items()})
    try:
        return string.Formatter().vformat(template, (), values)
    except (ValueError, TypeError):  # a config value that does not fit the template's format
        return template


def inspect_stage(stage_dir: str | Path, samples: int = 2, chars: int = 300) -> dict[str, Any]:
    stage_dir = storage.Location(stage_dir).path
    manifest = read_manifest(stage_dir)
    counts = manifest["counts"]
    stats = manifest.get("stats", {})
    report: dict[str, Any] = {
        "stage": manifest.get("stage"),
        "counts": counts,
        "explanations": {
            key: text for key in [*counts["rejected"], *stats] if (text := explain_reason(key, manifest)) is not None
        },
        "stats": stats,
        "seconds": manifest.get("timings", {}).get("seconds"),
        "balanced": counts["in"] == counts["kept"] + sum(counts["rejected"].values()),
        "kept_samples": _samples(storage.join(stage_dir, KEPT_DIR), None, samples, chars),
        "rejected_samples": {
            reason: _samples(storage.join(stage_dir, REJECTED_DIR), reason, samples, chars)
            for reason in counts["rejected"]
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
    explanations = report.get("explanations", {})
    if counts["rejected"]:
        lines.append("rejected, by reason:")
    for reason, n in sorted(counts["rejected"].items(), key=lambda item: -item[1]):
        share = n / counts["in"] if counts["in"] else 0.0
        lines.append(f"  {reason:<40} {n:>10}  {share:6.1%}")
        if reason in explanations:
            lines.append(f"      {explanations[reason]}")
    if report["stats"]:
        lines.append("stats:")
        for key, value in report["stats"].items():
            lines.append(f"  {key:<40} {value:>10}")
            if key in explanations:
                lines.append(f"      {explanations[key]}")

    def show(title: str, rows: list[dict[str, Any]]) -> None:
        lines.append(title)
        for row in rows:
            body = row.get("text") if row.get("text") is not None else row.get("raw")
            lines.append(f"  - {row.get('id')}: {body!r}")

    show("kept samples:", report["kept_samples"])
    for reason, rows in report["rejected_samples"].items():
        show(f"rejected ({reason}):", rows)
    return "\n".join(lines)
