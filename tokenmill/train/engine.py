"""The seam between the training loop and parallelism.

The loop only talks to an ``Engine``: it hands it a local batch of token rows and asks for a
step. ``SingleProcessEngine`` is the one-device implementation; the parallel one
(``tokenmill.train.parallel.engine.build_parallel_engine``) satisfies the same protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.utils.checkpoint import checkpoint

from tokenmill.train.config import TrainConfig
from tokenmill.train.model import GPT, TransformerBlock
from tokenmill.train.optim import build_optimizer
from tokenmill.train.parallel.float8 import apply_float8

# Optimizer state keyed by parameter name (not by index), so a checkpoint written under one
# layout loads under any other.
FLAT_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


@runtime_checkable
class Engine(Protocol):
    model_parts: list[nn.Module]  # one module on one device; pipeline stages under pp
    optimizer: torch.optim.Optimizer
    device: torch.device
    is_logging_rank: bool  # prints, writes metrics and meta.json

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def train_step(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        """tokens: LongTensor[local_batch, T+1]. Forward + backward over micro-batches
        (gradient accumulation); gradients are those of the mean loss over the global batch.
        Returns that mean loss (same value on every rank)."""
        ...

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip by the true global norm (0: only measure); return the norm before clipping."""
        ...

    def optimizer_step(self, lr: float) -> None:
        """Set the learning rate, step the optimizer, zero the gradients."""
        ...

    def eval_loss(self, tokens: torch.Tensor) -> float:
        """Mean loss over tokens [local_batch, T+1] (all ranks), no gradients."""
        ...

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        """{"model": ..., "optim": ...} of (D)Tensors keyed by stable FQNs, for DCP."""
        ...

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None: ...


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # fp32 loss even under bf16 autocast: the softmax over a large vocabulary needs it.
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


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

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.block(x, rope)
        return checkpoint(self.block, x, rope, use_reentrant=False)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Wrap blocks in `CheckpointedBlock`: "full" every block; "selective" every other block
    (torchtitan's layer-frequency selective mode, a middle ground)."""
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


def autocast_context(cfg: TrainConfig, device: torch.device):
    """bf16 autocast with fp32 master weights (the parameters stay fp32)."""
    if cfg.parallel.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class SingleProcessEngine:
    """One model on one device: gradient accumulation, clipping, AdamW."""

    def __init__(self, model: GPT, cfg: TrainConfig, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.device = device or pick_device(cfg.parallel.device)
        self.model = model.to(self.device)
        if cfg.parallel.float8:  # before checkpointing and compile, as in parallelize_gpt
            apply_float8(self.model)
        apply_activation_checkpointing(self.model, cfg.parallel.activation_checkpointing)
        self.forward = torch.compile(self.model) if cfg.parallel.compile else self.model
        self.model_parts: list[nn.Module] = [self.model]
        self.optimizer = build_optimizer(self.model.named_parameters(), cfg)
        self.is_logging_rank = True

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.model.parameters()

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast_context(self.cfg, self.device):
            logits = self.forward(tokens[:, :-1])
        return cross_entropy(logits, tokens[:, 1:])

    def train_step(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        self.model.train()
        tokens = tokens.to(self.device, non_blocking=True)
        n_micro = tokens.shape[0] // micro_batch_size
        if n_micro * micro_batch_size != tokens.shape[0]:
            raise ValueError(f"local batch {tokens.shape[0]} is not a multiple of micro-batch {micro_batch_size}")
        total = torch.zeros((), device=self.device)
        for micro in tokens.split(micro_batch_size):
            loss = self._loss(micro)
            # Equal-sized micro-batches: the mean of means is the mean over the batch.
            (loss / n_micro).backward()
            total += loss.detach()
        return (total / n_micro).item()

    def clip_grad_norm(self, max_norm: float) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        return norm.item()

    def optimizer_step(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_loss(self, tokens: torch.Tensor) -> float:
        self.model.eval()
        loss = self._loss(tokens.to(self.device)).item()
        self.model.train()
        return loss

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        return {
            "model": get_model_state_dict(self.model),
            "optim": get_optimizer_state_dict(self.model, self.optimizer, options=FLAT_OPTIMIZER_STATE),
        }

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"], options=FLAT_OPTIMIZER_STATE)
