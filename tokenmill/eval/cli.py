"""`tokenmill eval`: zero/one/few-shot evaluation scored as lm-evaluation-harness 0.4.x scores it."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from tokenmill.eval.tasks import TASKS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model zero/one/few-shot (LAMBADA, PIQA, BoolQ, HellaSwag, WinoGrande, RACE, ANLI, WiC)",
        description=(
            "Evaluate a tokenmill run/checkpoint directory or a transformers model directory on "
            "benchmark tasks, scored as lm-evaluation-harness 0.4.x scores them. "
            f"Tasks: {', '.join(TASKS)}."
        ),
    )
    parser.add_argument("--model", required=True, help="tokenmill run/checkpoint dir or transformers model dir")
    parser.add_argument("--tasks", required=True, help="comma-separated task names, e.g. piqa,winogrande")
    parser.add_argument("--shots", default="0", help="comma-separated shot counts, e.g. 0,1,5 (default 0)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder with the benchmarks' original files; without it, the `datasets` library is used",
    )
    parser.add_argument("--limit", type=float, default=None, help="first N documents per task (<1: a fraction)")
    parser.add_argument("--batch-size", type=int, default=16, help="requests per forward pass (default 16)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--output", type=Path, default=None, help="results JSON path (a .md table is written next to it)")
    parser.add_argument(
        "--bootstrap-iters", type=int, default=100_000, help="bootstrap replicates for perplexity stderr (harness: 100000)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Offline by default for the model (local directories); datasets may still go online.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from tokenmill.eval.evaluator import evaluate
    from tokenmill.eval.results import markdown_table, write_results

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="tokenmill eval: %(levelname)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    rows = evaluate(
        args.model,
        args.tasks,
        args.shots,
        data_dir=args.data_dir,
        limit=limit,
        batch_size=args.batch_size,
        device=args.device,
        bootstrap_iters=args.bootstrap_iters,
    )
    table = markdown_table(rows)
    print(table, end="")
    if args.output:
        config = {
            "model": str(args.model),
            "tasks": args.tasks,
            "shots": args.shots,
            "data_dir": str(args.data_dir) if args.data_dir else None,
            "limit": limit,
            "batch_size": args.batch_size,
            "device": args.device,
            "fewshot_seed": 1234,
        }
        path = write_results(rows, args.output, config)
        print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0
