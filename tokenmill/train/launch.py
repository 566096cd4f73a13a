"""Run in-process on one device, or start one process per rank when the config asks for more.

`tokenmill train` started by a user with tp*pp*dp*cp > 1 (or with restarts asked for) checks the
config, the data and the layout itself (so a mistake is one line, before any rank starts),
then starts ``python -m tokenmill.train.worker CONFIG ...`` once per rank and supervises them
(supervisor.py: restarts under ``--max-restarts``). Started with torchrun's variables
(``LOCAL_RANK`` and ``WORLD_SIZE`` set) it is a rank and just runs, so multi-node runs are
torchrun's, with ``--nnodes`` and the same arguments (docs/processes.md).

The ranks never import a `tokenmill` folder that happens to be in the working directory
(PYTHONSAFEPATH: `-m` does not put the cwd on the import path). Each rank runs in a session of
its own, so a Ctrl-C at the terminal reaches the launcher alone, which ends the ranks and
exits 130; killed outright, the launcher takes them with it (lifecycle.die_with_parent).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tokenmill.errors import ConfigError

# torchrun's switch that gives each attempt a store of its own, hosted by rank 0.
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def is_rank() -> bool:
    """Whether this process is a rank: started by the supervisor or by torchrun."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_torchrun_restarts() -> None:
    """One line, before a rank starts, for torchrun restarts that cannot rejoin: by default the
    agent of torchrun's first node hosts one store for every attempt (``TORCHELASTIC_USE_AGENT_STORE``),
    and the ranks' keys carry no attempt, so a restarted rank can read the address a rank of the
    previous attempt listened at and fail to connect to it (gloo's connectFullMesh refused).
    With ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` each attempt's rank 0 hosts a fresh store."""
    shared_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    if shared_store and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        raise ConfigError(
            "torchrun --max-restarts shares one store between attempts, where restarted ranks can meet the"
            f" previous attempt's addresses; start torchrun with {FRESH_STORE_ENV}=1 in its environment"
        )


def child_env(world_size: int) -> dict[str, str]:
    """The environment of the training processes this one starts."""
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"  # the cwd never shadows the installed package (Python >= 3.11)
    # Each rank gets its share of the cores, not all of them (gloo on a CPU oversubscribes).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    return env


def launch_ranks(world_size: int, argv: list[str], max_restarts: int = 0, run_dir: str | None = None) -> int:
    """Run ``python -m tokenmill.train.worker <argv>`` in ``world_size`` local processes; return the
    exit status. A failed rank restarts them all, up to ``max_restarts`` times; failures are
    recorded in ``run_dir``. SIGUSR1 and SIGTERM to this process meanwhile ask the ranks to
    stop at a checkpoint.

    KeyboardInterrupt (Ctrl-C) stops the ranks, then propagates to the caller."""
    from tokenmill.train.rank_server import TRAINING_PRELOAD
    from tokenmill.train.supervisor import supervise

    previous = _forward_stop_requests(run_dir)
    try:
        command = [sys.executable, "-m", "tokenmill.train.worker", *argv]
        return supervise(
            world_size,
            command,
            max_restarts=max_restarts,
            run_dir=run_dir,
            env=child_env(world_size),
            preload=TRAINING_PRELOAD,
        )
    finally:
        _restore(previous)


def _forward_stop_requests(run_dir: str | None) -> dict[int, object]:
    """SIGUSR1 or SIGTERM to the launcher asks the ranks to stop at a checkpoint: they run in
    sessions of their own, so the request goes through the run's STOP file,
    which rank 0 reads every step (stop.py). A request left by an earlier run is removed."""
    from tokenmill.train.stop import STOP_FILE, request_stop

    if not run_dir:
        return {}
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)

    def forward(signum: int, frame: object) -> None:
        request_stop(run_dir)

    previous: dict[int, object] = {}
    try:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread: nothing to forward
        pass
    return previous


def _restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
