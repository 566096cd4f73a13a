"""The `tokenmill` command: one entry point, subcommands delegate to the stage packages.

Each package exposes `register(subparsers)` in its own `cli` module; a subcommand stores its
handler in `func`. Handlers raise `TokenmillError` for user mistakes, which print as one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from tokenmill import __version__
from tokenmill.curate import cli as curate_cli
from tokenmill.errors import TokenmillError
from tokenmill.eval import cli as eval_cli
from tokenmill.logs import configure_logging
from tokenmill.pipelines import cli as pipelines_cli
from tokenmill.tokenize import cli as tokenize_cli
from tokenmill.train import cli as train_cli
from tokenmill.train import plan as train_plan

DEBUG_FLAG = "--debug"
DEBUG_ENV = "TOKENMILL_DEBUG"

# Modules that add subcommands, in the order they appear in `--help`. Each builds its parsers
# from declarations alone and imports a command's implementation only when the command runs, so
# `--help` and argument errors load none of torch, pandas, pyarrow, Dask or numba.
COMMAND_MODULES = (curate_cli, tokenize_cli, train_cli, train_plan, eval_cli, pipelines_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is taken anywhere on the line, and passed on to the processes a command starts.
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV) == "1"
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    if debug:
        os.environ[DEBUG_ENV] = "1"
    configure_logging(debug)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except TokenmillError as error:
        if debug:
            traceback.print_exc()
        print(f"tokenmill: error: {error}", file=sys.stderr)
        return error.exit_status
    except Exception as error:
        # A full disk anywhere (a command's own writes, a library's, wrapped or not) is one
        # line too; the commands that write through Dask say which partitions they keep.
        from tokenmill.infra.faults import disk_full_error, is_disk_full

        if not is_disk_full(error):
            raise
        if debug:
            traceback.print_exc()
        print(f"tokenmill: error: {disk_full_error(error, f'tokenmill {args.command}')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        if debug:
            traceback.print_exc()
        # A command may say how to resume (`train`: with --resume); by default a rerun resumes.
        print(f"tokenmill: interrupted; {str(interrupt) or 'rerun to resume'}", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
