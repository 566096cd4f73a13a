"""`tokenmill train` and `tokenmill export-hf`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tokenmill.entry import interrupted_line, said_by_parent
from tokenmill.errors import ConfigError
from tokenmill.infra.cpu import set_torch_threads
from tokenmill.infra.flags import field_argument
from tokenmill.infra.slurm_options import add_slurm_options, check_slurm_only_options

if TYPE_CHECKING:
    from tokenmill.train.config import ConfigFlag, TrainConfig
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
    train = subparsers.add_parser(
        "train", help=TRAIN_HELP, description=TRAIN_DESCRIPTION, arguments=add_train_arguments
    )
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
    """The arguments of `tokenmill train`, which the ranks' entry point (worker.py) parses too:
    the config, --resume, the Slurm options, and a flag for each config key declared with
    `config.flag`, which overrides it."""
    train.add_argument(
        "config", help=f"training config: a YAML file, or the name of a bundled one ({_bundled_names()})"
    )
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="CHECKPOINT",
        help="continue from the run's latest checkpoint, or from CHECKPOINT",
    )
    for _, flag, kwargs in _config_flags():
        train.add_argument(flag, **kwargs)
    add_slurm_options(train, dry_run=True)


def _config_flags() -> list[tuple[ConfigFlag, str, dict[str, Any]]]:
    """Each config key `tokenmill train` takes as a flag, with the flag and its argparse keywords;
    a flag not given is None, so that only the keys given override the config's."""
    from tokenmill.train.config import config_flags  # pydantic: loads when `train` is parsed

    out = []
    for key in config_flags():
        dest = key.name.removeprefix("--").replace("-", "_") if key.name else key.key.rpartition(".")[2]
        extra: dict[str, Any] = {"default": None, "dest": dest}
        if key.choices:
            extra["metavar"] = "{" + ",".join(key.choices) + "}"  # checked by the config, with a suggestion
        elif key.metavar:
            extra["metavar"] = key.metavar
        flag, kwargs = field_argument(dest, key.kind, key.default, flag=key.name, extra=extra)
        if key.kind is bool:
            kwargs["help"] = f"{key.help}; sets `{key.key}: {str(kwargs['action'] == 'store_true').lower()}`"
        else:
            kwargs["help"] = f"{key.help}; overrides `{key.key}`"
        out.append((key, flag, kwargs))
    return out


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
    flags = _config_flags()
    # Each flag given sets its key in the nested config. A bad value given on the command line
    # is named by its flag, not by the file it overrides (for a bundled config, a file inside
    # the installed package).
    cfg = load_config(
        config_path,
        {key.key: getattr(args, kwargs["dest"]) for key, _, kwargs in flags},
        flags={key.key: flag for key, flag, _ in flags},
        name=f"bundled config {args.config!r}" if bundled else None,
    )
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
    from tokenmill.train.launch import check_torchrun_restarts

    check_torchrun_restarts()
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
    for key, flag, kwargs in _config_flags():
        value = getattr(args, kwargs["dest"])
        if value is not None:
            argv += [flag] if key.kind is bool else [flag, str(value)]
    if args.resume is True:
        argv.append("--resume")
    elif args.resume:
        argv += ["--resume", str(args.resume)]
    return argv


def run_export(args: argparse.Namespace) -> int:
    from tokenmill.train.export_hf import export_hf

    out = export_hf(args.checkpoint, args.outdir)
    log.info(f"exported to {out}")
    return 0
