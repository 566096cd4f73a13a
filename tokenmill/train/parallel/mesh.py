"""The process layout (`tokenmill.train.config.ParallelConfig`, which also checks that it
can hold the model) as processes: the distributed launch and the
`DeviceMesh` with dims ("pp", "dp", "cp", "tp") (tp innermost, so a tensor-parallel group
sits inside one node when ranks are numbered node by node; cp next, its ring exchanging
key/value blocks every layer). The dp and cp dims are also flattened into "dp_cp": every
parameter is replicated over cp as over dp, so gradients are averaged, and ZeRO shards, over
both (torchtitan shards FSDP over dp x cp too)."""

from __future__ import annotations

import os
import socket
import struct
import sys

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
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            if backend == "gloo":
                choose_gloo_interface()
            store = rendezvous_store(rank, world_size)
            if store is None:  # torchrun's agent hosts the store: the ranks are its clients
                dist.init_process_group(backend=backend)
            else:
                dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)
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


def rendezvous_store(rank: int, world_size: int) -> dist.Store | None:
    """The store of torch's ``env://`` rendezvous at ``MASTER_ADDR:MASTER_PORT``, with rank 0's
    server listening on MASTER_ADDR's address only: torch's own listens on every interface,
    which lets any host that reaches this one talk to the job's store. None where torchrun's
    agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``), which the ranks then reach as
    torch does."""
    from torch.distributed.constants import default_pg_timeout
    from torch.distributed.rendezvous import _torchelastic_use_agent_store

    if _torchelastic_use_agent_store():
        return None
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    listening = listen_on(address, port) if rank == 0 else None
    try:
        store = dist.TCPStore(
            address,
            port,
            world_size,
            is_master=rank == 0,
            timeout=default_pg_timeout,
            multi_tenant=True,  # as torch's env:// store: later groups in this process share it
            master_listen_fd=listening.fileno() if listening is not None else None,
        )
    except BaseException:
        if listening is not None:
            listening.close()
        raise
    if listening is not None:
        listening.detach()  # the store's server owns the descriptor now, and closes it
    # The prefix torch's init_process_group gives the store it makes itself.
    return dist.PrefixStore("default_pg", store)


def choose_gloo_interface() -> None:
    """Unless the user named one (``GLOO_SOCKET_IFNAME``), gloo's connections listen on the
    interface this host reaches ``MASTER_ADDR`` through: loopback on one machine, the network
    between nodes. Left to gloo, they listen on the address the machine's name resolves to,
    where it can bind one, else on 127.0.0.1, which a rank on another node cannot reach: the
    ranks then fail to connect (or wait for each other until the collective timeout)."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or "MASTER_ADDR" not in os.environ:
        return
    interface = interface_towards(os.environ["MASTER_ADDR"])
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface


LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"
SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


def interface_towards(host: str) -> str | None:
    """The name of the interface whose address this host sends from to reach ``host`` (the
    routing table's choice; no packet is sent), None where it cannot be told (a name that does
    not resolve, IPv6 off loopback, a system without Linux's ioctl)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # a UDP connect only picks the route and the source address
            source = probe.getsockname()[0]
    except OSError:
        return None
    if source.startswith("127.") or source == "::1":
        return LOOPBACK_INTERFACE
    if family != socket.AF_INET or not sys.platform.startswith("linux"):
        return None
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(query.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(packed[20:24]) == source:
                return name
    return None


def listen_on(address: str, port: int) -> socket.socket:
    """A socket listening at ``address:port`` (a name is resolved, as the ranks resolve it to
    connect), with SO_REUSEADDR as torch's store sets it (the launcher may hold the port)."""
    family, kind, protocol, _, bound_to = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(bound_to)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


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
