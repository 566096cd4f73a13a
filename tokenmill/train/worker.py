"""The entry point of the training processes tokenmill starts itself:
``python -m tokenmill.train.worker CONFIG [OPTIONS]``, with the arguments of `tokenmill train`.

The ranks the launcher starts (supervisor.py), the ranks of a Slurm job (train_job.py) and the
trainer of a `tokenmill run` (pipelines/runner.py) start here rather than from the whole
`tokenmill` command line, so each imports the training code alone, not every command's parser.
What ends them is said as `tokenmill` says it (entry.py): one ``tokenmill: error: ...`` line
and the same exit statuses. The role a process plays is chosen by `run_train` (cli.py).
"""

from __future__ import annotations

import argparse
import sys

from tokenmill.entry import run_reported, take_debug_flag
from tokenmill.train.cli import TRAIN_DESCRIPTION, add_train_arguments, run_train


def build_parser() -> argparse.ArgumentParser:
    """`tokenmill train`'s parser, alone."""
    parser = argparse.ArgumentParser(prog="tokenmill train", description=TRAIN_DESCRIPTION)
    add_train_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    debug, argv = take_debug_flag(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    return run_reported(lambda: run_train(args), "tokenmill train", debug)


if __name__ == "__main__":
    sys.exit(main())
