"""The device the GPU checks run on, and `tokenmill train` driven in-process.

`TOKENMILL_GPU_TESTS_DEVICE=cpu` runs the checks on the CPU instead (the dry run of
bench/gpu_check.sh and CI do), with those that need a model too large for the CPU skipped, each
with its reason. The data is made from this repository's own text (tests/gpu/repo_data.py),
since only the working tree reaches the GPU machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

DEVICE_ENV = "TOKENMILL_GPU_TESTS_DEVICE"


def pick_device() -> str | None:
    """The device the checks run on: the variable's, else cuda when torch sees one, else None."""
    if os.environ.get(DEVICE_ENV):
        return os.environ[DEVICE_ENV]
    import torch

    return "cuda" if torch.cuda.is_available() else None


DEVICE = pick_device()
ON_CUDA = bool(DEVICE and DEVICE.startswith("cuda"))
NO_DEVICE = f"no CUDA device (torch.cuda.is_available() is False); {DEVICE_ENV}=cpu runs these on the CPU"


def train_config(
    path: Path,
    model: dict,
    *,
    steps: int,
    precision: str,
    batch: int = 16,
    seq: int = 128,
    lr: float = 1.0e-3,  # 3e-3 spiked (grad norm 69 at step 26 on an H100): chaotic curves
    **parallel,
) -> Path:
    """A training config as a user writes it: fixed seed, every step logged, no tensorboard."""
    config = {
        "model": {**model, "max_seq_len": max(seq, 256)},
        "dataset": {"seq_len": seq},
        # decay_steps fixed: a run stopped early with --steps and resumed follows the same schedule.
        "schedule": {
            "steps": steps,
            "decay_steps": steps,
            "global_batch_size": batch,
            "warmup_steps": 10,
            "seed": 1234,
        },
        "optimizer": {"lr": lr, "min_lr": lr / 10},
        "parallel": {"precision": precision, **parallel},
        "logging": {"interval": 1, "tensorboard": False},
        "checkpoint": {"interval": 0, "keep_last": 2},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def train(config: Path, data: Path, out: Path, device: str, *extra: str) -> list[float]:
    """`tokenmill train` in this process; the losses of every step, from metrics.jsonl."""
    from tokenmill.cli import main

    assert (
        main(
            ["train", str(config), "--data", str(data), "--out", str(out), "--device", device, "--no-progress", *extra]
        )
        == 0
    )
    return losses(out)


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r["loss"] for r in rows if "loss" in r}
    return [by_step[s] for s in sorted(by_step)]
