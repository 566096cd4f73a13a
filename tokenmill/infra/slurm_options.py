"""The `--slurm` options of `tokenmill run` and `tokenmill train`.

Apart from `tokenmill.infra.slurm` (the scripts and their submission, with the pydantic model
of a `slurm:` section) so that the command line builds its parsers without loading pydantic.
"""

from __future__ import annotations

import argparse

from tokenmill.errors import ConfigError


def add_slurm_options(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """The Slurm options; ``dry_run``: also `--dry-run` (commands that have none of their own)."""
    group = parser.add_argument_group(
        "Slurm", "with --slurm: write an sbatch script (kept under slurm/ in the work or run directory) and submit it"
    )
    group.add_argument("--slurm", action="store_true", help="submit as a Slurm batch job instead of running here")
    group.add_argument("--partition", help="sbatch --partition")
    group.add_argument("--account", help="sbatch --account")
    group.add_argument("--nodes", type=int, help="nodes to allocate (default: the recipe's train.nnodes, else 1)")
    group.add_argument("--gpus-per-node", type=int, help="sbatch --gpus-per-node")
    group.add_argument("--cpus-per-node", type=int, help="CPUs per node (sbatch --cpus-per-task, one task per node)")
    group.add_argument("--time", help="time limit per job (sbatch --time), e.g. 4:00:00")
    group.add_argument("--job-name", help="sbatch --job-name (default: tokenmill-NAME)")
    group.add_argument(
        "--chain",
        type=int,
        help="submit K jobs, each starting when the previous one ends (--dependency=afterany) and resuming its work",
    )
    group.add_argument(
        "--stop-seconds",
        type=int,
        metavar="SECONDS",
        help="ask training to checkpoint and stop this long before the time limit "
        "(sbatch --signal=B:USR1@SECONDS; default 300, 0: not asked)",
    )
    group.add_argument(
        "--sbatch",
        action="append",
        metavar="OPTION",
        help="an extra sbatch option for the script's #SBATCH lines, e.g. --sbatch=--qos=high; repeatable",
    )
    if dry_run:
        group.add_argument("--dry-run", action="store_true", help="with --slurm: print the script; submit nothing")


def slurm_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "partition": args.partition,
        "account": args.account,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "cpus_per_node": args.cpus_per_node,
        "time": args.time,
        "job_name": args.job_name,
        "chain": args.chain,
        "stop_seconds": args.stop_seconds,
        "sbatch": args.sbatch,
    }


def check_slurm_only_options(args: argparse.Namespace) -> None:
    """Slurm options without --slurm are a mistake, not something to ignore silently."""
    given = [key for key, value in slurm_overrides(args).items() if value is not None]
    if given and not args.slurm:
        raise ConfigError(f"--{given[0].replace('_', '-')} needs --slurm")
