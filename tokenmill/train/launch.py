"""Run in-process on one device, or re-launch under torchrun when the config asks for more.

`tokenmill train` started by a user with tp*pp*dp > 1 (or with restarts asked for) checks the
config, the data and the layout itself (so a mistake is one line, before any worker starts),
then runs `python -m tokenmill.train.agent W --max-restarts N -- CONFIG ...`: torchrun with
`--standalone --nproc-per-node W --max-restarts N -m tokenmill.train.worker` (see agent.py).
Started by torchrun (``LOCAL_RANK`` set) it just runs, so multi-node users call torchrun
themselves with `--nnodes` and the same arguments (docs/processes.md).

The children never import a `tokenmill` folder that happens to be in the working directory
(PYTHONSAFEPATH: `-m` does not put the cwd on the import path). The agent runs in its own
session, so a Ctrl-C at the terminal reaches the launcher alone, which stops the agent (and
the agent its workers) and exits 130; killed outright, the launcher takes them with it
(lifecycle.die_with_parent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.train.lifecycle import LAUNCHER_PID_ENV

STOP_TIMEOUT_S = 60.0


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def child_env(world_size: int) -> dict[str, str]:
    """The environment of the agent and its workers."""
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"  # the cwd never shadows the installed package (Python >= 3.11)
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    # Each rank gets its share of the cores, not all of them (gloo on a CPU oversubscribes).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    return env


def launch_torchrun(world_size: int, argv: list[str], max_restarts: int = 0, run_dir: str | None = None) -> int:
    """Run ``python -m tokenmill.train.worker <argv>`` in ``world_size`` local processes; return the exit status.
    A failed rank restarts them all, up to ``max_restarts`` times; failures are recorded in
    ``run_dir``.

    KeyboardInterrupt (Ctrl-C) stops the workers, then propagates to the caller."""
    command = [sys.executable, "-m", "tokenmill.train.agent", str(world_size), f"--max-restarts={max_restarts}"]
    if run_dir:
        command.append(f"--run-dir={run_dir}")
    command += ["--", *argv]
    previous = _forward_stop_requests(run_dir)
    try:
        agent = subprocess.Popen(command, env=child_env(world_size), start_new_session=True)
    except OSError as error:
        _restore(previous)
        raise TokenmillError(f"could not start torchrun: {error}") from None
    try:
        return agent.wait()
    except KeyboardInterrupt:
        _stop(agent)
        raise
    finally:
        _restore(previous)
        if agent.poll() is None:  # any other way out of here: leave nothing running
            _signal_group(agent, signal.SIGKILL)
            agent.wait()


def _forward_stop_requests(run_dir: str | None) -> dict[int, object]:
    """SIGUSR1 or SIGTERM to the launcher asks the ranks to stop at a checkpoint: they run in
    sessions of their own (torchrun's), so the request goes through the run's STOP file,
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


def _signal_group(agent: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(agent.pid, sig)
    except ProcessLookupError:
        pass


def _stop(agent: subprocess.Popen) -> None:
    """SIGTERM to the agent, which stops its workers and exits; SIGKILL if it takes too long
    or on a second Ctrl-C (the workers then end with it, by their parent-death signal)."""
    _signal_group(agent, signal.SIGTERM)
    try:
        agent.wait(timeout=STOP_TIMEOUT_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        _signal_group(agent, signal.SIGKILL)
        agent.wait()
