"""Data parallelism with ZeRO, on the "dp" mesh dimension.

What each stage shards in our implementation (Nd = dp):

- zero 0: nothing. Parameters, gradients and optimizer state are replicated; gradients are
  averaged by a bucketed all-reduce after the last micro-batch (DDP's reduction, no overlap).
- zero 1: optimizer state. Gradients are all-reduced as in zero 0; each dp rank owns a
  disjoint set of whole parameters (greedy by size, ~1/Nd of the elements), keeps AdamW state
  only for those, steps them, and broadcasts the updated values to the other dp ranks
  (the ZeroRedundancyOptimizer scheme written against the dp group, so it composes with
  DTensor tensor-parallel parameters; FSDP2 cannot express stage 1, pytorch#155952).
- zero 2: + gradients. FSDP2 `fully_shard(reshard_after_forward=False)` per block and on the
  root: parameters and optimizer state are stored sharded (1/Nd), gradients are reduce-scattered
  to 1/Nd; the full parameters are gathered before forward and kept until after backward.
- zero 3: + parameters. FSDP2 `fully_shard(reshard_after_forward=True)`: the gathered
  parameters are freed after each block's forward and gathered again for its backward.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

BUCKET_BYTES = 32 * 2**20


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def apply_fsdp(part: nn.Module, dp_mesh: DeviceMesh, zero: int, bf16: bool = False) -> None:
    """ZeRO-2/3 with FSDP2: one unit per block, then the root (embeddings, norm, head).
    The stored (sharded) parameters and the optimizer state stay fp32; with `bf16` each unit
    gathers its parameters cast to bf16 (half the all-gather, bf16 matmuls without autocast)
    and reduce-scatters the gradients in fp32 (FSDP2's MixedPrecisionPolicy)."""
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    reshard = zero >= 3
    for block in part.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer holding the tensors' values, in order."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat` shaped as `like` (the inverse of `_flatten`)."""
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in like]), like)]


def _buckets(tensors: list[torch.Tensor]) -> Iterable[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() * t.element_size() > BUCKET_BYTES or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


def all_reduce_grads(params: Iterable[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average gradients over the dp group (ZeRO 0/1), flattened into buckets."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    for bucket in _buckets(grads):
        flat = _flatten(bucket)
        dist.all_reduce(flat, group=group)  # gloo has no AVG
        flat.div_(size)
        for g, synced in zip(bucket, _unflatten(flat, bucket)):
            g.copy_(synced)


def partition_params(named: list[tuple[str, nn.Parameter]], n: int) -> list[list[str]]:
    """Whole parameters to n owners, largest first to the least loaded (deterministic, so
    every dp rank computes the same partition)."""
    loads = [0] * n
    owners: list[list[str]] = [[] for _ in range(n)]
    for name, p in sorted(named, key=lambda kv: (-local(kv[1]).numel(), kv[0])):
        r = min(range(n), key=lambda i: (loads[i], i))
        owners[r].append(name)
        loads[r] += local(p).numel()
    return owners


class ZeroOneOptimizer:
    """ZeRO-1 across the dp group: this rank's AdamW covers only the parameters it owns;
    `step` updates them and broadcasts every owner's parameters to the group."""

    def __init__(
        self, named: list[tuple[str, nn.Parameter]], build, group: dist.ProcessGroup, dp_rank: int, dp_size: int
    ) -> None:
        self.group, self.dp_rank, self.dp_size = group, dp_rank, dp_size
        owners = partition_params(named, dp_size)
        by_name = dict(named)
        self.owned_by = [[by_name[n] for n in sorted(names, key=list(by_name).index)] for names in owners]
        mine = set(owners[dp_rank])
        self.params = [p for _, p in named]
        self.inner: torch.optim.Optimizer = build([(n, p) for n, p in named if n in mine])

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        for owner, params in enumerate(self.owned_by):
            if not params:
                continue
            tensors = [local(p) for p in params]
            src = dist.get_global_rank(self.group, owner)
            for bucket in _buckets(tensors):
                flat = _flatten(bucket)
                dist.broadcast(flat, src=src, group=self.group)
                if owner != self.dp_rank:
                    for t, new in zip(bucket, _unflatten(flat, bucket)):
                        t.copy_(new)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
