"""`tokenmill train CONFIG --slurm`: training as a Slurm batch job (tokenmill.infra.slurm writes
and submits it).

Every rank runs under ``srun`` (one task per node) with torchrun's c10d rendezvous on the first
node of the allocation: tokenmill's own launcher (launch.py) is single-node by design
(``--standalone``), while torchrun with a shared rendezvous endpoint is what joins the nodes,
so the script calls it directly; each rank then runs `tokenmill train`'s arguments through the
ranks' entry point (``python -m tokenmill.train.worker``). Every job passes ``--resume`` (a
fresh run directory simply starts), and Slurm's warning before the time limit makes training
stop at a checkpoint (``STOPPED_EXIT``) for the next job of a chain.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenmill.errors import ConfigError
from tokenmill.infra.slurm import (
    RDZV_BASE_PORT,
    SLURM_DIR,
    TRAIN_SCRIPT,
    SlurmSpec,
    Submitted,
    emit,
    header,
    nproc_per_node,
    prologue,
    quote,
    run_stoppable,
    stop_on_signal,
    torchrun_prefix,
)
from tokenmill.infra.slurm_options import slurm_overrides
from tokenmill.train.config import TrainConfig
from tokenmill.train.stop import STOP_FILE, STOPPED_EXIT


def train_script(train_argv: list[str], out: Path, spec: SlurmSpec, *, name: str, world_size: int, nodes: int) -> str:
    """The sbatch script of `tokenmill train`: every rank under srun + torchrun, resuming from
    the run directory's latest checkpoint when there is one."""
    log_dir = out / SLURM_DIR
    nproc = nproc_per_node(world_size, nodes, spec)
    argv = " ".join(quote(a) for a in train_argv)
    lines = header(spec, f"tokenmill-{name}", nodes, log_dir, Path.cwd())
    lines += [
        f"# `tokenmill train` as a Slurm job; resubmit with: sbatch {log_dir / TRAIN_SCRIPT}",
        *prologue(spec),
        f"RDZV_BASE_PORT={RDZV_BASE_PORT}",
        *stop_on_signal(out / STOP_FILE),
        # Every job resumes from the latest checkpoint (a fresh run directory simply starts).
        *run_stoppable(
            f"{torchrun_prefix(nodes, nproc)} -m tokenmill.train.worker {argv}"
            + ("" if "--resume" in train_argv else " --resume"),
            STOPPED_EXIT,
        ),
    ]
    return "\n".join(lines) + "\n"


def submit_training(cfg: TrainConfig, train_argv: list[str], args: argparse.Namespace) -> Submitted | None:
    """`tokenmill train CONFIG --slurm`: the training job script, written to RUN/slurm/ and
    submitted (or printed with --dry-run)."""
    if cfg.out_is_url:
        # The ranks of several nodes write one checkpoint together into the run directory, so it
        # must be a filesystem they share; a URL's copy lives in each node's own cache.
        raise ConfigError(f"out: {cfg.out}: a Slurm training job needs a run directory on a shared filesystem")
    spec = SlurmSpec().merged(slurm_overrides(args))
    out = Path(cfg.out).resolve()
    nodes = spec.nodes or 1
    text = train_script(train_argv, out, spec, name=out.name, world_size=cfg.world_size, nodes=nodes)
    return emit(out / SLURM_DIR / TRAIN_SCRIPT, text, spec.chain, args.dry_run)
