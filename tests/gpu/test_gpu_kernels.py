"""Two GPU code paths checked on the device itself, each in seconds: ring attention's fused block
kernels (FlashAttention, the memory-efficient kernel) against the plain fp32 block, and training
with activation offload (saved tensors in host memory) against training without it.

On the CPU (`TOKENMILL_GPU_TESTS_DEVICE=cpu`) the blocks are SDPA's CPU flash kernels, and the
offload copies stay in host memory: the same checks, on the CPU's kernels.
"""

from __future__ import annotations

import pytest
import torch
from gpu_runs import DEVICE

from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset
from tokenmill.train.model_transforms import OffloadedBlock
from tokenmill.train.parallel import context_parallel as cp

# Against the fp32 plain block on the same (rounded) inputs: bf16 outputs and gradients keep 8
# bits of mantissa (values here are O(1)); fp32 kernels differ by summation order only.
TOLERANCE = {torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}, torch.float32: {"atol": 2e-5, "rtol": 1e-4}}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_ring_block_kernels_equal_the_plain_block(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 4, 96, 64, generator=g).to(DEVICE, dtype) for _ in range(4))
    # Three documents per row; the half block of keys 48-95 is unseen by the first document's queries.
    ids = torch.tensor([0] * 30 + [1] * 40 + [2] * 26, device=DEVICE).expand(2, 96)
    allowed = (ids[:, :, None] == ids[:, None, 48:])[:, None]
    cases = [
        ("diagonal", q, k, v, True, None),
        ("earlier block, half the keys", q, k[:, :, :48], v[:, :, :48], False, None),
        ("documents", q, k[:, :, 48:], v[:, :, 48:], False, allowed),
    ]
    for name, qq, kk, vv, causal, mask in cases:
        kernel = cp.block_kernel(qq.device.type, dtype, 64, masked=mask is not None)
        out, lse = cp._block_forward(qq, kk, vv, causal, allowed=mask)
        want_out, want_lse = cp._block_forward(qq, kk, vv, causal, kernel=cp.PLAIN, allowed=mask)
        torch.testing.assert_close(out.float(), want_out.float(), **TOLERANCE[dtype], msg=f"{name}: {kernel}")
        torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=1e-3, msg=f"{name}: {kernel} log-sum-exp")
        # The backward pass takes the merged output and log-sum-exp, finite for every query (it
        # sees itself on the diagonal block): here as if another block had added exp(0) = 1.
        merged = torch.logaddexp(want_lse, torch.zeros_like(want_lse))
        got = cp._block_backward(dout, qq, kk, vv, want_out, merged, causal, allowed=mask)
        want = cp._block_backward(dout, qq, kk, vv, want_out, merged, causal, kernel=cp.PLAIN, allowed=mask)
        for grad, ref, what in zip(got, want, ("dq", "dk", "dv")):
            torch.testing.assert_close(grad.float(), ref.float(), **TOLERANCE[dtype], msg=f"{name}: {kernel} {what}")


def test_activation_offload_gives_the_same_step_on_the_device() -> None:
    model = preset("tiny-llama", n_layers=2)
    engines = []
    for offload in (False, True):
        cfg = TrainConfig(model=model, parallel={"device": DEVICE, "precision": "bf16", "activation_offload": offload})
        torch.manual_seed(0)
        engines.append(Engine(cfg.validate(), GPT(model), torch.device(DEVICE)))
    tokens = torch.randint(0, model.vocab_size, (4, 65), generator=torch.Generator().manual_seed(1))
    plain, offloaded = (engine.train_step(tokens, 2) for engine in engines)
    assert offloaded == pytest.approx(plain, rel=1e-6)
    blocks = list(engines[1].model_parts[0].layers.values())
    assert all(isinstance(b, OffloadedBlock) and b.offloaded_tensors > 0 for b in blocks)
    for (name, a), b in zip(engines[0].model_parts[0].named_parameters(), engines[1].model_parts[0].parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
