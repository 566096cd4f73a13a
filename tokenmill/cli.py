"""The `tokenmill` command: one entry point, subcommands delegate to the stage packages.

Each package exposes `register(subparsers)` in its own `cli` module; a subcommand stores its
handler in `func`. Handlers raise `TokenmillError` for user mistakes, which print as one line (entry.py).
"""

from __future__ import annotations

import argparse
import sys

from tokenmill import __version__
from tokenmill.curate import cli as curate_cli
from tokenmill.entry import DEBUG_ENV, DEBUG_FLAG, run_reported, take_debug_flag
from tokenmill.eval import cli as eval_cli
from tokenmill.infra.flags import CommandParser
from tokenmill.pipelines import cli as pipelines_cli
from tokenmill.tokenize import cli as tokenize_cli
from tokenmill.train import cli as train_cli

# Modules that add subcommands, in the order they appear in `--help`. Each builds its parsers
# from declarations alone and imports a command's implementation only when the command runs, so
# `--help` and argument errors load none of torch, pandas, pyarrow, Dask or numba.
COMMAND_MODULES = (curate_cli, tokenize_cli, train_cli, eval_cli, pipelines_cli)


def build_parser() -> argparse.ArgumentParser:
    # Every subcommand's parser is a CommandParser too (`add_subparsers` hands the class down).
    parser = CommandParser(
        prog="tokenmill",
        description="From raw text corpora to an evaluated language model.",
    )
    parser.add_argument("--version", action="version", version=f"tokenmill {__version__}")
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help=f"show the full traceback behind an error message (anywhere on the command line; or set {DEBUG_ENV}=1)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # --debug is taken anywhere on the line, and passed on to the processes a command starts.
    debug, argv = take_debug_flag(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_reported(lambda: args.func(args), f"tokenmill {args.command}", debug)


if __name__ == "__main__":
    sys.exit(main())
