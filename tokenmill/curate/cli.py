"""`tokenmill curate <stage>` and `tokenmill inspect`.

Each subcommand is derived from a stage's declaration in `tokenmill.curate.registry`; the
options every stage shares come from `add_stage_arguments`.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def add_stage_arguments(parser: argparse.ArgumentParser, *, document_input: bool = True) -> None:
    """Options shared by every curate stage."""
    if document_input:
        parser.add_argument(
            "--input",
            required=True,
            nargs="+",
            help="a stage directory (its kept/ is read) or Parquet files / directories",
        )
    parser.add_argument(
        "--output", required=True, help="the stage directory to write (kept/, rejected/, manifest.json)"
    )
    parser.add_argument(
        "--scheduler", default=None, help="address of an existing Dask scheduler (default: a LocalCluster)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="LocalCluster worker processes (default: one per core)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def stage_input(args: argparse.Namespace) -> Any:
    return args.input[0] if len(args.input) == 1 else list(args.input)


def runner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"scheduler": args.scheduler, "workers": args.workers, "progress": not args.no_progress}


def print_summary(manifest: dict[str, Any], output: str) -> None:
    counts = manifest["counts"]
    rejected = counts["rejected"]
    log.info(
        f"{manifest['stage']}: in {counts['in']}, kept {counts['kept']}, rejected {sum(rejected.values())}"
        f" in {manifest['timings']['seconds']:.1f}s -> {output}"
    )
    for reason, n in sorted(rejected.items(), key=lambda item: -item[1]):
        log.info(f"  {reason}: {n}")
    if manifest.get("resumed_phases"):
        from tokenmill.curate.dedup.work import phases_text

        log.info(f"  resumed {phases_text(manifest['resumed_phases'])} from an earlier run")
    if manifest.get("resumed_partitions"):
        log.info(
            f"  resumed {manifest['resumed_partitions']} of {manifest['partitions']} partitions from an earlier run"
        )


def register(subparsers: argparse._SubParsersAction) -> None:
    curate = subparsers.add_parser(
        "curate",
        help="clean, filter, deduplicate and decontaminate documents (on Dask)",
        description="Curation stages: each reads documents and writes STAGE/kept, STAGE/rejected (with a reason per"
        " document) and STAGE/manifest.json, atomically. `tokenmill curate STAGE --help` describes a stage.",
    )
    stages = curate.add_subparsers(dest="stage", metavar="STAGE")
    curate.set_defaults(func=lambda args: curate.print_help() or 2)
    from tokenmill.curate.registry import cli_stages

    for stage in cli_stages():
        stage.add_cli(stages)

    inspect = subparsers.add_parser(
        "inspect",
        help="counts by reason and sample documents of a stage directory",
        description="Show what a curate stage did: its counts, each rejection reason with its count and a one-line"
        " explanation (with the thresholds it ran with), the stage's stats, and sample documents kept and rejected.",
    )
    inspect.add_argument("stage_dir", help="a stage directory written by `tokenmill curate STAGE --output`")
    inspect.add_argument("--samples", type=int, default=2, help="sample documents per reason (default 2)")
    inspect.add_argument("--chars", type=int, default=300, help="characters shown per sample (default 300)")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(func=_inspect_command)


def _inspect_command(args: argparse.Namespace) -> int:
    from tokenmill.curate.inspect import format_report, inspect_stage

    report = inspect_stage(args.stage_dir, samples=args.samples, chars=args.chars)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
