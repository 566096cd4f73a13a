"""The engine on one process: activation checkpointing and offload, bf16 autocast with fp32 masters, MFU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.loop import train
from tokenmill.train.metrics import read_metrics
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset
from tokenmill.train.model_transforms import OffloadedBlock


def engine_for(cfg: TrainConfig, state=None) -> Engine:
    torch.manual_seed(0)
    model = GPT(cfg.model)
    if state is not None:
        model.load_state_dict(state)
    return Engine(cfg, model)


OFFLOAD = {"activation_offload": True}


@pytest.mark.parametrize(
    "memory",
    [
        {"activation_checkpointing": "full"},
        {"activation_checkpointing": "selective"},
        OFFLOAD,
        {**OFFLOAD, "activation_checkpointing": "selective"},
    ],
    ids=["full", "selective", "offload", "offload_selective"],
)
def test_activation_checkpointing_and_offload_give_the_same_gradients(memory: dict) -> None:
    model_cfg = preset("tiny-llama", n_layers=3)
    plain = engine_for(TrainConfig(model=model_cfg, parallel={"device": "cpu"}).validate())
    ckpt = engine_for(
        TrainConfig(model=model_cfg, parallel={"device": "cpu", **memory}).validate(),
        plain.model_parts[0].state_dict(),
    )
    tokens = torch.randint(0, 512, (4, 33))
    assert plain.train_step(tokens, 2) == ckpt.train_step(tokens, 2)
    blocks = list(ckpt.model_parts[0].layers.values())
    if memory.get("activation_offload"):
        # Every block's saved tensors went to host memory and back (the parameters stay): 29
        # per micro-batch of a plain block here, only the inputs of a checkpointed one (block 0).
        moved = [block.offloaded_tensors for block in blocks]
        assert all(isinstance(block, OffloadedBlock) for block in blocks)
        if "activation_checkpointing" in memory:
            assert 0 < moved[0] < moved[1], moved
        else:
            assert moved[0] == moved[1] == moved[2] >= 2 * 20, moved
    for (name, a), b in zip(plain.model_parts[0].named_parameters(), ckpt.model_parts[0].parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-8, msg=name)
    # Names are unchanged (checkpoints and parallel plans address parameters by name).
    assert [n for n, _ in plain.model_parts[0].named_parameters()] == [
        n for n, _ in ckpt.model_parts[0].named_parameters()
    ]


def test_bf16_autocast_keeps_fp32_master_weights() -> None:
    cfg = TrainConfig(model=preset("tiny"), parallel={"device": "cpu", "precision": "bf16"}).validate()
    engine = engine_for(cfg)
    fp32 = engine_for(
        TrainConfig(model=preset("tiny"), parallel={"device": "cpu"}).validate(), engine.model_parts[0].state_dict()
    )
    tokens = torch.randint(0, 512, (4, 33))
    loss, ref = engine.train_step(tokens, 4), fp32.train_step(tokens, 4)
    assert loss == pytest.approx(ref, rel=2e-2) and loss != ref  # bf16 matmuls, close to fp32
    engine.clip_grad_norm(1.0)
    engine.optimizer_step(1e-3)
    assert all(p.dtype == torch.float32 for p in engine.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in engine.optimizer.state.values())


def test_mfu_of_a_training_run(shakespeare_shard: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(
        model=preset("tiny", max_seq_len=32),
        out=str(tmp_path),
        dataset={"path": str(shakespeare_shard), "seq_len": 32},
        schedule={"steps": 2, "global_batch_size": 4},
        parallel={"device": "cpu"},
        logging={"tensorboard": False, "progress": False, "peak_tflops": 0.1},
    ).validate()
    train(cfg)
    record = read_metrics(tmp_path)[-1]
    expected = cfg.model.flops_per_token(32) * record["tokens_per_s"] / 0.1e12
    assert record["mfu"] == pytest.approx(expected)
