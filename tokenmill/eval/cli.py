"""`tokenmill eval`: zero/one/few-shot tasks scored as lm-evaluation-harness 0.4.x scores them, ICL
suites (DCLM's CORE) scored as llm-foundry scores them, and bits per byte of held-out text."""

from __future__ import annotations

import argparse
import logging
import textwrap
from contextlib import ExitStack
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks import ALIASES, TASKS
from tokenmill.infra.cpu import set_torch_threads
from tokenmill.infra.outputs import OutputKind, claim_output

log = logging.getLogger(__name__)

# What --output may replace: earlier results, their Markdown table beside them.
RESULTS_OUTPUT = OutputKind("eval results", ("{stem}.md",), layout="file")


EXAMPLES = (
    "examples:\n"
    "  tokenmill eval --model runs/tiny --tasks piqa,winogrande,lambada_openai --shots 0,1,5 \\\n"
    "      --data-dir ../shared/data/eval --output results/tiny.json\n"
    "  tokenmill eval --model runs/tiny --suite core --data-dir ../shared/data/eval/icl --limit 50\n"
    "  tokenmill eval --model runs/tiny --bpb held_out.jsonl"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model: benchmark tasks, DCLM's CORE suite, bits per byte on held-out text",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the example on one line
        description=textwrap.fill(
            "Evaluate a tokenmill run/checkpoint directory or a transformers model directory on "
            "benchmark tasks, scored as lm-evaluation-harness 0.4.x scores them: same prompts, "
            "few-shot examples, documents and standard errors. Task data comes from --data-dir "
            "(the benchmarks' original files, or the harness's Hugging Face datasets exported as "
            "JSON lines or saved in the hub's layout), else from the Hugging Face hub through `datasets`, as the harness reads it. "
            f"Tasks: {', '.join(TASKS)}. --suite core runs DCLM's CORE (22 in-context-learning tasks "
            "in llm-foundry's format, scored as llm-foundry scores them; files under --data-dir) and "
            "--bpb PATH the bits per byte of held-out text; any of the three may be combined.",
            width=88,
            break_on_hyphens=False,
        ),
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="tokenmill run or checkpoint directory, or a transformers model directory with its tokenizer",
    )
    parser.add_argument(
        "--tasks",
        default=None,
        metavar="NAMES",
        help=f"comma-separated task names (aliases: {', '.join(ALIASES)}); one of: {', '.join(TASKS)}",
    )
    parser.add_argument(
        "--suite",
        default=None,
        metavar="NAME|FILE",
        help="an ICL suite: `core` (DCLM's CORE, bundled) or a suite YAML file; its task files are "
        "under --data-dir, and each task has its own shot count",
    )
    parser.add_argument(
        "--bpb",
        type=Path,
        default=None,
        metavar="PATH",
        help="bits per byte of held-out text: a .jsonl file (`text` per line), a document directory, or a text file",
    )
    parser.add_argument(
        "--shots",
        default="0",
        metavar="K[,K...]",
        help="comma-separated few-shot counts for --tasks; every task runs at each (default 0)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "folder with the benchmarks' original files (piqa_valid.jsonl + piqa_valid-labels.lst, "
            "boolq_dev.jsonl, ...), the harness's datasets exported as JSON lines (arc_easy_test.jsonl, "
            "...) or saved as DIR/<hub id>/; without it, "
            "`datasets` loads them from the Hugging Face hub (network or its cache needed)"
        ),
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=None,
        metavar="N",
        help="evaluate the first N documents of each task or suite task, in file order (below 1: that fraction)",
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


def run(args: argparse.Namespace) -> int:
    # Models load from local directories only (local_files_only); the hub stays reachable so
    # that tasks without --data-dir load as the harness loads them.
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="tokenmill eval: %(levelname)s: %(message)s")
    if not (args.tasks or args.suite or args.bpb):
        raise TokenmillError("nothing to evaluate: pass --tasks, --suite or --bpb")
    if args.threads is not None and args.threads < 1:
        raise TokenmillError(f"--threads must be at least 1, got {args.threads}")
    threads = set_torch_threads(args.threads)
    if threads is not None:
        log.debug(f"eval: {threads} torch thread(s)")
    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    if args.batch_size < 1:
        raise TokenmillError(f"--batch-size must be at least 1, got {args.batch_size}")
    with ExitStack() as held:
        if args.output:
            # Before the evaluation: an --output that cannot be written ends it now, not after.
            held.enter_context(claim_output(args.output, RESULTS_OUTPUT, flag="--output", inputs=[args.model]))
        return _evaluate_and_write(args, limit)


def _evaluate_and_write(args: argparse.Namespace, limit: float | None) -> int:
    from tokenmill.eval.bpb import bpb_rows, read_documents
    from tokenmill.eval.evaluator import evaluate
    from tokenmill.eval.models import load_model
    from tokenmill.eval.results import markdown_table, write_results
    from tokenmill.eval.suites import evaluate_suite, load_suite, load_suite_data

    # Suite files and held-out text are read before the model loads: a bad file fails fast.
    suite_data = load_suite_data(load_suite(args.suite), args.data_dir) if args.suite else None
    documents = read_documents(args.bpb) if args.bpb else None
    model = load_model(args.model, device=args.device) if (suite_data or documents) else args.model
    rows = []
    if args.tasks:
        rows += evaluate(
            model,
            args.tasks,
            args.shots,
            data_dir=args.data_dir,
            limit=limit,
            batch_size=args.batch_size,
            device=args.device,
            bootstrap_iters=args.bootstrap_iters,
        )
    if suite_data is not None:
        rows += evaluate_suite(model, suite_data, limit, args.batch_size)
    if documents is not None:
        rows += bpb_rows(args.bpb, documents, model, args.batch_size)
    table = markdown_table(rows)
    print(table, end="")
    if args.output:
        config = {
            "model": str(args.model),
            "tasks": args.tasks,
            "suite": args.suite,
            "bpb": str(args.bpb) if args.bpb else None,
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
