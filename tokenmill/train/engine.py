"""The training engine: the model under this process's share of the tp x pp x dp x cp
layout, and the training step on it, behind which the loop (`loop.py`) and its hooks see one
device or many alike.

One process is the layout of size 1 (as in torchtitan, one code path whatever the world): the
same step runs, every collective over a group of one is skipped, and no process group is made
unless FSDP2 (ZeRO-2/3), which needs one, shards over a group of one.

The model is built on the meta device and handed to `parallelize_gpt` (parallel/parallelize.py:
the pipeline split, tensor parallel, activation checkpointing, compile, FSDP, materialization,
in that order); then the engine adds the optimizer (ZeRO-1 shards it by whole parameters), the
pipeline schedule and the tied-embedding groups.

Context parallelism: every cp rank of a dp rank receives the same rows and keeps its
load-balanced slice of each (`shard_sequence`); each rank's loss is the mean over its slice,
all slices hold equally many tokens, so the mean over the dp x cp ranks is the mean over the
full sequences, and gradients averaged over dp x cp are those of one process.

Tied input/output embeddings under pipeline parallelism (Megatron's scheme): the first stage
holds the embedding, the last stage a copy of it as the head; after backward the two gradients
are summed over the embedding group, so both copies take the same step. The copy is counted
once in the gradient norm and saved under the embedding's name in the optimizer state, so
checkpoints load across layouts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenmill.errors import ConfigError
from tokenmill.train.chunked_loss import chunked_cross_entropy
from tokenmill.train.config import TrainConfig, check_layout, pipeline_microbatches
from tokenmill.train.model import GPT, document_ids, document_positions
from tokenmill.train.optim import build_optimizer
from tokenmill.train.parallel.context_parallel import cp_positions, shard_sequence
from tokenmill.train.parallel.data_parallel import ZeroOneOptimizer, all_reduce_grads, local
from tokenmill.train.parallel.mesh import build_mesh, embedding_group, init_distributed
from tokenmill.train.parallel.parallelize import parallelize_gpt, uses_fsdp
from tokenmill.train.parallel.pipeline import build_schedule, stage_ids

# Optimizer state keyed by parameter name (not by index), so a checkpoint written under one
# layout loads under any other.
FLAT_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)
EMBEDDING_WEIGHT, HEAD_WEIGHT = "tok_embeddings.weight", "output.weight"


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


def _optimizer_key_as_embedding(key: str) -> str:
    """A flat optimizer-state key of the head's copy of tied embeddings under the embedding's name."""
    for prefix in ("state.", "param_groups."):
        if key.startswith(prefix + HEAD_WEIGHT + "."):
            return prefix + EMBEDDING_WEIGHT + key[len(prefix + HEAD_WEIGHT) :]
    return key


class Engine:
    """The model under this process's share of the tp x pp x dp x cp layout, its optimizer
    and the training step on it; every rank runs the same calls. The loop hands it a local
    batch of token rows per step and reads the loss and gradient norm only when it logs."""

    def __init__(self, cfg: TrainConfig, model: GPT | None = None, device: torch.device | None = None) -> None:
        """`model`: a GPT on the meta device (built here when None), or one with its weights
        on a single process (they are kept: a caller that loaded a state dict passes it)."""
        self.cfg = cfg
        self.dims = dims = cfg.parallel
        self.model_config = model_config = model.config if model is not None else cfg.model
        if dims.world_size > 1 or uses_fsdp(dims):
            self.device = init_distributed(device, dims.world_size)
            check_layout(dims, model_config, cfg.sequence_length, dist.get_world_size())
            self.mesh, replica_mesh = build_mesh(dims, self.device.type)
        else:  # one process alone communicates nothing: no process group, no mesh
            self.device = device or pick_device(dims.device)
            self.mesh = replica_mesh = None
        self.pp_group = self._group("pp")
        self.pp_rank, self.dp_rank, self.cp_rank = self._rank("pp"), self._rank("dp"), self._rank("cp")
        self.dp_size = dims.dp
        # Parameters are replicated over dp and cp alike: gradients, the loss and ZeRO-1's
        # optimizer shards go over the flattened dp x cp group.
        self.replica_group = replica_mesh.get_group() if replica_mesh is not None else None
        self.replicas = dims.dp * dims.cp
        self.replica_rank = replica_mesh.get_local_rank() if replica_mesh is not None else 0
        self.is_logging_rank = self.mesh is None or dist.get_rank() == 0

        if model is None:
            # The whole model exists only on the meta device: each rank materializes just its
            # stages' share of it (parallelize_gpt), so a 530B model never has to fit in one
            # process. The init seed is drawn from the caller's RNG, and every parameter's
            # value depends only on it and the parameter's name, so any layout starts from the
            # same weights as one process (the parity tests rely on this).
            with torch.device("meta"):
                model = GPT(model_config)
        self.stage_ids = stage_ids(self.pp_rank, dims.pp, dims.stages_per_rank)
        parts = parallelize_gpt(model, dims, cfg, self.mesh, replica_mesh, self.stage_ids, self.device)
        self.model_parts: list[nn.Module] = parts
        self.loss_fn = loss_function(cfg, parts[-1])  # a pipeline's head is on its last stage
        # bf16 under FSDP2 is its mixed-precision policy (bf16 parameters); otherwise autocast.
        self._autocast = dims.precision == "bf16" and not uses_fsdp(dims)
        check_attention_backend(dims.attention_backend, self.device, compute_dtype(cfg), model_config.head_dim)

        # This rank's copy of tied embeddings when a pipeline splits them (first / last stage).
        self._embedding_group = None
        self._tied_copy: nn.Parameter | None = None
        if model_config.tie_embeddings and dims.pp > 1:
            self._embedding_group = embedding_group(self.mesh)
            if self.pp_rank == 0:
                self._tied_copy = parts[0].tok_embeddings.weight
            elif self.pp_rank == dims.pp - 1:
                self._tied_copy = parts[-1].output.weight
        self._head_copy_part = len(parts) - 1 if self._tied_copy is not None and self.pp_rank == dims.pp - 1 else None

        if dims.zero == 1 and self.replicas > 1:
            self._optims: list[Any] = [
                ZeroOneOptimizer(
                    list(p.named_parameters()),
                    lambda named: build_optimizer(named, cfg),
                    self.replica_group,
                    self.replica_rank,
                    self.replicas,
                )
                for p in parts
            ]
            self.optimizers = [o.inner for o in self._optims]
        else:
            self.optimizers = [build_optimizer(p.named_parameters(), cfg) for p in parts]
            self._optims = list(self.optimizers)
        self.optimizer = self.optimizers[0]
        self._schedules: dict[int, Any] = {}

    # ------------------------------------------------------------------ helpers

    def _rank(self, dim: str) -> int:
        """This rank's place along a mesh dim (0 on one process)."""
        return self.mesh.get_local_rank(dim) if self.mesh is not None else 0

    def _group(self, dim: str) -> dist.ProcessGroup | None:
        return self.mesh.get_group(dim) if self.mesh is not None else None

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.model_parts:
            yield from part.parameters()

    def _context(self):
        stack = contextlib.ExitStack()
        if self.dims.tp > 1:
            stack.enter_context(loss_parallel())  # cross-entropy over vocabulary-sharded logits
        if self._autocast:
            stack.enter_context(autocast_context(self.cfg, self.device))
        stack.enter_context(attention_context(self.dims.attention_backend))
        return stack

    def _pipeline_microbatches(self, local_batch: int, n_micro: int) -> int:
        return pipeline_microbatches(local_batch, n_micro, self.dims.pp, self.dims.pp_schedule)

    def _schedule(self, n_micro: int):
        if n_micro not in self._schedules:
            self._schedules[n_micro] = build_schedule(
                self.model_parts,
                self.stage_ids,
                self.dims.num_stages,
                self.device,
                self.pp_group,
                n_micro,
                self.dims.pp_schedule,
                self.loss_fn,
            )
        return self._schedules[n_micro]

    def _mean_over(self, value: torch.Tensor) -> torch.Tensor:
        """Loss known on the last pipeline stage -> the mean over dp x cp, on every rank (on
        the device)."""
        if self.dims.pp > 1:
            dist.broadcast(value, src=dist.get_global_rank(self.pp_group, self.dims.pp - 1), group=self.pp_group)
        if self.replicas > 1:
            dist.all_reduce(value, group=self.replica_group)
            value = value / self.replicas
        return value

    def _inputs_and_labels(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Rows [B, T+1] -> (inputs, labels) [B, T], or this cp rank's [B, T/cp] slice of them,
        and the model's document arguments: the whole rows' document ids (ring attention masks
        every block with them) and this slice's positions."""
        x, y = tokens[:, :-1], tokens[:, 1:]
        cp, rank = self.dims.cp, self.cp_rank
        documents = row_documents(self.cfg, x)
        if "positions" in documents:
            documents["positions"] = shard_sequence(documents["positions"], cp, rank).contiguous()
        return shard_sequence(x, cp, rank).contiguous(), shard_sequence(y, cp, rank).contiguous(), documents

    # ------------------------------------------------------------------ the step

    def forward_backward(self, tokens: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
        """tokens: LongTensor[local_batch, T+1]. Forward and backward over micro-batches
        (gradient accumulation); the gradients are those of the mean loss over the global
        batch. Returns that mean loss (the same value on every rank), a 0-dim tensor left on
        the device: the host does not wait for the step."""
        for part in self.model_parts:
            part.train()
        tokens = tokens.to(self.device, non_blocking=True)
        n_micro = tokens.shape[0] // micro_batch_size
        if n_micro * micro_batch_size != tokens.shape[0]:
            raise ValueError(f"local batch {tokens.shape[0]} is not a multiple of micro-batch {micro_batch_size}")
        x, y, documents = self._inputs_and_labels(tokens)
        if self.dims.pp > 1:
            # Micro-batches are the pipeline's: the schedule accumulates (and averages) them,
            # and splits the document arguments with the rows for every stage.
            schedule = self._schedule(self._pipeline_microbatches(tokens.shape[0], n_micro))
            losses: list[torch.Tensor] = []
            last = self.pp_rank == self.dims.pp - 1
            with self._context():
                args = (x,) if self.pp_rank == 0 else ()
                if last:
                    schedule.step(*args, target=y, losses=losses, **documents)
                else:
                    schedule.step(*args, **documents)
            loss = (
                torch.stack([local(part).detach().float() for part in losses]).mean()
                if last
                else torch.zeros((), device=self.device)
            )
            if self._tied_copy is not None:
                self._sum_tied_gradients()
        else:
            (model,) = self.model_parts
            total = torch.zeros((), device=self.device)
            for index, (xm, ym) in enumerate(zip(x.split(micro_batch_size), y.split(micro_batch_size))):
                rows = slice(index * micro_batch_size, (index + 1) * micro_batch_size)
                with self._context():
                    loss_m = self.loss_fn(model(xm, **{k: v[rows] for k, v in documents.items()}), ym)
                    # Equal-sized micro-batches: the mean of means is the mean over the batch.
                    (loss_m / n_micro).backward()
                total += local(loss_m.detach()).float()
            loss = total / n_micro
        if self.dims.zero <= 1 and self.replicas > 1:
            all_reduce_grads(self.parameters(), self.replica_group, self.replicas)
        return self._mean_over(loss)

    def train_step(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        """`forward_backward`, its loss read by the host."""
        return self.forward_backward(tokens, micro_batch_size).item()

    @torch.no_grad()
    def _sum_tied_gradients(self) -> None:
        """The tied weight's gradient is the embedding's plus the head's: sum the two copies'."""
        copy = self._tied_copy
        assert copy is not None and copy.grad is not None
        grad = copy.grad
        if isinstance(grad, DTensor) and grad.placements != copy.placements:
            # DTensor's embedding backward leaves a replicated gradient; the head's is sharded
            # over the vocabulary like the weight. Pair up the same rows on both sides.
            grad = copy.grad = grad.redistribute(grad.device_mesh, copy.placements)
        dist.all_reduce(local(grad), group=self._embedding_group)

    @torch.no_grad()
    def _sum_partial_gradients(self) -> None:
        """A replicated weight applied to sequence-sharded activations (a norm under sequence
        parallelism) has a gradient that is a partial sum over the tp group (DTensor's Partial),
        which the optimizer step would sum anyway: sum it before the norm, which must see the
        gradient itself, not the squares of its parts."""
        for p in self.parameters():
            g = p.grad
            if isinstance(g, DTensor) and any(placement.is_partial() for placement in g.placements):
                summed = [Replicate() if placement.is_partial() else placement for placement in g.placements]
                p.grad = g.redistribute(g.device_mesh, summed)

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient (`max_norm` 0: only measure it);
        return the norm before clipping, a 0-dim tensor left on the device. One process that
        holds every gradient whole clips as torch does (`clip_grad_norm_`). Otherwise each rank
        sums the squares of what it holds, divided by how many ranks hold the same values,
        then one all-reduce over the world."""
        if self.mesh is None:
            params = [p for p in self.parameters() if p.grad is not None]
            if max_norm > 0:
                return torch.nn.utils.clip_grad_norm_(params, max_norm)
            return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        self._sum_partial_gradients()
        ranks_per_stage = self.replicas * self.dims.tp
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        head_copy = self._tied_copy if self._head_copy_part is not None else None
        counted = [p.grad for p in self.parameters() if p.grad is not None and p is not head_copy]
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for g in counted:
            copies = ranks_per_stage
            if isinstance(g, DTensor):
                for dim, placement in enumerate(g.placements):
                    # Sharded over this dim: Shard, or the strided shard FSDP uses over a
                    # tensor-parallel dim (not replicated, whatever its class).
                    if not placement.is_replicate():
                        copies //= g.device_mesh.size(dim)
            total += local(g).double().pow(2).sum() / copies
        dist.all_reduce(total)
        norm = total.sqrt()
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for g in grads:
                local(g).mul_(coef.to(g.dtype))
        return norm

    def clip_grad_norm(self, max_norm: float) -> float:
        """`clip_gradients`, the norm read by the host."""
        return self.clip_gradients(max_norm).item()

    def optimizer_step(self, lr: float) -> None:
        """Set the learning rate, step the optimizer, zero the gradients."""
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        for opt in self._optims:
            opt.step()
            opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_loss(self, tokens: torch.Tensor) -> float:
        """Mean loss over tokens [local_batch, T+1] (all ranks), no gradients."""
        for part in self.model_parts:
            part.eval()
        tokens = tokens.to(self.device)
        x, y, documents = self._inputs_and_labels(tokens)
        with self._context():
            if self.dims.pp == 1:
                loss = local(self.loss_fn(self.model_parts[0](x, **documents), y)).float()
            else:
                out = self._pipeline_forward(x, documents)
                loss = local(self.loss_fn(out, y)).float() if out is not None else torch.zeros((), device=self.device)
        for part in self.model_parts:
            part.train()
        return self._mean_over(loss).item()

    @torch.no_grad()
    def eval_logits(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, vocab] at the positions keep [B, T] marks (row-major), on every
        rank; every rank calls it with the same inputs. The last stage's cp and tp shards of
        the selected logits are put together and sent to the other stages."""
        dims, cp, rank = self.dims, self.dims.cp, self.cp_rank
        inputs, keep = inputs.to(self.device), keep.to(self.device)
        x, local_keep = shard_sequence(inputs, cp, rank), shard_sequence(keep, cp, rank)
        trained_positions = [part.positions for part in self.model_parts]
        for part in self.model_parts:
            part.eval()
            if cp > 1:  # the global positions of this rank's slice of rows of this length
                part.positions = cp_positions(x.shape[1], cp, rank, self.device)
        try:
            with self._context(), logits_out(self.model_parts):
                out = self.model_parts[0](x) if dims.pp == 1 else self._pipeline_forward(x)
        finally:
            for part, positions in zip(self.model_parts, trained_positions, strict=True):
                part.positions = positions
                part.train()
        if out is None or cp > 1:  # sent by the last stage, or summed over the cp ranks
            selected = torch.zeros(int(keep.sum()), self.model_config.vocab_size, device=self.device)
        if out is not None:
            mine = local(out)[local_keep].float()
            if dims.tp > 1:  # vocabulary shards, in tp-rank order
                shards = [torch.empty_like(mine) for _ in range(dims.tp)]
                dist.all_gather(shards, mine.contiguous(), group=self._group("tp"))
                mine = torch.cat(shards, dim=-1)
            if cp > 1:  # each rank fills the rows of its positions; the sum holds them all
                order = (keep.flatten().cumsum(0) - 1).view_as(keep)
                selected[shard_sequence(order, cp, rank)[local_keep]] = mine
                dist.all_reduce(selected, group=self._group("cp"))
            else:
                selected = mine
        if dims.pp > 1:
            dist.broadcast(selected, src=dist.get_global_rank(self.pp_group, dims.pp - 1), group=self.pp_group)
        return selected

    def _pipeline_forward(
        self, x: torch.Tensor, documents: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor | None:
        """Forward only, stage after stage (validation and evaluation need no schedule): the
        last stage's output on the last pipeline rank, None on the others."""
        documents = documents or {}
        dims, S = self.dims, self.dims.num_stages
        seq = x.shape[1] // dims.tp if (dims.tp > 1 and dims.sequence_parallel) else x.shape[1]
        out = None
        for s in range(S):
            if s % dims.pp != self.pp_rank:
                continue
            part = self.model_parts[self.stage_ids.index(s)]
            if s == 0:
                inp = x
            else:
                inp = torch.empty(x.shape[0], seq, self.model_config.hidden, device=self.device)
                dist.recv(inp, group=self.pp_group, group_src=(s - 1) % dims.pp)
            out = part(inp, **documents)
            if s < S - 1:
                dist.send(local(out).float().contiguous(), group=self.pp_group, group_dst=(s + 1) % dims.pp)
                out = None
        return out

    def state_dict_for_checkpoint(self) -> dict[str, Any]:
        """{"model": ..., "optim": ...} of (D)Tensors keyed by stable FQNs, for DCP."""
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        for index, (part, opt) in enumerate(zip(self.model_parts, self.optimizers)):
            model.update(get_model_state_dict(part))
            part_optim = get_optimizer_state_dict(part, opt, options=FLAT_OPTIMIZER_STATE)
            optim.update({self._optimizer_key(index, k): v for k, v in part_optim.items()})
        return {"model": model, "optim": optim}

    def load_state_dict_from_checkpoint(self, state: dict[str, Any]) -> None:
        for index, (part, opt) in enumerate(zip(self.model_parts, self.optimizers)):
            keys = get_model_state_dict(part).keys()
            set_model_state_dict(part, {k: state["model"][k] for k in keys}, options=StateDictOptions(strict=True))
            okeys = get_optimizer_state_dict(part, opt, options=FLAT_OPTIMIZER_STATE).keys()
            part_optim = {k: state["optim"][self._optimizer_key(index, k)] for k in okeys}
            set_optimizer_state_dict(part, opt, part_optim, options=FLAT_OPTIMIZER_STATE)

    def _optimizer_key(self, part_index: int, key: str) -> str:
        """The checkpoint key of a part's optimizer-state entry: one process names the tied
        weight after the embedding, so the head's copy is saved and loaded under that name."""
        return _optimizer_key_as_embedding(key) if part_index == self._head_copy_part else key
