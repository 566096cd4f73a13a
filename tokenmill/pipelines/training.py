"""The recipe's training step: the trainer's config, the decision to resume or start afresh,
and the trainer run as a child process, supervised until it ends (stopped with the run,
asked to checkpoint and stop on SIGUSR1, its checkpoints uploaded for a remote work directory)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tokenmill.errors import TokenmillError
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.pipelines.context import Context
from tokenmill.pipelines.step_graph import Step, StepRef
from tokenmill.train.metrics import read_metrics

log = logging.getLogger(__name__)


def train_config(ctx: Context, step: Step) -> dict[str, Any]:
    """The trainer's config for this run: the recipe's, plus data, output and tokenizer (the
    model's vocabulary, when left out, is the shards' tokenizer's, padded by the trainer)."""
    from tokenmill.train.config import apply_overrides

    tokenizer_dir = ctx.steps[StepRef.tokenizer()].output
    overrides = {
        "dataset.path": str(ctx.steps[StepRef.blend()].output / "blend.json"),
        "out": str(step.output / "run"),
        "dataset.tokenizer": str(tokenizer_dir / "tokenizer.json"),
    }
    return apply_overrides(ctx.recipe.train_config_dict(), overrides)


def _read_marker(path: Path) -> dict[str, Any]:
    """The training step's record of what its run directory was trained from (empty if none)."""
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or a format this version does not write: the run is not resumed
    return marker if isinstance(marker, dict) else {}


def _hash_file(path: Path) -> str:
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def training_data(workdir: Path, blend_file: Path, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the training step reads, by content: the blend file and each shard's .bin and .idx
    (xxh3-128, names relative to the work directory, so a moved work directory keeps them).
    A file whose size and mtime are those `previous` recorded keeps its recorded digest: a
    re-run over shards nobody rewrote reads none of them."""
    from tokenmill.tokenize.blend import load_blend_file
    from tokenmill.tokenize.indexed import bin_path, idx_path

    paths = [blend_file]
    for entry in load_blend_file(blend_file):
        paths += [bin_path(entry.prefix), idx_path(entry.prefix)]
    known = (previous or {}).get("files", {})
    files: dict[str, dict[str, Any]] = {}
    for path in paths:
        name = os.path.relpath(path, workdir)
        stat = path.stat()
        record = known.get(name) or {}
        if record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns and record.get("xxh3"):
            digest = record["xxh3"]
        else:
            digest = _hash_file(path)
        files[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "xxh3": digest}
    combined = json.dumps(sorted((name, f["xxh3"]) for name, f in files.items()))
    import xxhash

    return {"digest": xxhash.xxh3_128_hexdigest(combined.encode()), "files": files}


def _changed_files(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    old = {name: f.get("xxh3") for name, f in before.get("files", {}).items()}
    changed = [name for name, f in now["files"].items() if old.get(name) != f["xxh3"]]
    return changed + [name for name in old if name not in now["files"]] or ["unknown"]


def _resume_note(run_dir: Path) -> str:
    """Which checkpoint the trainer resumes (it says itself when that one finished training)."""
    from tokenmill.train.checkpoint_files import LATEST

    latest = run_dir / "checkpoints" / LATEST
    name = latest.read_text().strip() if latest.is_file() else ""
    return f"resuming from the latest checkpoint in {run_dir / 'checkpoints'}" + (f" ({name})" if name else "")


# How often a run on a work directory URL looks for a new checkpoint of its training step to upload.
CHECKPOINT_POLL_SECONDS = 5.0


def run_training(ctx: Context, step: Step) -> dict[str, Any]:
    """The training step: the trainer runs in a process of its own (the cores go to it: the
    Dask client is closed first), supervised until it ends; its last metrics."""
    ctx.close_client()
    config = train_config(ctx, step)
    step.output.mkdir(parents=True, exist_ok=True)
    config_path = step.output / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = step.output / "run"
    resume = _keep_or_start_afresh(ctx, step, run_dir)
    argv = _trainer_argv(ctx, config_path, run_dir, resume)
    rc = _supervise(ctx, step, run_dir, argv)
    from tokenmill.train.stop import STOPPED_EXIT, TrainingStopped

    if rc == STOPPED_EXIT:
        raise TrainingStopped(f"training stopped at a checkpoint on request in {run_dir}; re-run to resume it")
    if rc != 0:
        raise TokenmillError(
            f"training failed (exit status {rc}); fix the cause and re-run: it resumes from the last checkpoint"
        )
    metrics = read_metrics(run_dir)
    last = metrics[-1] if metrics else {}
    return {
        "run_dir": str(run_dir.relative_to(ctx.workdir)),
        "steps": last.get("step"),
        "loss": last.get("loss"),
        "val_loss": next((m["val_loss"] for m in reversed(metrics) if "val_loss" in m), None),
    }


def _keep_or_start_afresh(ctx: Context, step: Step, run_dir: Path) -> bool:
    """Whether the trainer resumes from the checkpoints in `run_dir`; the run directory is
    removed first when they were made from another config or other data."""
    # Checkpoints are resumed only by the run that made them: a changed config upstream means a
    # different fingerprint, and a re-run upstream step (--from, --force) that wrote other
    # shards means other data under the same fingerprint. Either way training starts afresh.
    marker = step.output / "fingerprint"
    recorded = _read_marker(marker)
    data = training_data(ctx.workdir, ctx.steps[StepRef.blend()].output / "blend.json", recorded.get("data"))
    if run_dir.exists():
        if recorded.get("fingerprint") != step.fingerprint:
            log.info(f"  the training config or its inputs changed since {run_dir} was written: starting afresh")
            shutil.rmtree(run_dir)
        elif recorded.get("data", {}).get("digest") != data["digest"]:
            changed = _changed_files(recorded.get("data", {}), data)
            log.info(
                f"  the training data changed since {run_dir} was written ({', '.join(changed)}): "
                "starting afresh, not from its checkpoints"
            )
            shutil.rmtree(run_dir)
    atomic_write_text(marker, json.dumps({"fingerprint": step.fingerprint, "data": data}, indent=2) + "\n")
    return (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))


def _trainer_argv(ctx: Context, config_path: Path, run_dir: Path, resume: bool) -> list[str]:
    """`tokenmill train` on the step's config, logged as it runs."""
    spec = ctx.recipe.train
    assert spec is not None
    # Inside a Slurm job the trainer spans the allocation (`srun ... torchrun ...`, recipe_job.py).
    from tokenmill.infra.slurm import TRAIN_LAUNCHER_ENV

    launcher = shlex.split(os.environ.get(TRAIN_LAUNCHER_ENV, "")) or [sys.executable]
    argv = [*launcher, "-m", "tokenmill.train.worker", str(config_path), *spec.extra_args]
    if resume:
        argv.append("--resume")
        log.info(f"  config and data unchanged: {_resume_note(run_dir)}")
    if not ctx.progress:
        argv.append("--no-progress")
    log.info(f"  $ train {' '.join(argv[argv.index('tokenmill.train.worker') + 1 :])}")
    return argv


def _supervise(ctx: Context, step: Step, run_dir: Path, argv: list[str]) -> int:
    """Run the trainer and wait for it: SIGTERM ends it with this run, SIGUSR1 asks it to
    checkpoint and stop; for a remote work directory each new checkpoint is uploaded while it
    runs, and the one a failure or stop left after it ends. Its exit status."""
    spec = ctx.recipe.train
    assert spec is not None
    from tokenmill.train.launch import child_env
    from tokenmill.train.lifecycle import PIPELINE_PID_ENV

    # The trainer imports the installed package whatever the cwd holds, and ends with this run.
    env = {
        **child_env(ctx.recipe.train_world_size()),
        PIPELINE_PID_ENV: str(os.getpid()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    process = subprocess.Popen(argv, env=env)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the trainer below is stopped with us, not orphaned

    import threading

    from tokenmill.train.stop import request_stop

    def on_sigusr1(signum: int, frame: Any) -> None:
        request_stop(run_dir)  # the trainer checkpoints and stops (train/stop.py)

    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    previous_usr1 = signal.signal(signal.SIGUSR1, on_sigusr1) if in_main else None
    uploaded = None
    try:
        while True:
            try:
                rc = process.wait(timeout=None if ctx.remote is None else CHECKPOINT_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                uploaded = ctx.remote.push_checkpoint(step, run_dir, uploaded)
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGUSR1, previous_usr1)
    if ctx.remote is not None and rc != 0:
        # The checkpoint a stop (or a failure) left, for a rerun on any machine to resume from.
        ctx.remote.push_checkpoint(step, run_dir, uploaded)
    return rc
