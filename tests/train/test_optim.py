"""LR schedule and batch ramp-up against Megatron-LM's formulas; gradient accumulation."""

from __future__ import annotations

import math

import pytest
import torch

from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset
from tokenmill.train.optim import Schedule, megatron_lr, rampup_batch_size


def reference_lr(n, max_lr, min_lr, warmup, decay, style):
    """Megatron's OptimizerParamScheduler.get_lr, transcribed term by term."""
    if warmup > 0 and n <= warmup:
        return 0.0 + (max_lr - 0.0) * float(n) / float(warmup)
    if style == "constant":
        return max_lr
    if n > decay:
        return min_lr
    decay_ratio = float(n - warmup) / float(decay - warmup)
    delta = max_lr - min_lr
    coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0) if style == "cosine" else 1.0 - decay_ratio
    return min_lr + coeff * delta


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_lr_matches_megatron(style: str) -> None:
    # MT-NLG: warm-up over 1B tokens, decay to 10% over 340B tokens, 2048-token samples.
    warmup, decay = 1_000_000_000 // 2048, 340_000_000_000 // 2048
    for n in [0, 1, 1000, warmup - 1, warmup, warmup + 1, decay // 3, decay // 2, decay - 1, decay, decay + 5]:
        ours = megatron_lr(n, max_lr=5e-5, min_lr=5e-6, warmup_samples=warmup, decay_samples=decay, style=style)
        assert ours == reference_lr(n, 5e-5, 5e-6, warmup, decay, style)
    assert megatron_lr(0, max_lr=1, min_lr=0.1, warmup_samples=10, decay_samples=110) == 0.0
    assert megatron_lr(60, max_lr=1, min_lr=0.1, warmup_samples=10, decay_samples=110) == pytest.approx(0.55)


def reference_rampup(consumed, start, incr, ramp_samples, gbs):
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator.update."""
    num_increments = (gbs - start) // incr
    per_increment = ramp_samples / num_increments
    if consumed > ramp_samples:
        return gbs
    steps = int(consumed / per_increment)
    return start + steps * incr


def test_rampup_matches_megatron_mtnlg() -> None:
    # MT-NLG: 32 -> 1920 in steps of 32 over the first 12B tokens (2048-token samples).
    ramp = [32, 32, 12_000_000_000 // 2048]
    for consumed in [0, 1, 99_311, 99_312, 1_000_000, 5_859_374, 5_859_375, 5_859_376, 10**8]:
        assert rampup_batch_size(consumed, 1920, ramp) == reference_rampup(consumed, *ramp, 1920)
    assert rampup_batch_size(0, 1920, ramp) == 32
    assert rampup_batch_size(10**8, 1920, ramp) == 1920


def test_schedule_steps_through_rampup() -> None:
    cfg = TrainConfig(
        schedule={
            "global_batch_size": 16,
            "micro_batch_size": 4,
            "rampup_batch_size": [4, 4, 24],
            "steps": 10,
            "warmup_steps": 1,
        }
    ).validate()
    sched = Schedule(cfg)
    consumed, sizes = 0, []
    for _ in range(10):
        sizes.append(sched.batch_size(consumed))
        consumed += sizes[-1]
    # per increment 24/3 = 8 samples: consumed 0,4 -> 4; 8 -> 8; 16 -> 12; 28 > 24 -> 16
    assert sizes == [4, 4, 8, 12, 16, 16, 16, 16, 16, 16]
    assert sched.total_samples == sum(sizes)
    assert sched.warmup_samples == 16 and sched.decay_samples == sum(sizes)
    assert sched.lr(0) == 0.0 and sched.lr(sum(sizes) + 1) == cfg.optimizer.min_lr


def test_gradient_accumulation_equals_one_big_batch() -> None:
    torch.manual_seed(0)
    cfg = TrainConfig(schedule={"global_batch_size": 8}, parallel={"device": "cpu"}).validate()
    a = Engine(cfg, GPT(preset("tiny")))
    b = Engine(cfg, GPT(preset("tiny")))
    b.model_parts[0].load_state_dict(a.model_parts[0].state_dict())
    tokens = torch.randint(0, 512, (8, 33))
    loss_a = a.train_step(tokens, micro_batch_size=8)
    loss_b = b.train_step(tokens, micro_batch_size=2)
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-7)
    assert a.clip_grad_norm(1.0) == pytest.approx(b.clip_grad_norm(1.0), rel=1e-5)


def test_weight_decay_only_on_matrices() -> None:
    engine = Engine(TrainConfig(parallel={"device": "cpu"}).validate(), GPT(preset("tiny")))
    decay, no_decay = engine.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
