"""The code paths a GPU run takes, on the CPU: FSDP2 on one process with bf16 through its
mixed-precision policy, the selectable attention kernel, `torch.compile` per block (with and
without activation checkpointing), the model built on the meta device and initialized on the
training device, fused AdamW over FSDP2's DTensor parameters, and the peak FLOP/s for MFU."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from tokenmill.errors import ConfigError
from tokenmill.infra.flags import CommandParser
from tokenmill.train.cli import register, worker_argv
from tokenmill.train.loop import build_engine, describe_engine
from tokenmill.train.metrics import device_peak_flops, peak_flops, read_metrics
from tokenmill.train.model import GPT
from tokenmill.train.optim import adamw_implementation
from tokenmill.train.parallel.mesh import release_own_group

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_parallel import CLIP, LR, MICRO_BATCH, batches, tiny_config  # noqa: E402

# bf16 keeps 8 bits of mantissa: over 3 steps of the tiny model the mean loss (about 4.9)
# moves by ~1e-4 against fp32; 2e-3 leaves room for other CPUs' kernels and still fails a
# path that drops the fp32 loss or reduce.
BF16_LOSS_TOLERANCE = 2e-3


@pytest.fixture(autouse=True)
def _no_group_left() -> None:
    """An engine built directly (not by `train`) leaves its group of one: end it per test."""
    yield
    release_own_group()


def train(parallel: dict | None = None, model: dict | None = None, steps: int = 3):
    """(engine, losses) of `steps` steps of the small GPT under `parallel`, via the loop's
    `build_engine` (the path `tokenmill train` takes)."""
    cfg = tiny_config(model, parallel)
    torch.manual_seed(cfg.schedule.seed)
    engine = build_engine(cfg)
    losses = []
    for tokens in batches()[:steps]:
        losses.append(engine.train_step(tokens, MICRO_BATCH))
        engine.clip_grad_norm(CLIP)
        engine.optimizer_step(LR)
    return engine, losses


def full_params(engine) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = {}
    for part in engine.model_parts:
        params.update(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))
    return params


def test_fsdp2_on_one_process_equals_the_plain_engine_and_bf16_stays_close() -> None:
    plain, fp32 = train()
    assert plain.mesh is None and not torch.distributed.is_initialized()  # one process: no group
    fsdp, fsdp_fp32 = train({"zero": 3})
    assert fsdp.mesh is not None  # FSDP2 on one process: a group of one, no launcher
    assert all(isinstance(p, DTensor) for p in fsdp.parameters())
    assert fsdp_fp32 == pytest.approx(fp32, abs=1e-5)
    reference = full_params(plain)
    for name, value in full_params(fsdp).items():
        torch.testing.assert_close(value, reference[name], atol=1e-5, rtol=1e-4, msg=name)

    bf16_engine, bf16 = train({"zero": 3, "precision": "bf16"})
    assert bf16 == pytest.approx(fp32, abs=BF16_LOSS_TOLERANCE)
    assert bf16 != fp32  # bf16 matmuls ran
    # The stored (sharded) weights and the optimizer state stay fp32.
    assert all(p.dtype == torch.float32 for p in bf16_engine.parameters())
    state = bf16_engine.optimizer.state
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_fsdp2_bf16_gathers_bf16_weights_and_reduces_fp32_gradients() -> None:
    cfg = tiny_config(None, {"zero": 2, "precision": "bf16"})
    torch.manual_seed(cfg.schedule.seed)
    engine = build_engine(cfg)
    (model,) = engine.model_parts
    seen: dict[str, torch.dtype] = {}
    wq = model.layers["0"].attention.wq
    wq.register_forward_hook(lambda module, args, out: seen.update(weight=module.weight.dtype, out=out.dtype))
    model.output.register_forward_hook(lambda module, args, out: seen.update(logits=out.dtype))
    engine.train_step(batches()[0], MICRO_BATCH)
    # Gathered in bf16 for the forward (no autocast: the parameters themselves are bf16) ...
    assert seen == {"weight": torch.bfloat16, "out": torch.bfloat16, "logits": torch.bfloat16}
    assert not torch.is_autocast_enabled("cpu")
    # ... and the gradients land on the fp32 shards.
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in engine.parameters())
    line = describe_engine(cfg, engine)
    assert "bf16 (FSDP2 bf16 parameters, fp32 reduce)" in line and "optimizer AdamW for-loop" in line


def test_bf16_without_fsdp_keeps_autocast() -> None:
    _, fp32 = train()
    engine, bf16 = train({"precision": "bf16"})
    assert engine.mesh is None
    assert bf16 == pytest.approx(fp32, abs=BF16_LOSS_TOLERANCE)
    assert "bf16 (autocast, fp32 weights)" in describe_engine(engine.cfg, engine)


def test_attention_backend_applies_to_forward_and_backward() -> None:
    _, auto = train(steps=2)
    cfg = tiny_config(None, {"attention_backend": "math"})
    torch.manual_seed(cfg.schedule.seed)
    engine = build_engine(cfg)
    flags: list[tuple[bool, bool]] = []

    def record(*_):
        flags.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))

    attention = engine.model_parts[0].layers["0"].attention
    attention.register_forward_hook(record)
    attention.register_full_backward_hook(record)
    losses = [engine.train_step(tokens, MICRO_BATCH) for tokens in batches()[:1]]
    # A forward and a backward per micro-batch, each with the math kernel only.
    assert flags == [(False, True)] * 2 * (len(batches()[0]) // MICRO_BATCH)
    assert torch.backends.cuda.flash_sdp_enabled()  # restored after the step
    assert losses[0] == pytest.approx(auto[0], abs=1e-5)
    assert "attention math" in describe_engine(cfg, engine)


@pytest.mark.parametrize("parallel", [{}, {"zero": 3}])
def test_an_unavailable_attention_backend_is_a_one_line_error(parallel: dict) -> None:
    # The CPU has no cuDNN attention (it has flash and math).
    cfg = tiny_config(None, {**parallel, "attention_backend": "cudnn"})
    with pytest.raises(ConfigError) as error:
        build_engine(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("parallel.attention_backend: the cudnn attention kernel is not available on cpu")
    train({"attention_backend": "flash"}, steps=1)  # the CPU's flash kernel runs


@pytest.mark.slow  # inductor's first CPU compile takes a minute; the rest hit its cache
@pytest.mark.parametrize("checkpointing", ["off", "full", "selective"])
def test_compile_per_block_gives_the_eager_losses(checkpointing: str) -> None:
    torch._dynamo.reset()
    _, eager = train({"activation_checkpointing": checkpointing}, steps=2)
    engine, compiled = train({"activation_checkpointing": checkpointing, "compile": True}, steps=2)
    blocks = list(engine.model_parts[0].layers.values())
    assert all(block._compiled_call_impl is not None for block in blocks)  # each block, not the model
    assert engine.model_parts[0]._compiled_call_impl is None
    assert compiled == pytest.approx(eager, abs=1e-4)


@pytest.mark.parametrize("model", [{"flavour": "llama", "n_kv_heads": 2}, {"tie_embeddings": True}])
def test_the_model_is_built_on_meta_and_initialized_on_the_device(monkeypatch, model: dict) -> None:
    cfg = tiny_config(model)
    torch.manual_seed(cfg.schedule.seed)
    eager = GPT(cfg.model)  # built and drawn on the CPU directly
    drawn_on: set[str] = set()
    original = GPT.init_parameter

    def spy(self, name, tensor):
        drawn_on.add(tensor.device.type)
        return original(self, name, tensor)

    monkeypatch.setattr(GPT, "init_parameter", spy)
    # build_engine makes the model on the meta device: nothing is drawn until it has a device.
    for parallel in ({}, {"zero": 3}):
        torch.manual_seed(cfg.schedule.seed)
        engine = build_engine(tiny_config(model, parallel))
        assert drawn_on == {"meta", "cpu"}
        drawn_on.clear()
        params = full_params(engine)
        for name, value in eager.state_dict().items():
            torch.testing.assert_close(params[name], value, rtol=0, atol=0, msg=name)
        if eager.rope is not None:
            torch.testing.assert_close(engine.model_parts[0].rope, eager.rope)
        head = engine.model_parts[0].output.weight
        assert (head is engine.model_parts[0].tok_embeddings.weight) == bool(model.get("tie_embeddings"))


def test_fused_adamw_steps_fsdp2_dtensor_parameters_as_the_for_loop_does() -> None:
    engine, _ = train({"zero": 3}, steps=1)
    assert adamw_implementation(engine.optimizer) == "for-loop"  # CPU: build_optimizer fuses on CUDA only
    engine.train_step(batches()[1], MICRO_BATCH)
    params = list(engine.parameters())
    grads = [p.grad.detach().clone() for p in params]
    results = []
    for fused in (False, True):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for copy, grad in zip(copies, grads):
            copy.grad = grad.clone()
        optimizer = torch.optim.AdamW(copies, lr=LR, fused=fused)
        assert adamw_implementation(optimizer) == ("fused" if fused else "for-loop")
        optimizer.step()
        optimizer.step()
        results.append([c.detach().full_tensor() for c in copies])
    for loop, fused in zip(*results):
        torch.testing.assert_close(fused, loop, atol=1e-6, rtol=1e-5)


def test_peak_flops_from_the_device_name(monkeypatch, caplog) -> None:
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert device_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert device_peak_flops("NVIDIA H200") == 989e12
    assert device_peak_flops("NVIDIA H100 80GB HBM3", float8=True) == 2 * 989e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB", float8=True) is None  # no fp8 tensor cores
    assert peak_flops(torch.device("cpu"), None) is None
    assert peak_flops(torch.device("cpu"), 100.0, float8=True) == 100e12  # --peak-tflops wins

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert peak_flops(torch.device("cuda", 0), None, float8=True) == 2 * 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU 9000")
    with caplog.at_level(logging.WARNING, logger="tokenmill.train.metrics"):
        assert peak_flops(torch.device("cuda", 0), None) is None
        assert peak_flops(torch.device("cuda", 0), None) is None
    (record,) = caplog.records  # once per device name
    assert "'Mystery GPU 9000'" in record.getMessage() and "--peak-tflops" in record.getMessage()


def test_the_gpu_flags_reach_the_config_and_the_ranks(tmp_path) -> None:
    from tokenmill.train import worker
    from tokenmill.train.cli import load_train_config

    parser = CommandParser()
    register(parser.add_subparsers())
    flags = ["--precision", "bf16", "--attention-backend", "flash", "--activation-checkpointing", "selective"]
    flags += ["--compile", "--activation-offload", "--peak-tflops", "756"]
    args = parser.parse_args(["train", "tiny", *flags])
    _, cfg = load_train_config(args)
    p = cfg.parallel
    assert (p.precision, p.attention_backend, p.activation_checkpointing, p.compile, p.activation_offload) == (
        "bf16",
        "flash",
        "selective",
        True,
        True,
    )
    assert cfg.logging.peak_tflops == 756
    ranks = worker.build_parser().parse_args(worker_argv(args))
    gpu_flags = ("precision", "attention_backend", "activation_checkpointing", "compile", "activation_offload")
    for name in (*gpu_flags, "peak_tflops"):
        assert getattr(ranks, name) == getattr(args, name), name
    bad = parser.parse_args(["train", "tiny", "--attention-backend", "fast"])
    with pytest.raises(ConfigError, match="--attention-backend: must be one of .*, got .fast."):
        load_train_config(bad)


def test_tokenmill_train_fsdp2_bf16_on_one_process_checkpoints_and_resumes(shakespeare_shard, tmp_path) -> None:
    import torch.distributed as dist

    from tokenmill.cli import main

    common = ["train", "tiny", "--data", str(shakespeare_shard), "--no-progress", "--zero", "3", "--precision", "bf16"]
    assert main([*common, "--out", str(tmp_path / "whole"), "--steps", "4"]) == 0
    assert not dist.is_initialized()  # the run's group of one ended with it
    whole = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "whole")}
    split = tmp_path / "split"
    assert main([*common, "--out", str(split), "--steps", "2"]) == 0
    assert main([*common, "--out", str(split), "--steps", "4", "--resume"]) == 0
    resumed = {r["step"]: r["loss"] for r in read_metrics(split)}
    assert resumed[4] == pytest.approx(whole[4], abs=1e-6)  # the run's last row (logging.interval 5)
