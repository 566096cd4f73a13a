"""Context parallelism on the "cp" mesh dimension: each rank holds a slice of every sequence
and causal attention runs as ring attention (Liu et al.; Megatron-Core's and torchtitan's
load-balanced causal split).

The split: the sequence is cut into 2*cp chunks and rank i holds chunks i and 2cp-1-i, so
every rank has as many early (cheap) as late (expensive) queries and none idles while the
ring turns. Tokens keep their global positions (`positions`), which the model uses for RoPE
and learned position embeddings.

Ring attention (`RingAttention`, a `torch.autograd.Function`): the forward pass sends this
rank's key/value block to the next rank while it attends to the block it holds (P2P
isend/irecv, so the transfer overlaps the computation where the backend allows), cp steps in
all; the partial outputs are merged with their log-sum-exp. With the load-balanced split each
step after the first is one full (unmasked) block of half the queries or half the keys:

- the block from an earlier rank j < i: both local query chunks follow chunk j and precede
  chunk 2cp-1-j, so all queries attend to the block's first half, none to its second;
- from a later rank j > i: chunk i precedes both of the block's chunks and sees none of them,
  chunk 2cp-1-i follows both and sees all.

The backward pass turns the ring again: the key/value blocks travel as in the forward pass,
and with each block travels the accumulator of its dK/dV, which every rank adds its share to;
after cp steps each accumulator arrives back at its owner. The block kernels are SDPA's fused
ones that return the log-sum-exp and never hold a T x T score matrix (`block_kernel`): on the
CPU its flash kernel; on CUDA FlashAttention for blocks without a document mask (bf16/fp16)
and the memory-efficient kernel, which takes an additive mask, for the rest; anywhere else,
under `parallel.attention_backend: math`, or as the reference (`plain`), a plain-PyTorch block
of the same math.
Grouped-query attention rotates the un-repeated key/value heads and sums the repeated heads'
gradients locally.

Document masking: every cp rank holds the whole rows' document ids, so each block's mask (the
queries' and the block's keys' documents equal, and causal on the diagonal block) is computed
where it is used, with nothing more sent around the ring. A query may see none of a block's
keys (an earlier document's block): its partial result counts for nothing in the merge
(log-sum-exp -inf).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tokenmill.train.watchdog import waits_for_peers

_KV_TAG, _GRAD_TAG = 7301, 7302


def shard_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's slice of `t` along `dim`: chunks rank and 2cp-1-rank of 2cp."""
    if cp == 1:
        return t
    chunks = t.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=dim).contiguous()


def cp_positions(local_len: int, cp: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """The global positions of this cp rank's `local_len` tokens (of a sequence cp times longer)."""
    return shard_sequence(torch.arange(local_len * cp, device=device), cp, rank, dim=0)


class _Ring:
    """This rank's place in the cp group and a non-blocking shift of a tensor to the next rank."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, t: torch.Tensor, tag: int) -> _Pending:
        """Send `t` to the next rank and receive the previous rank's into a new buffer."""
        recv = torch.empty_like(t)
        ops = [
            dist.P2POp(dist.isend, t, self.next, self.group, tag),
            dist.P2POp(dist.irecv, recv, self.prev, self.group, tag),
        ]
        return _Pending(recv, dist.batch_isend_irecv(ops))


class _Pending:
    def __init__(self, recv: torch.Tensor, works: list[Any]) -> None:
        self.recv, self.works = recv, works

    @waits_for_peers("batch_isend_irecv (ring attention)")
    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.recv


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    # SDPA's enable_gqa: query head h uses key/value head h // groups.
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _sum_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return t
    B, H, T, D = t.shape
    return t.view(B, H // groups, groups, T, D).sum(2)


# The fused kernels a ring block may run on (`block_kernel`).
CPU_FLASH, FLASH, EFFICIENT, PLAIN = "cpu_flash", "flash", "efficient", "plain"
# The memory-efficient kernel pads its log-sum-exp to a multiple of 32 queries, and wants the
# rows of its additive mask aligned to 16 elements (as SDPA pads a mask it is given).
_EFFICIENT_LSE_ALIGN, _EFFICIENT_MASK_ALIGN = 32, 16


def block_kernel(device_type: str, dtype: torch.dtype, head_dim: int, masked: bool) -> str:
    """The kernel of one ring block on `device_type`: the CPU flash kernel on the CPU; on CUDA
    FlashAttention where it fits (bf16/fp16, no mask), else the memory-efficient kernel (fp32
    too, and an additive mask). SDPA's backend switches (`parallel.attention_backend`) choose
    between the two where both fit; with only cuDNN allowed (the ring has no cuDNN block) the
    two still serve, with only `math` the plain block does, as on any other device."""
    if device_type == "cpu":
        return CPU_FLASH
    if device_type != "cuda" or head_dim % 8:
        return PLAIN
    switches = torch.backends.cuda
    flash, efficient = switches.flash_sdp_enabled(), switches.mem_efficient_sdp_enabled()
    if not (flash or efficient or switches.cudnn_sdp_enabled()):
        return PLAIN
    flash_fits = not masked and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256
    return FLASH if flash_fits and (flash or not efficient) else EFFICIENT


def _block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    kernel: str | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp [B, H, Tq] in fp32) of attention of q on one key/value block, by
    `kernel` (default: `block_kernel`'s choice for q). `allowed` [B, 1, Tq, Tk]: which keys
    each query may see (in place of `causal`); a query that may see none gets output 0 and
    log-sum-exp -inf."""
    causal = causal and allowed is None
    kernel = kernel or block_kernel(q.device.type, q.dtype, q.shape[-1], allowed is not None)
    if kernel == PLAIN:
        scores = _scores(q, k, causal, allowed)
        lse = scores.logsumexp(-1)
        finite = lse.masked_fill(lse == float("-inf"), 0.0)  # exp(-inf - 0) = 0 for unseen rows
        return (torch.exp(scores - finite.unsqueeze(-1)) @ v.float()).to(q.dtype), lse
    if kernel == CPU_FLASH:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=_additive(allowed, q)
        )
    elif kernel == FLASH:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, _additive(allowed, q, _EFFICIENT_MASK_ALIGN), True, 0.0, causal
        )[:2]
        lse = lse[..., : q.shape[2]]  # its padding to a multiple of 32 queries
    lse = lse.float()
    if allowed is not None:
        # A query that sees no key: the kernels report 0 (CPU) or leave it to the mask's
        # arithmetic (CUDA); it counts for nothing in the merge.
        seen = allowed.any(-1)
        lse = lse.masked_fill(~seen, float("-inf"))
        out = torch.where(seen.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out, lse


def _additive(allowed: torch.Tensor | None, q: torch.Tensor, align: int = 1) -> torch.Tensor | None:
    """A boolean mask [B, 1, Tq, Tk] as the fused kernels' additive one [B, H, Tq, Tk] of q's
    dtype (0 where allowed, -inf elsewhere), its rows `align`ed in memory."""
    if allowed is None:
        return None
    keys = allowed.shape[-1]
    padded = -(-keys // align) * align
    mask = torch.zeros((*allowed.shape[:-1], padded), dtype=q.dtype, device=allowed.device)
    mask = mask[..., :keys].masked_fill(~allowed, float("-inf"))
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], keys)


def _block_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    kernel: str | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one block, given the final (merged) output and log-sum-exp: with those
    the block's probabilities and the softmax's correction term are the global ones. The
    fused kernel's backward (`kernel` as in `_block_forward`), or FlashAttention's backward
    equations in fp32 PyTorch."""
    causal = causal and allowed is None
    kernel = kernel or block_kernel(q.device.type, q.dtype, q.shape[-1], allowed is not None)
    lse = lse.contiguous()  # the kernels index it as [B, H, Tq]; a slice of the merged one is not
    if kernel == CPU_FLASH:
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, attn_mask=_additive(allowed, q)
        )
        return grads[0], grads[1], grads[2]
    # No dropout: the random-number state the CUDA kernels take is unused; what their forward
    # passes return without dropout is an empty host scalar, passed back the same way.
    seed = offset = torch.empty((), dtype=torch.int64)
    if kernel == FLASH:
        tq, tk = q.shape[2], k.shape[2]
        grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, tq, tk, 0.0, causal, seed, offset
        )
        return grads[0], grads[1], grads[2]
    if kernel == EFFICIENT:
        tq = q.shape[2]
        padded = torch.zeros(
            (*lse.shape[:-1], -(-tq // _EFFICIENT_LSE_ALIGN) * _EFFICIENT_LSE_ALIGN), device=lse.device
        )
        padded[..., :tq] = lse  # the layout the forward kernel returned
        grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dout,
            q,
            k,
            v,
            _additive(allowed, q, _EFFICIENT_MASK_ALIGN),
            out,
            padded,
            seed,
            offset,
            0.0,
            [True, True, True, False],
            causal,
        )
        return grads[0], grads[1], grads[2]
    scale = q.shape[-1] ** -0.5
    qf, kf, vf, df = q.float(), k.float(), v.float(), dout.float()
    p = torch.exp(_scores(q, k, causal, allowed) - lse.unsqueeze(-1))
    dp = df @ vf.transpose(-1, -2)
    ds = p * (dp - (df * out.float()).sum(-1, keepdim=True))
    return (ds @ kf) * scale, (ds.transpose(-1, -2) @ qf) * scale, p.transpose(-1, -2) @ df


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled fp32 attention scores of a block, the future masked on the diagonal block (or
    what `allowed` does not allow)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif causal:
        scores = scores.masked_fill(_future(q, k), float("-inf"))
    return scores


def _future(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)


def _allowed(
    ids: torch.Tensor | None, ring: _Ring, source: int, queries: slice, keys: slice, causal: bool
) -> torch.Tensor | None:
    """[B, 1, Tq, Tk] which of the block of `source` (its `keys`) this rank's `queries` may
    see: the same document, and on the diagonal block (`causal`) no later token; None
    without document ids (the whole rows' [B, T])."""
    if ids is None:
        return None
    q_ids = shard_sequence(ids, ring.size, ring.rank)[:, queries]
    k_ids = shard_sequence(ids, ring.size, source)[:, keys]
    allowed = q_ids[:, :, None] == k_ids[:, None, :]
    if causal:
        allowed &= torch.ones(allowed.shape[-2:], dtype=torch.bool, device=ids.device).tril()
    return allowed[:, None]


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold a block's partial result into (out, lse), in place: softmax over the union."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out.float() * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


class RingAttentionFunction(torch.autograd.Function):
    """Causal attention of this rank's queries on every rank's keys/values (see the module)."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: _Ring, ids: torch.Tensor | None
    ) -> torch.Tensor:
        groups, half = q.shape[1] // k.shape[1], q.shape[2] // 2
        every, first, second = slice(None), slice(None, half), slice(half, None)
        kv = torch.stack([k, v]).contiguous()
        out = lse = None
        for step in range(ring.size):
            pending = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            source = (ring.rank - step) % ring.size
            kk, vv = _repeat_heads(kv[0], groups), _repeat_heads(kv[1], groups)
            if step == 0:
                allowed = _allowed(ids, ring, source, every, every, causal=True)
                block_out, lse = _block_forward(q, kk, vv, causal=True, allowed=allowed)
                out = block_out.float()
            elif source < ring.rank:
                allowed = _allowed(ids, ring, source, every, first, causal=False)
                _merge(out, lse, *_block_forward(q, kk[:, :, first], vv[:, :, first], causal=False, allowed=allowed))
            else:
                allowed = _allowed(ids, ring, source, second, every, causal=False)
                block = _block_forward(q[:, :, second], kk, vv, causal=False, allowed=allowed)
                _merge(out[:, :, second], lse[:, :, second], *block)
            if pending is not None:
                kv = pending.wait()
        assert out is not None and lse is not None
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.ids = ring, ids
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        ring: _Ring = ctx.ring
        ids: torch.Tensor | None = ctx.ids
        dout = dout.contiguous()
        groups, half = q.shape[1] // k.shape[1], q.shape[2] // 2
        every, first = slice(None), slice(None, half)
        kv = torch.stack([k, v]).contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        pending_grad: _Pending | None = None
        for step in range(ring.size):
            pending_kv = ring.shift(kv, _KV_TAG) if step < ring.size - 1 else None
            source = (ring.rank - step) % ring.size
            kk, vv = _repeat_heads(kv[0], groups), _repeat_heads(kv[1], groups)
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            if step == 0:
                allowed = _allowed(ids, ring, source, every, every, causal=True)
                dqb, dkb, dvb = _block_backward(dout, q, kk, vv, out, lse, causal=True, allowed=allowed)
                dq += dqb
                dkv[0] += _sum_heads(dkb, groups)
                dkv[1] += _sum_heads(dvb, groups)
            elif source < ring.rank:
                allowed = _allowed(ids, ring, source, every, first, causal=False)
                dqb, dkb, dvb = _block_backward(
                    dout, q, kk[:, :, first], vv[:, :, first], out, lse, causal=False, allowed=allowed
                )
                dq += dqb
                dkv[0, :, :, :half] += _sum_heads(dkb, groups)
                dkv[1, :, :, :half] += _sum_heads(dvb, groups)
            else:
                s = slice(half, None)
                allowed = _allowed(ids, ring, source, s, every, causal=False)
                dqb, dkb, dvb = _block_backward(
                    dout[:, :, s], q[:, :, s], kk, vv, out[:, :, s], lse[:, :, s], causal=False, allowed=allowed
                )
                dq[:, :, s] += dqb
                dkv[0] += _sum_heads(dkb, groups)
                dkv[1] += _sum_heads(dvb, groups)
            # The accumulator of the block held now arrives from the previous rank (which
            # held the block one step earlier); add this rank's share and pass it on.
            if pending_grad is not None:
                dkv += pending_grad.wait()
            pending_grad = ring.shift(dkv, _GRAD_TAG)
            if pending_kv is not None:
                kv = pending_kv.wait()
        assert pending_grad is not None
        dkv = pending_grad.wait()  # this rank's own block's accumulator, back from its tour
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


class RingAttention:
    """The attention core of `model.Attention` under context parallelism: q [B, H, T/cp, D],
    k, v [B, H_kv, T/cp, D] -> [B, H, T/cp, D], causal over the global positions (and within
    documents, given the whole rows' document ids [B, T])."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.ring = _Ring(group)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        # No copies: the flash kernels take the [B, T, H, D] -> [B, H, T, D] views as they are.
        return RingAttentionFunction.apply(q, k, v, self.ring, document_ids)


def apply_context_parallel(part: nn.Module, cp_group: dist.ProcessGroup, seq_len: int, device: torch.device) -> None:
    """Make one model part attend around the ring and place its tokens at their global
    positions (this rank's load-balanced slice of a `seq_len` sequence)."""
    core = RingAttention(cp_group)
    for block in part.layers.values():
        block.attention.core = core
    cp, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    part.positions = cp_positions(seq_len // cp, cp, rank, device)
