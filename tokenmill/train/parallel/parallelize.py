"""`parallelize_gpt`: the plain GPT under this rank's share of tp x pp x dp x cp, in one
function a reader follows top to bottom (torchtitan's `parallelize_llama`, plus the pipeline
split).

Order (torchtitan's): the model exists on the meta device; split it into this rank's pipeline
stages; then, per stage, tensor (+ sequence) parallel, activation checkpointing, `compile` per
block, FSDP2 (ZeRO-2/3, over dp x cp); then allocate and initialize this rank's share, and
make its attention a ring over the cp ranks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from tokenmill.train.config import ParallelConfig, TrainConfig
from tokenmill.train.model import GPT
from tokenmill.train.model_transforms import apply_ac, apply_activation_offload, apply_compile, materialize
from tokenmill.train.parallel.context_parallel import apply_context_parallel
from tokenmill.train.parallel.data_parallel import apply_fsdp
from tokenmill.train.parallel.float8 import apply_float8
from tokenmill.train.parallel.pipeline import make_stage_module, split_layers
from tokenmill.train.parallel.tensor_parallel import apply_tensor_parallel


def parallelize_gpt(
    model: GPT,
    dims: ParallelConfig,
    config: TrainConfig,
    mesh: DeviceMesh | None,
    replica_mesh: DeviceMesh | None,
    stage_ids: list[int],
    device: torch.device,
) -> list[nn.Module]:
    """This rank's model parts (one per pipeline stage it runs), parallelized and initialized.
    `model` is the whole GPT on the meta device; every parameter's initial value depends only
    on the model's init seed and the parameter's name, so any layout starts from the weights
    one process would (the parity tests rely on this). A model handed over with its weights
    (one process) keeps them and only moves to `device`. `replica_mesh` is `mesh`'s dp x cp
    flattened (`build_mesh`), the ranks over which every parameter is replicated; both are
    None for one process without FSDP2, which communicates nothing."""
    # 1. Pipeline: keep only this rank's stages (the embedding on the first, the head on the last).
    if dims.pp > 1:
        bounds = split_layers(model.config, dims.num_stages)
        parts = [make_stage_module(model, bounds[s], s == 0, s == dims.num_stages - 1) for s in stage_ids]
    else:
        parts = [model]
    for part in parts:
        # 1b. float8 Linear layers (torchtitan converts the model before parallelizing it).
        if dims.float8:
            apply_float8(part, emulate=device.type == "cpu")
        # 2. Tensor (+ sequence) parallel over the "tp" mesh dim.
        if dims.tp > 1:
            apply_tensor_parallel(part, mesh["tp"], dims.sequence_parallel)
        # 3. Activation checkpointing: recompute blocks in the backward pass.
        apply_ac(part, config.parallel.activation_checkpointing)
        # 4. compile, block by block.
        if config.parallel.compile:
            apply_compile(part)
        # 4b. Activation offload: what each block saves for the backward pass, in host memory.
        apply_activation_offload(part, config.parallel.activation_offload)
        # 5. FSDP2 over the flattened "dp_cp" mesh dim for ZeRO-2/3 (ZeRO-1 is the optimizer's,
        # see the engine); under bf16 it gathers bf16 parameters and reduces gradients in fp32.
        if uses_fsdp(dims):
            apply_fsdp(part, replica_mesh, dims.zero, bf16=dims.precision == "bf16")
        # 6. Allocate this rank's share and initialize it.
        if any(p.is_meta for p in part.parameters()):
            materialize(part, device)
        else:
            part.to(device)
        # 7. Context parallel over the "cp" mesh dim: ring attention, global positions.
        if dims.cp > 1:
            apply_context_parallel(part, mesh.get_group("cp"), config.sequence_length, device)
    return parts


def uses_fsdp(dims: ParallelConfig) -> bool:
    """FSDP2 shards over the dp x cp ranks for ZeRO-2/3; on a single process (world = 1) it
    still applies, so one device runs the same code (and mixed precision) as many."""
    return dims.zero >= 2 and (dims.dp * dims.cp > 1 or dims.world_size == 1)
