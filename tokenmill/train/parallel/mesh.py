"""The process layout (`tokenmill.train.config.ParallelConfig`, which also checks that it
can hold the model) as processes: the distributed launch and the
`DeviceMesh` with dims ("pp", "dp", "cp", "tp") (tp innermost, so a tensor-parallel group
sits inside one node when ranks are numbered node by node; cp next, its ring exchanging
key/value blocks every layer). The dp and cp dims are also flattened into "dp_cp": every
parameter is replicated over cp as over dp, so gradients are averaged, and ZeRO shards, over
both (torchtitan shards FSDP over dp x cp too)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tokenmill.errors import ConfigError
from tokenmill.train.config import ParallelConfig

MESH_DIMS = ("pp", "dp", "cp", "tp")
_own_group = False  # init_distributed made an in-memory group of one (no torchrun)


def init_distributed(device: torch.device | None = None, world_size: int | None = None) -> torch.device:
    """Join the process group torchrun describes (gloo on the CPU, nccl on GPUs). A run of
    one process (`world_size` 1, e.g. FSDP2 on one GPU) without torchrun makes a group of its
    own, in memory."""
    global _own_group
    use_cuda = (device.type == "cuda") if device is not None else torch.cuda.is_available()
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend=backend)
        elif world_size == 1:
            if use_cuda and device is not None and device.index is not None:
                torch.cuda.set_device(device)
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
            _own_group = True
        else:
            raise ConfigError("tp x pp x dp x cp > 1 needs a distributed launch (torchrun or `tokenmill train`)")
    if use_cuda:
        if "LOCAL_RANK" not in os.environ and device is not None and device.index is not None:
            return device
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def release_own_group() -> None:
    """Destroy the group of one `init_distributed` made for a single process, so the next run
    in this process (another layout, or a launch under torchrun) starts without it."""
    global _own_group
    if _own_group and dist.is_initialized():
        dist.destroy_process_group()
    _own_group = False


def shutdown_distributed() -> None:
    """Leave the process group once every rank is done. Left to the interpreter's exit, the
    group's transport threads (and the rendezvous store that rank 0 hosts) are torn down in
    no set order, and a rank can abort ("terminate called without an active exception")
    after its work is finished."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_mesh(dims: ParallelConfig, device_type: str = "cpu") -> tuple[DeviceMesh, DeviceMesh]:
    """The 4D mesh ("pp", "dp", "cp", "tp"), every dim present even when its size is 1, and
    its "dp" x "cp" dims flattened into the 1D "dp_cp" mesh (gradient reduction and ZeRO)."""
    mesh = init_device_mesh(device_type, (dims.pp, dims.dp, dims.cp, dims.tp), mesh_dim_names=MESH_DIMS)
    return mesh, mesh["dp", "cp"]._flatten("dp_cp")


def embedding_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """Megatron's embedding group: the first and the last pipeline rank at this rank's
    (dp, cp, tp) position, which hold the two copies of tied input/output embeddings (None off those ranks).
    Every rank takes part in creating every pair's group, as `new_group` requires."""
    ranks = mesh.mesh.reshape(mesh.mesh.shape[0], -1)
    mine = None
    for position in range(ranks.shape[1]):
        pair = [int(ranks[0, position]), int(ranks[-1, position])]
        group = dist.new_group(pair)
        if dist.get_rank() in pair:
            mine = group
    return mine
