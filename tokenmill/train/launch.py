"""Run in-process on one device, or re-launch under torchrun when the config asks for more.

`tokenmill train` started by a user with tp*pp*dp > 1 execs
`python -m torch.distributed.run --standalone --nproc-per-node W -m tokenmill.cli train ...`;
started by torchrun (``LOCAL_RANK`` set) it just runs, so multi-node users call torchrun
themselves with `--nnodes` and the same arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tokenmill.errors import TokenmillError


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_torchrun(world_size: int, argv: list[str]) -> int:
    """Run ``tokenmill <argv>`` in ``world_size`` local processes; return the exit status."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={world_size}", "-m", "tokenmill.cli", *argv,
    ]
    env = dict(os.environ)
    # Each rank gets its share of the cores, not all of them (gloo on a CPU oversubscribes).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    try:
        return subprocess.run(command, env=env, check=False).returncode
    except OSError as error:
        raise TokenmillError(f"could not start torchrun: {error}") from None
