"""Transforms applied to the plain GPT from outside it, in the style of torchtitan's
`parallelize_llama` (`apply_ac`, `apply_compile`): activation checkpointing, `torch.compile`
per block, and the materialization of a model built on the meta device.

`parallel/parallelize.py` applies them, with the parallelisms, in one order; none of them
changes a parameter's name, so checkpoints, optimizer groups and the name-seeded
initialization see the plain model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint

from tokenmill.train.model import GPT, TransformerBlock


class CheckpointedBlock(nn.Module):
    """A transformer block recomputed in the backward pass (torch.utils.checkpoint).

    It presents the block's own submodules and parameters under the same names (it shares
    the block's registries instead of nesting it), so state-dict keys, optimizer groups and
    the name-seeded initialization are those of the plain model."""

    def __init__(self, block: TransformerBlock) -> None:
        super().__init__()
        self.__dict__["block"] = block  # not a submodule: its children are ours, below
        self._modules = block._modules
        self._parameters = block._parameters
        self._buffers = block._buffers

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None, documents: Any = None) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.block(x, rope, documents)
        return checkpoint(self.block, x, rope, documents, use_reentrant=False)


def apply_ac(model: nn.Module, mode: str) -> None:
    """Activation checkpointing: wrap blocks in `CheckpointedBlock`, "full" every block,
    "selective" every other block (torchtitan's layer-frequency selective mode, a middle
    ground), "off" none."""
    if mode == "off":
        return
    layers = getattr(model, "layers", None)
    if layers is None:
        return
    for i, (name, block) in enumerate(list(layers.items())):
        if mode == "selective" and i % 2:
            continue
        if isinstance(block, TransformerBlock):
            layers[name] = CheckpointedBlock(block)


def apply_compile(model: nn.Module) -> None:
    """`torch.compile` each transformer block (after activation checkpointing wrapped it), as
    torchtitan does: every block has the same code, so one compiled graph serves all of them,
    and the embedding and head stay eager."""
    for block in model.layers.values():
        block.compile()


@torch.no_grad()
def materialize(part: GPT, device: torch.device) -> None:
    """Allocate a (possibly sharded) meta-device part on `device` and give every parameter its
    initial value, drawn on `device`: the full tensor from the parameter's own generator, of
    which this rank keeps its shard. One full parameter at a time is the only transient cost,
    and the whole model never exists on the CPU."""
    part.to_empty(device=device)
    part.tie_embedding_weights()
    part.init_buffers(device)
    for name, param in part.named_parameters():
        if not isinstance(param, DTensor):
            part.init_parameter(name, param)
            continue
        full = part.init_parameter(name, torch.empty(param.shape, dtype=param.dtype, device=device))
        # src_data_rank=None: every rank holds the same full tensor and keeps its own slice
        # (no communication), for Shard and FSDP's strided shards over tp alike.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
