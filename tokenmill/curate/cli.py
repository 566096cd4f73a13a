"""`tokenmill curate <stage>` and `tokenmill inspect`.

Each subcommand is derived from a stage's declaration in `tokenmill.curate.registry`, which
also holds the options every stage shares (`add_stage_arguments`).
"""

from __future__ import annotations

import argparse
import json

from tokenmill.curate import chain
from tokenmill.curate.registry import cli_stages


def register(subparsers: argparse._SubParsersAction) -> None:
    curate = subparsers.add_parser(
        "curate",
        help="clean, filter, deduplicate and decontaminate documents (on Dask)",
        description="Curation stages: each reads documents and writes STAGE/kept, STAGE/rejected (with a reason per"
        " document) and STAGE/manifest.json, atomically. `tokenmill curate STAGE --help` describes a stage.",
    )
    stages = curate.add_subparsers(dest="stage", metavar="STAGE")
    curate.set_defaults(func=lambda args: curate.print_help() or 2)
    for stage in cli_stages():
        stage.add_cli(stages)
    chain.add_cli(stages)

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
