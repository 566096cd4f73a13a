"""Process lifetime of a training run: one writer per run directory, and no worker outliving
the `tokenmill train` that started it.

- ``RunLock``: ``RUN/.lock``, held with ``fcntl.flock`` by the process that writes the run
  (the single process, or rank 0 under torchrun). The kernel releases it when that process
  ends, however it ends, so a killed run never leaves a stale lock behind.
- ``die_with_parent``: on Linux the kernel kills this process when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); a thread also polls the parent and the launcher
  pids, which covers other systems and a launcher that is a grandparent (workers run under
  the torchrun agent, not directly under `tokenmill train`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.infra.lock import PidLock, pid_alive

LOCK_NAME = ".lock"
# Set by the launcher and the agent for their children: the processes a worker must not outlive.
LAUNCHER_PID_ENV = "TOKENMILL_LAUNCHER_PID"
AGENT_PID_ENV = "TOKENMILL_AGENT_PID"
# Set by `tokenmill run` for the `tokenmill train` it starts, which must not outlive the run.
PIPELINE_PID_ENV = "TOKENMILL_PIPELINE_PID"
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


class RunInUseError(TokenmillError):
    """Another process is writing the same run directory."""


def _in_use(run_dir: Path, holder: str) -> RunInUseError:
    return RunInUseError(
        f"{run_dir} is being written by another `tokenmill train` (pid {holder}); "
        "wait for it to finish or stop it, or pass another --out"
    )


class RunLock(PidLock):
    """``RUN/.lock``: an exclusive, non-blocking lock on a run directory (a no-op where fcntl is
    missing)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / LOCK_NAME, lambda holder: _in_use(self.run_dir, holder))


def check_run_unlocked(run_dir: str | Path) -> None:
    """Raise RunInUseError if a process holds ``run_dir``'s lock; create and hold nothing."""
    RunLock(run_dir).check_free()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent(expected_parent: int | None = None, also_watch: int | None = None) -> None:
    """End this process (SIGKILL) as soon as its parent, or the process ``also_watch``, is gone.

    ``expected_parent``: the pid the parent had when it started us; if we were re-parented
    before the kernel hook was set, the parent is already gone and we end now.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the polling thread below still applies
    parent = os.getppid()
    if expected_parent is not None and parent != expected_parent:
        _die()
    if also_watch is not None and not pid_alive(also_watch):
        _die()

    def watch() -> None:
        while True:
            time.sleep(POLL_SECONDS)
            if os.getppid() != parent or (also_watch is not None and not pid_alive(also_watch)):
                _die()

    threading.Thread(target=watch, name="tokenmill-parent-watch", daemon=True).start()


def env_pid(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None
