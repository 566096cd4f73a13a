"""`tokenmill eval`: zero/one/few-shot evaluation scored as lm-evaluation-harness 0.4.x scores it."""

from __future__ import annotations

import argparse
import logging
import textwrap
from contextlib import ExitStack
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks import TASKS
from tokenmill.infra.outputs import OutputKind, claim_output

log = logging.getLogger(__name__)

# What --output may replace: earlier results, their Markdown table beside them.
RESULTS_OUTPUT = OutputKind("eval results", ("{stem}.md",), layout="file")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model zero/one/few-shot (LAMBADA, PIQA, BoolQ, HellaSwag, WinoGrande, RACE, ANLI, WiC)",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the example on one line
        description=textwrap.fill(
            "Evaluate a tokenmill run/checkpoint directory or a transformers model directory on "
            "benchmark tasks, scored as lm-evaluation-harness 0.4.x scores them: same prompts, "
            "few-shot examples, documents and standard errors. Task data comes from --data-dir "
            "(the benchmarks' original files, or the harness's Hugging Face datasets saved in the "
            "hub's layout), else from the Hugging Face hub through `datasets`, as the harness reads it. "
            f"Tasks: {', '.join(TASKS)}.",
            width=88,
            break_on_hyphens=False,
        ),
        epilog=(
            "example:\n  tokenmill eval --model runs/tiny --tasks piqa,winogrande,lambada_openai --shots 0,1,5 \\\n"
            "      --data-dir ../shared/data/eval --output results/tiny.json"
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="tokenmill run or checkpoint directory, or a transformers model directory with its tokenizer",
    )
    parser.add_argument(
        "--tasks",
        required=True,
        metavar="NAMES",
        help=f"comma-separated task names (aliases: anli, lambada, race_high); one of: {', '.join(TASKS)}",
    )
    parser.add_argument(
        "--shots",
        default="0",
        metavar="K[,K...]",
        help="comma-separated few-shot counts; every task runs at each (default 0)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "folder with the benchmarks' original files (piqa_valid.jsonl + piqa_valid-labels.lst, "
            "boolq_dev.jsonl, ...) or the harness's datasets saved as DIR/<hub id>/; without it, "
            "`datasets` loads them from the Hugging Face hub (network or its cache needed)"
        ),
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=None,
        metavar="N",
        help="evaluate the first N documents of each task, in the harness's order (below 1: that fraction)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, metavar="B", help="requests per forward pass (default 16)"
    )
    parser.add_argument("--device", default="cpu", help="torch device to run the model on, e.g. cuda (default cpu)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the results as JSON to FILE and the table as Markdown next to it (FILE with .md)",
    )
    parser.add_argument(
        "--bootstrap-iters",
        type=int,
        default=100_000,
        metavar="N",
        help="bootstrap replicates for the perplexity standard error (default 100000, the harness's)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads (default: the cores free now: those this process may use, less the 1-minute load"
        " average, at least 1; OMP_NUM_THREADS, when set, is left to torch)",
    )
    parser.set_defaults(func=run)


def eval_threads(requested: int | None) -> int | None:
    """The torch thread count for evaluation: `--threads`, else the cores free now (an idle
    machine's cores, one on a loaded one, where more threads only spin), else None to leave
    OMP_NUM_THREADS to torch."""
    import os

    from tokenmill.infra.cpu import free_cores

    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cores()


def run(args: argparse.Namespace) -> int:
    # Models load from local directories only (local_files_only); the hub stays reachable so
    # that tasks without --data-dir load as the harness loads them.
    import torch

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="tokenmill eval: %(levelname)s: %(message)s")
    if args.threads is not None and args.threads < 1:
        raise TokenmillError(f"--threads must be at least 1, got {args.threads}")
    threads = eval_threads(args.threads)
    if threads is not None:
        torch.set_num_threads(threads)
        log.debug(f"eval: {threads} torch thread(s)")
    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    with ExitStack() as held:
        if args.output:
            # Before the evaluation: an --output that cannot be written ends it now, not after.
            held.enter_context(claim_output(args.output, RESULTS_OUTPUT, flag="--output", inputs=[args.model]))
        return _evaluate_and_write(args, limit)


def _evaluate_and_write(args: argparse.Namespace, limit: float | None) -> int:
    from tokenmill.eval.evaluator import evaluate
    from tokenmill.eval.results import markdown_table, write_results

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
        log.info(f"wrote {path} and {path.with_suffix('.md')}")
    return 0
