"""Ring attention's pieces that run in one process: the load-balanced split and the block
kernels (the plain-PyTorch reference blocks equal SDPA's CPU flash kernels; the CUDA kernels'
calls, on the meta device). The ring
itself, over 2 and 4 processes, is in tests/train/test_parallel.py's cp layouts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenmill.train.parallel import context_parallel as cp


def test_load_balanced_split_pairs_early_and_late_chunks() -> None:
    positions = [cp.cp_positions(4, 2, rank).tolist() for rank in range(2)]
    assert positions == [[0, 1, 6, 7], [2, 3, 4, 5]]  # chunks (0, 3) and (1, 2) of 4
    tokens = torch.arange(16).view(1, 16)
    slices = [cp.shard_sequence(tokens, 4, rank) for rank in range(4)]
    assert sorted(torch.cat(slices, 1).flatten().tolist()) == list(range(16))
    assert slices[0].flatten().tolist() == [0, 1, 14, 15]


def test_plain_blocks_equal_the_flash_kernels() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    dout = torch.randn(2, 4, 16, 8, generator=g)
    for causal, keys in ((True, slice(None)), (False, slice(0, 8))):
        kk, vv = k[:, :, keys], v[:, :, keys]
        out, lse = cp._block_forward(q, kk, vv, causal)
        out_m, lse_m = cp._block_forward(q, kk, vv, causal, kernel=cp.PLAIN)
        torch.testing.assert_close(out_m, out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse_m, lse, rtol=1e-5, atol=1e-6)
        want = cp._block_backward(dout, q, kk, vv, out, lse, causal)
        got = cp._block_backward(dout, q, kk, vv, out, lse, causal, kernel=cp.PLAIN)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # And the causal block is SDPA's causal attention.
    torch.testing.assert_close(
        cp._block_forward(q, k, v, True)[0], F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_cuda_blocks_take_the_fused_kernels_that_the_backend_switches_allow() -> None:
    bf16, fp32 = torch.bfloat16, torch.float32
    assert cp.block_kernel("cpu", bf16, 64, masked=True) == cp.CPU_FLASH
    assert cp.block_kernel("cuda", bf16, 128, masked=False) == cp.FLASH
    assert cp.block_kernel("cuda", bf16, 128, masked=True) == cp.EFFICIENT  # FlashAttention takes no mask
    assert cp.block_kernel("cuda", fp32, 128, masked=False) == cp.EFFICIENT  # nor fp32
    assert cp.block_kernel("cuda", bf16, 12, masked=False) == cp.PLAIN  # neither a head size of 12
    assert cp.block_kernel("meta", bf16, 64, masked=False) == cp.PLAIN
    # parallel.attention_backend's switches, as the engine sets them around forward and backward.
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert cp.block_kernel("cuda", bf16, 128, masked=False) == cp.EFFICIENT
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # no cuDNN ring block: the two fused ones serve
        assert cp.block_kernel("cuda", bf16, 128, masked=False) == cp.FLASH
        assert cp.block_kernel("cuda", bf16, 128, masked=True) == cp.EFFICIENT
    with sdpa_kernel(SDPBackend.MATH):
        assert cp.block_kernel("cuda", bf16, 128, masked=False) == cp.PLAIN


def test_cuda_block_kernels_shapes_on_the_meta_device() -> None:
    """The CUDA kernels' argument conventions, checked against their meta kernels: 24 queries
    (the memory-efficient kernel pads its log-sum-exp to 32), a half block of 12 keys (its mask
    rows padded to 16), the merged log-sum-exp's slice, bf16 and fp32."""
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.empty(2, 4, 24, 64, dtype=dtype, device="meta")
        k = v = torch.empty(2, 4, 12, 64, dtype=dtype, device="meta")
        dout = torch.empty_like(q)
        allowed = torch.ones(2, 1, 24, 12, dtype=torch.bool, device="meta")
        merged_lse = torch.empty(2, 4, 48, device="meta")[..., 24:]
        for kernel, mask in ((cp.FLASH, None), (cp.EFFICIENT, None), (cp.EFFICIENT, allowed)):
            out, lse = cp._block_forward(q, k, v, False, kernel=kernel, allowed=mask)
            assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, dtype, (2, 4, 24), torch.float32)
            grads = cp._block_backward(dout, q, k, v, out, merged_lse, False, kernel=kernel, allowed=mask)
            assert [(g.shape, g.dtype) for g in grads] == [(q.shape, dtype), (k.shape, dtype), (v.shape, dtype)]
        diagonal = cp._block_forward(q, q, q, True, kernel=cp.FLASH)
        assert diagonal[0].shape == q.shape and diagonal[1].shape == (2, 4, 24)
