"""The seam between the training loop and parallelism.

The loop only talks to an ``Engine``: it hands it a local batch of token rows and asks for a
step. ``SingleProcessEngine`` is the one-device implementation; the parallel one
(``tokenmill.train.parallel.parallel_engine.build_parallel_engine``) satisfies the same protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenmill.errors import ConfigError
from tokenmill.train.chunked_loss import chunked_cross_entropy
from tokenmill.train.config import TrainConfig
from tokenmill.train.model import GPT, document_ids, document_positions
from tokenmill.train.model_transforms import apply_ac, apply_compile, materialize
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

    def forward_backward(self, tokens: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
        """tokens: LongTensor[local_batch, T+1]. Forward + backward over micro-batches
        (gradient accumulation); gradients are those of the mean loss over the global batch.
        Returns that mean loss (same value on every rank), a 0-dim tensor left on the device:
        the host does not wait for the step."""
        ...

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip by the true global norm (0: only measure); return the norm before clipping, a
        0-dim tensor left on the device."""
        ...

    def train_step(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        """`forward_backward`, its loss read by the host."""
        ...

    def clip_grad_norm(self, max_norm: float) -> float:
        """`clip_gradients`, the norm read by the host."""
        ...

    def optimizer_step(self, lr: float) -> None:
        """Set the learning rate, step the optimizer, zero the gradients."""
        ...

    def eval_loss(self, tokens: torch.Tensor) -> float:
        """Mean loss over tokens [local_batch, T+1] (all ranks), no gradients."""
        ...

    def eval_logits(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """inputs [B, T] -> float32 logits [N, vocab] at the positions where keep [B, T] is True
        (row-major), the same on every rank; every rank passes the same inputs (collectives)."""
        ...

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        """{"model": ..., "optim": ...} of (D)Tensors keyed by stable FQNs, for DCP."""
        ...

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None: ...


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # fp32 loss even under bf16 autocast: the softmax over a large vocabulary needs it.
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def loss_function(
    cfg: TrainConfig, head_part: nn.Module | None = None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of the output of `head_part` (the model part holding the head) against labels.

    With parallel.loss_chunk_tokens, the head moves into the loss: `head_part` returns its final
    hidden states and `chunked_cross_entropy` applies the head's weight chunk by chunk.
    Otherwise `cross_entropy` of the logits, compiled when the blocks are (torchtitan compiles
    its loss too): the fp32 upcast, log-softmax and gather then fuse instead of keeping fp32
    logits and their log-softmax over the whole vocabulary (8 GB a step for a 128k vocabulary at
    batch 4 x 2048). Tensor-parallel logits are DTensors sharded over the vocabulary: those stay
    eager."""
    chunk = cfg.parallel.loss_chunk_tokens
    if chunk and head_part is not None and head_part.output is not None:
        head_part.head_in_loss = True
        head = head_part.output  # its weight read at each call: materialization replaces it
        return lambda hidden, labels: chunked_cross_entropy(hidden, head.weight, labels, chunk)
    if cfg.parallel.compile and cfg.parallel.tp == 1:
        return torch.compile(cross_entropy)
    return cross_entropy


@contextlib.contextmanager
def logits_out(parts: list[nn.Module]) -> Iterator[None]:
    """The model parts' forward returning logits, also where the loss applies the head
    (`GPT.head_in_loss`): evaluation reads the logits themselves."""
    saved = [part.head_in_loss for part in parts]
    for part in parts:
        part.head_in_loss = False
    try:
        yield
    finally:
        for part, value in zip(parts, saved, strict=True):
            part.head_in_loss = value


def row_documents(cfg: TrainConfig, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model's document arguments for input rows [B, T] (`GPT.forward`): each token's
    document and, with dataset.document_positions, its position in it; none without
    dataset.document_masking."""
    data = cfg.dataset
    if not data.document_masking:
        return {}
    if data.eod_id is None:
        raise ConfigError("dataset.document_masking: set dataset.eod_id (the end-of-document token's id)")
    ids = document_ids(inputs, data.eod_id)
    return (
        {"document_ids": ids, "positions": document_positions(ids)}
        if data.document_positions
        else {"document_ids": ids}
    )


def autocast_context(cfg: TrainConfig, device: torch.device):
    """bf16 autocast with fp32 master weights (the parameters stay fp32)."""
    if cfg.parallel.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def attention_context(backend: str):
    """Run scaled-dot-product attention with one kernel only ("auto": torch picks), applied
    around forward and backward from outside the model."""
    if backend == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel(SDPA_BACKENDS[backend])


def check_attention_backend(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int = 64) -> None:
    """Raise ConfigError (one line) when `backend` cannot run causal attention on `device` in
    `dtype`: a small attention forward and backward is tried once, before training starts,
    instead of a kernel-selection traceback at the first step."""
    if backend == "auto":
        return
    q = torch.randn(1, 2, 16, head_dim, device=device, dtype=dtype, requires_grad=True)
    try:
        with attention_context(backend):
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    except RuntimeError:
        raise ConfigError(
            f"parallel.attention_backend: the {backend} attention kernel is not available on {device} "
            f"for {str(dtype).removeprefix('torch.')} (head_dim {head_dim}); choose another of "
            f"{', '.join(['auto', *SDPA_BACKENDS])}"
        ) from None


def compute_dtype(cfg: TrainConfig) -> torch.dtype:
    return torch.bfloat16 if cfg.parallel.precision == "bf16" else torch.float32


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class SingleProcessEngine:
    """One model on one device: gradient accumulation, clipping, AdamW."""

    def __init__(self, model: GPT, cfg: TrainConfig, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.device = device or pick_device(cfg.parallel.device)
        if any(p.is_meta for p in model.parameters()):
            materialize(model, self.device)  # built on the meta device: initialize on ours
        self.model = model.to(self.device)
        if cfg.parallel.float8:  # before checkpointing and compile, as in parallelize_gpt
            apply_float8(self.model)
        apply_ac(self.model, cfg.parallel.activation_checkpointing)
        if cfg.parallel.compile:
            apply_compile(self.model)
        check_attention_backend(cfg.parallel.attention_backend, self.device, compute_dtype(cfg), model.config.head_dim)
        self.model_parts: list[nn.Module] = [self.model]
        self.loss_fn = loss_function(cfg, self.model)
        self.optimizer = build_optimizer(self.model.named_parameters(), cfg)
        self.is_logging_rank = True

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.model.parameters()

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs = tokens[:, :-1]
        with autocast_context(self.cfg, self.device):
            logits = self.model(inputs, **row_documents(self.cfg, inputs))
        return self.loss_fn(logits, tokens[:, 1:])

    def train_step(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        return self.forward_backward(tokens, micro_batch_size).item()

    def clip_grad_norm(self, max_norm: float) -> float:
        return self.clip_gradients(max_norm).item()

    def forward_backward(self, tokens: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
        with attention_context(self.cfg.parallel.attention_backend):
            return self._forward_backward(tokens, micro_batch_size)

    def _forward_backward(self, tokens: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
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
        return total / n_micro

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))

    def optimizer_step(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_loss(self, tokens: torch.Tensor) -> float:
        self.model.eval()
        with attention_context(self.cfg.parallel.attention_backend):
            loss = self._loss(tokens.to(self.device)).item()
        self.model.train()
        return loss

    @torch.no_grad()
    def eval_logits(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        with (
            attention_context(self.cfg.parallel.attention_backend),
            autocast_context(self.cfg, self.device),
            logits_out([self.model]),
        ):
            logits = self.model(inputs.to(self.device))[keep.to(self.device)]
        self.model.train()
        return logits.float()

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        return {
            "model": get_model_state_dict(self.model),
            "optim": get_optimizer_state_dict(self.model, self.optimizer, options=FLAT_OPTIMIZER_STATE),
        }

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"], options=FLAT_OPTIMIZER_STATE)
