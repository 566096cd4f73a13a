"""The process layout: checks that a (tp, pp, dp) layout can hold the model, and the
`DeviceMesh` with dims ("pp", "dp", "tp") (tp innermost, so a tensor-parallel group sits
inside one node when ranks are numbered node by node)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tokenmill.errors import ConfigError
from tokenmill.train.config import TrainConfig
from tokenmill.train.model import ModelConfig

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    tp: int
    pp: int
    dp: int
    zero: int = 0
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> "ParallelDims":
        return cls(cfg.tp, cfg.pp, cfg.dp, cfg.zero, cfg.pp_schedule, cfg.virtual_stages, cfg.sequence_parallel)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def stages_per_rank(self) -> int:
        return self.virtual_stages if self.pp_schedule == "interleaved" and self.pp > 1 else 1

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank


def validate_layout(dims: ParallelDims, model: ModelConfig, seq_len: int, world_size: int | None = None) -> None:
    """Raise ConfigError (naming the key) when the layout cannot hold the model."""
    if world_size is not None and dims.world_size != world_size:
        raise ConfigError(
            f"tp x pp x dp = {dims.tp} x {dims.pp} x {dims.dp} = {dims.world_size} "
            f"but {world_size} processes were launched; they must be equal"
        )
    if dims.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero: must be 0, 1, 2 or 3, got {dims.zero}")
    if dims.tp > 1:
        assert model.n_kv_heads is not None and model.ffn_hidden is not None
        for name, value in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads),
                            ("ffn_hidden", model.ffn_hidden), ("vocab_size", model.vocab_size)):
            if value % dims.tp:
                raise ConfigError(f"tp: {dims.tp} does not divide model.{name} = {value}")
        if dims.sequence_parallel and seq_len % dims.tp:
            raise ConfigError(f"sequence_parallel: seq_len {seq_len} is not divisible by tp = {dims.tp}")
    if dims.pp > 1 and dims.pp_schedule == "interleaved" and dims.virtual_stages < 2:
        raise ConfigError("virtual_stages: the interleaved schedule needs virtual_stages >= 2")
    if dims.num_stages > model.n_layers:
        raise ConfigError(
            f"pp: {dims.num_stages} pipeline stages (pp={dims.pp} x virtual_stages={dims.stages_per_rank}) "
            f"but the model has only {model.n_layers} layers; every stage needs at least one"
        )


def init_distributed(device: torch.device | None = None) -> torch.device:
    """Join the process group torchrun describes (gloo on the CPU, nccl on GPUs)."""
    use_cuda = (device.type == "cuda") if device is not None else torch.cuda.is_available()
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise ConfigError("tp x pp x dp > 1 needs a distributed launch (torchrun or `tokenmill train`)")
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def build_mesh(dims: ParallelDims, device_type: str = "cpu") -> DeviceMesh:
    """A 3D mesh ("pp", "dp", "tp"); every dim exists even when its size is 1."""
    return init_device_mesh(device_type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=MESH_DIMS)


def embedding_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """Megatron's embedding group: the first and the last pipeline rank at this rank's (dp, tp)
    position, which hold the two copies of tied input/output embeddings (None off those ranks).
    Every rank takes part in creating every pair's group, as `new_group` requires."""
    ranks = mesh.mesh
    pp = ranks.shape[0]
    mine = None
    for dp_index in range(ranks.shape[1]):
        for tp_index in range(ranks.shape[2]):
            pair = [int(ranks[0, dp_index, tp_index]), int(ranks[pp - 1, dp_index, tp_index])]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = group
    return mine
