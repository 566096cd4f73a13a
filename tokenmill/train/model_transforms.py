"""Transforms applied to the plain GPT from outside it, in the style of torchtitan's
`parallelize_llama` (`apply_ac`, `apply_compile`): activation checkpointing, `torch.compile`
per block, activation offload to host memory, and the materialization of a model built on the
meta device.

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


class _BlockWrapper(nn.Module):
    """A module in place of a block that presents the block's own submodules and parameters
    under the same names (it shares the block's registries instead of nesting it), so
    state-dict keys, optimizer groups and the name-seeded initialization are those of the
    plain model."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.__dict__["block"] = block  # not a submodule: its children are ours, below
        self._modules = block._modules
        self._parameters = block._parameters
        self._buffers = block._buffers


class CheckpointedBlock(_BlockWrapper):
    """A transformer block recomputed in the backward pass (torch.utils.checkpoint)."""

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


class OffloadedBlock(_BlockWrapper):
    """A transformer block (or its checkpointed or compiled form) whose tensors saved for the
    backward pass wait in host memory (MEMO's activation offload): copied out as the forward
    pass saves them, on a side stream that overlaps the copy with the next kernels, and back
    to the device when the backward pass needs them.

    The block's parameters (resident anyway) and tensor subclasses (DTensor, float8) stay
    where they are."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__(block)
        self.offloaded_tensors = 0  # saved tensors sent to host memory so far, for logs and tests
        self._copy_stream: Any = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None, documents: Any = None) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.block(x, rope, documents)
        # Read at each call: FSDP2 puts the unsharded parameters in place just before it.
        resident = {
            p.untyped_storage().data_ptr() for p in self.parameters() if type(p) in (torch.Tensor, nn.Parameter)
        }

        def to_host(t: torch.Tensor) -> Any:
            if type(t) is not torch.Tensor or t.untyped_storage().data_ptr() in resident:
                return t
            self.offloaded_tensors += 1
            host = torch.empty_like(t, device="cpu", pin_memory=t.is_cuda)
            if not t.is_cuda:
                return t.device, host.copy_(t)
            stream = self._side_stream(t.device)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                host.copy_(t, non_blocking=True)
            t.record_stream(stream)  # its memory is reused only after the copy
            return t.device, host

        def to_device(packed: Any) -> torch.Tensor:
            if isinstance(packed, torch.Tensor):
                return packed
            device, host = packed
            if device.type == "cuda":
                torch.cuda.current_stream(device).wait_stream(self._side_stream(device))
            return host.to(device, non_blocking=True)

        with torch.autograd.graph.saved_tensors_hooks(to_host, to_device):
            return self.block(x, rope, documents)

    def _side_stream(self, device: torch.device) -> Any:
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)
        return self._copy_stream


def apply_activation_offload(model: nn.Module, offload: bool) -> None:
    """Wrap every transformer block (after checkpointing and compile wrapped it) in
    `OffloadedBlock`; with checkpointing, only a checkpointed block's input is saved, and
    offloaded."""
    if not offload or getattr(model, "layers", None) is None:
        return
    for name, block in list(model.layers.items()):
        model.layers[name] = OffloadedBlock(block)


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
