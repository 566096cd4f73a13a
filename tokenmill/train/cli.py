"""`tokenmill train` and `tokenmill export-hf`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tokenmill.entry import interrupted_line, said_by_parent
from tokenmill.errors import ConfigError
from tokenmill.infra.cpu import set_torch_threads
from tokenmill.infra.slurm_options import add_slurm_options, check_slurm_only_options

if TYPE_CHECKING:
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.loop import TrainResult
    from tokenmill.train.preflight import Prepared

log = logging.getLogger(__name__)

# Bundled training configs are tokenmill/recipes/train-<name>.yaml: `tokenmill train tiny`.
RECIPE_PREFIX = "train-"


def _bundled_names() -> str:
    from tokenmill.recipes import bundled_recipes

    return ", ".join(bundled_recipes(RECIPE_PREFIX)) or "none"


TRAIN_HELP = "train a GPT model on token shards"
TRAIN_DESCRIPTION = (
    "Train on a shard prefix or blend; starts one process per rank when tp*pp*dp*cp > 1. "
    "Ctrl-C stops it; SIGUSR1 or SIGTERM (or the file RUN/STOP) makes it write a checkpoint after the "
    "current step and exit with status 99; run the same command with --resume to continue from the last "
    "checkpoint."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help=TRAIN_HELP, description=TRAIN_DESCRIPTION)
    add_train_arguments(train)
    train.set_defaults(func=run_train)

    export = subparsers.add_parser(
        "export-hf",
        help="export a checkpoint to a Hugging Face model directory",
        description="Write safetensors + config.json (+ tokenizer) loadable by transformers.",
    )
    export.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest)")
    export.add_argument("outdir", help="output directory")
    export.set_defaults(func=run_export)

    _register_plan(subparsers)


def _register_plan(subparsers: argparse._SubParsersAction) -> None:
    """`tokenmill plan`, whose estimates (train/layout_planner.py) load when it runs."""
    p = subparsers.add_parser(
        "plan",
        help="rank 4D-parallel layouts (tp, pp, dp, cp, ZeRO, micro-batch) for a model on a cluster",
        description="Estimate memory per GPU and throughput of every (tp, pp, dp, cp, zero, micro-batch) layout "
        "and print the best ones.",
    )
    p.add_argument("--params", type=float, required=True, help="parameter count, e.g. 530e9")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster (tp x pp x dp x cp uses all of them)")
    p.add_argument("--gpu-memory", default="80GiB", help="memory per GPU (default 80GiB)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="GPUs per node; tensor parallelism beyond it crosses the slower network (default 8)",
    )
    p.add_argument("--peak-tflops", type=float, default=312.0, help="dense bf16 peak per GPU (A100: 312)")
    p.add_argument("--layers", type=int, help="override the layer count derived from --params")
    p.add_argument("--hidden", type=int, help="override the hidden size derived from --params")
    p.add_argument("--heads", type=int, help="override the attention heads derived from --params")
    p.add_argument("--vocab-size", type=int, default=51200, help="padded vocabulary size (default 51200)")
    p.add_argument(
        "--optimizer-bytes",
        type=float,
        default=12.0,
        help="K: optimizer bytes per parameter (12: fp32 master + Adam m, v)",
    )
    p.add_argument(
        "--cp",
        default="1",
        metavar="SIZES",
        help="context-parallel sizes to consider, e.g. 1,2,4,8 for long sequences (default 1)",
    )
    p.add_argument("--top", type=int, default=15, help="rows to print")
    p.add_argument("--find", metavar="TP,PP", help="also print the best row with this tp and pp")
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from tokenmill.train.layout_planner import run

    return run(args)


def add_train_arguments(train: argparse.ArgumentParser) -> None:
    """The arguments of `tokenmill train`, which the ranks' entry point (worker.py) parses too."""
    train.add_argument(
        "config", help=f"training config: a YAML file, or the name of a bundled one ({_bundled_names()})"
    )
    train.add_argument("--data", help="shard prefix (PREFIX.bin/.idx) or blend file; overrides `data:`")
    train.add_argument(
        "--out", help="run directory (checkpoints, metrics.jsonl, tensorboard/); one run writes it at a time"
    )
    train.add_argument("--steps", type=int, help="total training steps (counted from step 0)")
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the run's latest checkpoint, or from CHECKPOINT",
    )
    for name, meaning in (
        ("tp", "tensor-parallel size"),
        ("pp", "pipeline-parallel size"),
        ("dp", "data-parallel size"),
        ("cp", "context-parallel size (ring attention; seq_len divisible by 2 x cp)"),
        ("zero", "ZeRO stage 0-3 over the data-parallel ranks"),
    ):
        train.add_argument(f"--{name}", type=int, help=f"{meaning}; overrides `{name}:`")
    train.add_argument("--device", help="auto, cpu, cuda, cuda:N; overrides `device:`")
    train.add_argument("--precision", help="fp32 or bf16; overrides `parallel.precision`")
    train.add_argument(
        "--attention-backend",
        help="SDPA kernel: auto, flash, cudnn, efficient, math; overrides `parallel.attention_backend`",
    )
    train.add_argument(
        "--activation-checkpointing", help="off, full, selective; overrides `parallel.activation_checkpointing`"
    )
    train.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="torch.compile each transformer block; overrides `parallel.compile`",
    )
    train.add_argument(
        "--peak-tflops",
        type=float,
        metavar="TFLOPS",
        help="the device's peak dense TFLOP/s, for MFU (default: known GPUs); overrides `logging.peak_tflops`",
    )
    train.add_argument(
        "--max-restarts",
        type=_non_negative,
        metavar="N",
        help="when a rank fails, restart all ranks from the latest checkpoint, up to N times; "
        "overrides `parallel.max_restarts`",
    )
    train.add_argument(
        "--float8", action="store_true", help="Linear layers in float8 (needs torchao); overrides `parallel.float8`"
    )
    train.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    add_slurm_options(train, dry_run=True)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def restart_resume(cfg: TrainConfig, resume: bool | str) -> bool | str:
    """What a rank resumes from: on a restart (by the supervisor or torchrun), the run's latest
    complete checkpoint (when it has one); otherwise what the command line asked for."""
    from tokenmill.train.checkpoint_files import list_checkpoints

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0:
        return resume
    found = list_checkpoints(cfg.run_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        where = f"from {found[-1]}" if found else "from the start (no checkpoint yet)"
        log.warning("restart %d of %d: resuming %s", restart, cfg.parallel.max_restarts, where)
    return True if found else resume


def run_train(args: argparse.Namespace) -> int:
    """`tokenmill train`: one command line, played in one of four roles (docs/processes.md).

    - a rank (``LOCAL_RANK`` and ``WORLD_SIZE`` set: started by the launcher's supervisor, or
      by torchrun in a Slurm job): `run_rank`;
    - with ``--slurm``, the submitter of a Slurm job whose ranks run under torchrun:
      `submit_slurm_job`;
    - the launcher and supervisor of the ranks, when the run needs several processes or
      restarts: `run_launcher`;
    - otherwise the whole run in this process: `run_single`.

    A trainer started by `tokenmill run` is a launcher or a single process tied to the run's
    lifetime (`tie_to_parents`)."""
    from tokenmill.train.launch import is_rank

    rank = is_rank()
    tie_to_parents(rank)
    config_path, cfg = load_train_config(args)
    check_slurm_only_options(args)
    if args.slurm:
        return submit_slurm_job(args, cfg, config_path)
    if args.dry_run:
        raise ConfigError("--dry-run needs --slurm (it prints the sbatch script)")
    if rank:
        return run_rank(args, cfg)
    try:
        if cfg.world_size > 1 or cfg.parallel.max_restarts > 0:  # restarts need a supervisor too
            return run_launcher(args, cfg, config_path)
        return run_single(args, cfg)
    except KeyboardInterrupt:
        if _trains_for_a_run():  # the run says how it resumes
            raise said_by_parent(KeyboardInterrupt()) from None
        # Ctrl-C: a rerun of the same command without --resume would be refused (the run
        # directory holds checkpoints) or start from step 0, so the hint names --resume.
        raise KeyboardInterrupt(_resume_hint(cfg)) from None


def tie_to_parents(rank: bool) -> None:
    """End this process with the one it must not outlive: the trainer of a `tokenmill run` (and
    so its ranks) with the run. The ranks of `tokenmill train`'s own supervisor are tied to it
    already (rank_server.py); ranks of torchrun (a Slurm job) are left to torchrun."""
    from tokenmill.train.lifecycle import PIPELINE_PID_ENV, die_with_parent, env_pid

    if not rank and env_pid(PIPELINE_PID_ENV):
        die_with_parent(expected_parent=env_pid(PIPELINE_PID_ENV))


def load_train_config(args: argparse.Namespace) -> tuple[str | Path, TrainConfig]:
    """The config file, and the config with the command line's overrides."""
    from tokenmill.recipes import resolve_recipe
    from tokenmill.train.config import load_config

    config_path, bundled = resolve_recipe(args.config, prefix=RECIPE_PREFIX)
    # Each flag sets its key in the nested config.
    overrides = {
        "dataset.path": args.data,
        "out": args.out,
        "schedule.steps": args.steps,
        "parallel.tp": args.tp,
        "parallel.pp": args.pp,
        "parallel.dp": args.dp,
        "parallel.cp": args.cp,
        "parallel.zero": args.zero,
        "parallel.device": args.device,
        "parallel.precision": args.precision,
        "parallel.attention_backend": args.attention_backend,
        "parallel.activation_checkpointing": args.activation_checkpointing,
        "parallel.compile": args.compile,
        "logging.peak_tflops": args.peak_tflops,
    }
    if args.no_progress:
        overrides["logging.progress"] = False
    if args.float8:
        overrides["parallel.float8"] = True
    # A bad value given on the command line is named by its flag, not by the file it overrides
    # (for a bundled config, a file inside the installed package).
    cfg = load_config(
        config_path,
        overrides,
        flags={"dataset.path": "--data", "logging.progress": "--no-progress", "parallel.float8": "--float8"},
        name=f"bundled config {args.config!r}" if bundled else None,
    )
    if args.max_restarts is not None:
        cfg.parallel.max_restarts = args.max_restarts
    return config_path, cfg


def submit_slurm_job(args: argparse.Namespace, cfg: TrainConfig, config_path: str | Path) -> int:
    """`tokenmill train --slurm`: write (and submit, or print with --dry-run) the job script."""
    from tokenmill.train.train_job import submit_training

    submit_training(cfg, worker_argv(args, Path(config_path).resolve()), args)
    return 0


def check_before_start(args: argparse.Namespace, cfg: TrainConfig) -> Prepared | None:
    """Every mistake that needs no process group, reported before torch loads (well under a
    second, not several); None, once said, when the run has nothing left to do."""
    from tokenmill.infra.outputs import check_output
    from tokenmill.train.lifecycle import RUN_OUTPUT, check_run_unlocked
    from tokenmill.train.preflight import nothing_to_do, prepare, refuse_fresh_start

    # Before the data is read: a --out that is a file, or a folder that is no run directory.
    check_output(cfg.out, RUN_OUTPUT, flag="--out")
    prepared = prepare(cfg, resume=args.resume)
    check_run_unlocked(cfg.run_dir)
    refuse_fresh_start(cfg, args.resume)
    done = nothing_to_do(cfg, prepared)
    if done is not None:
        log.log(*done)
        return None
    return prepared


def run_single(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """The whole run in this process, on one device."""
    prepared = check_before_start(args, cfg)
    if prepared is None:
        return 0
    from tokenmill.train.loop import train
    from tokenmill.train.stop import prompt_interrupt

    # torch's default of a thread per core of the machine spins on a busy one (several times
    # slower); the launcher gives each rank its share through OMP_NUM_THREADS instead.
    threads = set_torch_threads()
    if threads is not None:
        log.debug(f"train: {threads} torch thread(s)")

    with prompt_interrupt(lambda: _interrupted_line(cfg)):
        return _finish(cfg, train(cfg, resume=args.resume, prepared=prepared))


def _trains_for_a_run() -> bool:
    """Whether this process is the trainer of a `tokenmill run`."""
    from tokenmill.train.lifecycle import PIPELINE_PID_ENV, env_pid

    return bool(env_pid(PIPELINE_PID_ENV))


def _interrupted_line(cfg: TrainConfig) -> str | None:
    """The line Ctrl-C ends `tokenmill train` with (as run_train's handler gives it); None for
    the trainer of `tokenmill run`, whose run says it."""
    return None if _trains_for_a_run() else interrupted_line(_resume_hint(cfg))


def run_launcher(args: argparse.Namespace, cfg: TrainConfig, config_path: str | Path) -> int:
    """Check everything that needs no rank, once, then start the ranks (worker.py) and
    supervise them (supervisor.py); their exit status is this process's."""
    from tokenmill.train.launch import launch_ranks

    if check_before_start(args, cfg) is None:
        return 0
    return launch_ranks(
        cfg.world_size,
        worker_argv(args, config_path),
        max_restarts=cfg.parallel.max_restarts,
        run_dir=str(cfg.run_dir),
    )


def run_rank(args: argparse.Namespace, cfg: TrainConfig) -> NoReturn:
    """One rank (of the launcher's supervisor, or of torchrun in a Slurm job)."""
    from tokenmill.train.loop import train

    if int(os.environ["WORLD_SIZE"]) != cfg.world_size:
        raise ConfigError(
            f"tp x pp x dp x cp = {cfg.world_size} but the launch started {os.environ['WORLD_SIZE']} processes"
        )
    status = _finish(cfg, train(cfg, resume=restart_resume(cfg, args.resume)))
    from tokenmill.train.parallel.mesh import shutdown_distributed

    shutdown_distributed()
    # A finished rank ends here, without the interpreter's teardown: C++ static destructors
    # of torch and pyarrow can abort a process whose work is done (SIGABRT, "terminate called
    # without an active exception" with no Python frame), which the supervisor would report as a
    # failed rank. Everything this rank owns is closed and flushed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _resume_hint(cfg: TrainConfig) -> str:
    from tokenmill.train.preflight import latest_checkpoint

    try:
        latest = latest_checkpoint(cfg)
    except Exception:  # the hint must not hide the interruption
        latest = None
    if latest is None:
        return "rerun with --resume to continue (there is no checkpoint yet: it starts from step 0)"
    return f"rerun with --resume to continue from the latest checkpoint ({latest})"


def _finish(cfg: TrainConfig, result: TrainResult) -> int:
    """The run's last line (rank 0) and its exit status."""
    from tokenmill.train.preflight import checkpoint_location
    from tokenmill.train.stop import STOPPED_EXIT

    status = STOPPED_EXIT if result.stopped else 0
    checkpoint = checkpoint_location(cfg, result.checkpoint) if result.checkpoint is not None else None
    if int(os.environ.get("RANK", "0")) == 0:
        if result.stopped:
            log.warning(
                f"stopped after step {result.step} on request ({result.stopped}): checkpoint {checkpoint}; "
                f"run again with --resume to continue (exit status {STOPPED_EXIT})"
            )
        elif result.losses:
            last = max(result.losses)
            log.info(f"trained to step {result.step}: loss {result.losses[last]:.4f}; checkpoint {checkpoint}")
    return status


def worker_argv(args: argparse.Namespace, config: str | Path | None = None) -> list[str]:
    """The same `train` arguments for each rank's entry point, ``python -m tokenmill.train.worker
    ARGV`` (``config``: the resolved file); --slurm and its options are the submitter's alone."""
    argv = [str(config or args.config)]
    for name in (
        "data",
        "out",
        "steps",
        "tp",
        "pp",
        "dp",
        "cp",
        "zero",
        "device",
        "precision",
        "attention_backend",
        "activation_checkpointing",
        "peak_tflops",
    ):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if args.compile:
        argv.append("--compile")
    if args.resume is True:
        argv.append("--resume")
    elif args.resume:
        argv += ["--resume", str(args.resume)]
    if args.max_restarts is not None:
        argv += ["--max-restarts", str(args.max_restarts)]
    if args.no_progress:
        argv.append("--no-progress")
    return argv


def run_export(args: argparse.Namespace) -> int:
    from tokenmill.train.export_hf import export_hf

    out = export_hf(args.checkpoint, args.outdir)
    log.info(f"exported to {out}")
    return 0
