"""Ring attention's pieces that run in one process: the load-balanced split and the block
kernels (the plain-PyTorch blocks other devices use equal SDPA's CPU flash kernels). The ring
itself, over 2 and 4 processes, is in tests/train/test_parallel.py's cp layouts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
        out_m, lse_m = cp._block_forward(q, kk, vv, causal, plain=True)
        torch.testing.assert_close(out_m, out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse_m, lse, rtol=1e-5, atol=1e-6)
        want = cp._block_backward(dout, q, kk, vv, out, lse, causal)
        got = cp._block_backward(dout, q, kk, vv, out, lse, causal, plain=True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # And the causal block is SDPA's causal attention.
    torch.testing.assert_close(
        cp._block_forward(q, k, v, True)[0], F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )
