"""How many CPU cores a process may use, and how many of them are free now.

On a shared machine torch's default (one OpenMP thread per core of the machine) oversubscribes:
threads that other processes' work keeps waiting spin at every parallel region's barrier, and a
forward pass slows several times over. Work that sets its own thread count asks `free_cores`;
a process that runs torch on the CPU (training on one device, evaluation) sets its threads with
`set_torch_threads`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container's `--cpus`), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def free_cores() -> int:
    """Available cores minus those other work keeps busy, judged by the 1-minute load average
    (scaled to our share of the machine's CPUs, since the load is the whole machine's), at least 1."""
    cores = available_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    busy = load * cores / max(cores, os.cpu_count() or cores)
    return max(1, min(cores, round(cores - busy)))


def torch_threads(requested: int | None = None) -> int | None:
    """The torch CPU thread count: `requested`, else the cores free now (an idle machine's
    cores, one on a loaded one, where more threads only spin), else None when OMP_NUM_THREADS
    is set, which torch reads itself."""
    if requested is not None:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cores()


def set_torch_threads(requested: int | None = None) -> int | None:
    """Give torch the thread count `torch_threads` chooses; returns it (None: left to torch)."""
    import torch

    threads = torch_threads(requested)
    if threads is not None:
        torch.set_num_threads(threads)
    return threads


def _cgroup_quota() -> float | None:
    """CPUs allowed by cgroup v2's `cpu.max` ("max 100000" or "200000 100000"), or None."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
