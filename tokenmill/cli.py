"""The `tokenmill` command: one entry point, subcommands delegate to the stage packages.

Each package exposes `register(subparsers)` in its own `cli` module; a subcommand stores its
handler in `func`. Handlers raise `TokenmillError` for user mistakes, which print as one line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from tokenmill import __version__
from tokenmill.errors import TokenmillError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "TOKENMILL_DEBUG"

# Modules that add subcommands, in the order they appear in `--help`.
COMMAND_MODULES = (
    "tokenmill.curate.cli",
    "tokenmill.tokenize.cli",
    "tokenmill.train.cli",
    "tokenmill.train.plan",
    "tokenmill.eval.cli",
    "tokenmill.pipelines.cli",
)


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
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                continue
            raise
        module.register(subparsers)
    return parser


class _Stderr(logging.StreamHandler):
    """A handler that writes to the `sys.stderr` of the moment, which callers (and tests) may
    have replaced since logging was configured."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Format(logging.Formatter):
    """Status lines as they are written; warnings and errors as `tokenmill: LEVEL: ...`."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno == logging.INFO else f"tokenmill: {record.levelname}: {message}"


def configure_logging(debug: bool = False) -> None:
    """tokenmill's own messages on stderr: status lines (info) as they are, warnings and errors
    as one `tokenmill: LEVEL: ...` line each; debug messages too with --debug. Results (tables,
    JSON, inspections) are printed on stdout by the commands themselves."""
    logger = logging.getLogger("tokenmill")
    if not logger.handlers:
        handler = _Stderr()
        handler.setFormatter(_Format("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.DEBUG if debug else logging.INFO)


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
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("tokenmill: interrupted; rerun to resume", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
