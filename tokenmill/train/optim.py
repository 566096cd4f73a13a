"""AdamW, the learning-rate schedule and batch-size ramp-up, as Megatron-LM defines them.

Both the schedule and the ramp-up are functions of ``consumed_samples`` (Megatron's
sample-based mode, the one MT-NLG's token-based warm-up and ramp-up need), so they are
pure functions of the data position and a resumed run recomputes them exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from tokenmill.train.config import TrainConfig


def build_optimizer(named_parameters: Iterable[tuple[str, nn.Parameter]], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms), fused on CUDA."""
    decay, no_decay = [], []
    for _, param in named_parameters:
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.optimizer.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    on_cuda = bool(decay) and decay[0].device.type == "cuda"
    return torch.optim.AdamW(
        groups,
        lr=cfg.optimizer.lr,
        betas=(cfg.optimizer.beta1, cfg.optimizer.beta2),
        eps=cfg.optimizer.eps,
        fused=True if on_cuda else None,
    )


def adamw_implementation(optimizer: torch.optim.Optimizer) -> str:
    """Which AdamW kernel steps: "fused" (one CUDA kernel for all parameters), "foreach"
    (batched per-op kernels; torch's default for CUDA tensors) or "for-loop" (one parameter at a time)."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach"):
        return "foreach"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if defaults.get("foreach") is None and params and params[0].device.type == "cuda":
        return "foreach"
    return "for-loop"


def megatron_lr(
    num_samples: float,
    *,
    max_lr: float,
    min_lr: float,
    warmup_samples: int,
    decay_samples: int,
    style: str = "cosine",
) -> float:
    """Megatron's OptimizerParamScheduler.get_lr (init_lr 0): linear warm-up, then decay of
    ``max_lr -> min_lr`` over ``decay_samples`` (counted from 0, warm-up included)."""
    if warmup_samples > 0 and num_samples <= warmup_samples:
        return max_lr * num_samples / warmup_samples
    if style == "constant":
        return max_lr
    if num_samples > decay_samples:
        return min_lr
    ratio = (num_samples - warmup_samples) / max(decay_samples - warmup_samples, 1)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ValueError(f"unknown decay style {style!r}")
    return min_lr + coeff * (max_lr - min_lr)


def rampup_batch_size(consumed_samples: int, global_batch_size: int, rampup: list[int] | None) -> int:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator: start + k*increment, where k grows
    every ramp_samples / num_increments consumed samples, then the full global batch."""
    if rampup is None:
        return global_batch_size
    start, increment, ramp_samples = rampup
    num_increments = (global_batch_size - start) // increment
    if num_increments == 0 or consumed_samples > ramp_samples:
        return global_batch_size
    per_increment = ramp_samples / num_increments
    return min(start + int(consumed_samples / per_increment) * increment, global_batch_size)


class Schedule:
    """Batch size and learning rate for the step that starts at ``consumed_samples``."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        gbs = cfg.schedule.global_batch_size
        self.total_samples = self.samples_after(cfg.schedule.steps)
        if cfg.schedule.warmup_samples is not None:
            self.warmup_samples = cfg.schedule.warmup_samples
        else:
            self.warmup_samples = (cfg.schedule.warmup_steps or 0) * gbs
        if cfg.schedule.decay_samples is not None:
            self.decay_samples = cfg.schedule.decay_samples
        elif cfg.schedule.decay_steps is not None:
            self.decay_samples = cfg.schedule.decay_steps * gbs
        else:
            self.decay_samples = self.total_samples

    def batch_size(self, consumed_samples: int) -> int:
        return rampup_batch_size(
            consumed_samples, self.cfg.schedule.global_batch_size, self.cfg.schedule.rampup_batch_size
        )

    def lr(self, consumed_samples: int) -> float:
        # Megatron steps its scheduler by the batch size *after* each iteration, so step i
        # trains with the LR of the samples consumed before it (step 0: LR 0 with warm-up).
        return megatron_lr(
            consumed_samples,
            max_lr=self.cfg.optimizer.lr,
            min_lr=self.cfg.optimizer.min_lr,
            warmup_samples=self.warmup_samples,
            decay_samples=self.decay_samples,
            style=self.cfg.schedule.decay_style,
        )

    def samples_after(self, steps: int) -> int:
        consumed = 0
        for _ in range(steps):
            consumed += self.batch_size(consumed)
        return consumed
