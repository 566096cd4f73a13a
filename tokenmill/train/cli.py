"""`tokenmill train` and `tokenmill export-hf`."""

from __future__ import annotations

import argparse
import os

from tokenmill.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train", help="train a GPT model on token shards",
        description="Train on a shard prefix or blend; re-launches itself under torchrun when tp*pp*dp > 1.",
    )
    train.add_argument("config", help="training config YAML (see recipes/train-tiny.yaml)")
    train.add_argument("--data", help="shard prefix (PREFIX.bin/.idx) or blend file; overrides `data:`")
    train.add_argument("--out", help="run directory (checkpoints, metrics.jsonl, tensorboard/)")
    train.add_argument("--steps", type=int, help="total training steps (counted from step 0)")
    train.add_argument("--resume", nargs="?", const=True, default=False, metavar="CHECKPOINT",
                       help="continue from the run's latest checkpoint, or from CHECKPOINT")
    for name in ("tp", "pp", "dp", "zero"):
        train.add_argument(f"--{name}", type=int, help=f"override `{name}:`")
    train.add_argument("--device", help="auto, cpu, cuda, cuda:N")
    train.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    train.set_defaults(func=run_train)

    export = subparsers.add_parser(
        "export-hf", help="export a checkpoint to a Hugging Face model directory",
        description="Write safetensors + config.json (+ tokenizer) loadable by transformers.",
    )
    export.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its latest)")
    export.add_argument("outdir", help="output directory")
    export.set_defaults(func=run_export)


def run_train(args: argparse.Namespace) -> int:
    from tokenmill.train.config import load_config
    from tokenmill.train.launch import launch_torchrun, under_torchrun
    from tokenmill.train.loop import train

    overrides = {"data": args.data, "out": args.out, "steps": args.steps, "tp": args.tp, "pp": args.pp,
                 "dp": args.dp, "zero": args.zero, "device": args.device}
    if args.no_progress:
        overrides["progress"] = False
    cfg = load_config(args.config, overrides)
    if cfg.world_size > 1 and not under_torchrun():
        return launch_torchrun(cfg.world_size, _train_argv(args))
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != cfg.world_size:
            raise ConfigError(
                f"tp x pp x dp = {cfg.world_size} but torchrun started {os.environ['WORLD_SIZE']} processes"
            )
    result = train(cfg, resume=args.resume)
    if result.losses and int(os.environ.get("RANK", "0")) == 0:
        last = max(result.losses)
        print(f"trained to step {result.step}: loss {result.losses[last]:.4f}; checkpoint {result.checkpoint}")
    return 0


def _train_argv(args: argparse.Namespace) -> list[str]:
    """The same `train` command line, for each rank under torchrun."""
    argv = ["train", args.config]
    for name in ("data", "out", "steps", "tp", "pp", "dp", "zero", "device"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name}", str(value)]
    if args.resume is True:
        argv.append("--resume")
    elif args.resume:
        argv += ["--resume", str(args.resume)]
    if args.no_progress:
        argv.append("--no-progress")
    return argv


def run_export(args: argparse.Namespace) -> int:
    from tokenmill.train.export_hf import export_hf

    out = export_hf(args.checkpoint, args.outdir)
    print(f"exported to {out}")
    return 0
