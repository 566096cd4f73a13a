"""Pipeline parallelism: split the GPT into stages by layer count (the head's matmul counted
in the balance) and build `torch.distributed.pipelining` schedules over them.

Stage s of S owns a contiguous run of layers; stage 0 also owns the embeddings, stage S-1 the
final norm and the head. Under the interleaved schedule rank r owns stages r, r+pp, r+2pp, ...
(Megatron's virtual stages). Parameter names stay those of the full model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from tokenmill.train.flops import head_flops, layer_flops
from tokenmill.train.model_config import ModelConfig


def stage_costs(model: ModelConfig) -> tuple[float, float]:
    """(cost of one layer, cost of the head) in training FLOPs per token of their matmuls; the
    embedding is a lookup and costs nothing to compute, and attention, the same in every
    layer, does not move the balance."""
    assert model.ffn_hidden is not None and model.n_kv_heads is not None
    layer = layer_flops(
        model.hidden, model.ffn_hidden, model.n_kv_heads * model.head_dim, gated=model.flavour == "llama"
    )
    return float(layer), float(head_flops(model.hidden, model.vocab_size))


def split_layers(model: ModelConfig, num_stages: int) -> list[list[int]]:
    """Contiguous layer ranges, one per stage, minimising the slowest stage's cost (every stage
    gets at least one layer; the last stage also pays for the head)."""
    L = model.n_layers
    if num_stages > L:
        raise ValueError(f"{num_stages} stages for {L} layers")
    layer, head = stage_costs(model)
    inf = float("inf")
    # best[s][i]: the smallest max-cost for the first i layers in s stages; cut[s][i]: last cut.
    best = [[inf] * (L + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (L + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, L + 1):
            for j in range(s - 1, i):
                cost = (i - j) * layer + (head if (s == num_stages and i == L) else 0.0)
                value = max(best[s - 1][j], cost)
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    bounds, i = [], L
    for s in range(num_stages, 0, -1):
        j = cut[s][i]
        bounds.append(list(range(j, i)))
        i = j
    return bounds[::-1]


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def make_stage_module(full: nn.Module, layers: list[int], first: bool, last: bool) -> nn.Module:
    """A copy of the model holding only `layers` (and the embeddings / head if first / last)."""
    part = copy.deepcopy(full)
    keep = {str(i) for i in layers}
    for name in list(part.layers.keys()):
        if name not in keep:
            del part.layers[name]
    if not first:
        part.tok_embeddings = None
        part.pos_embeddings = None
    if not last:
        part.norm = None
        part.output = None
    return part


def build_schedule(
    parts: list[nn.Module],
    ids: list[int],
    num_stages: int,
    device: torch.device,
    group,
    n_microbatches: int,
    schedule: str,
    loss_fn: Callable,
):
    """Fresh PipelineStages over the parts and the schedule that drives them."""
    stages = [PipelineStage(part, sid, num_stages, device, group=group) for part, sid in zip(parts, ids)]
    if schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
