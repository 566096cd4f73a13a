"""Process lifetime of a training run: one writer per run directory, and no worker outliving
the `tokenmill train` that started it.

- ``RunLock``: ``RUN/.lock``, held with ``fcntl.flock`` by the process that writes the run
  (the single process, or rank 0 of several). The kernel releases it when that process
  ends, however it ends, so a killed run never leaves a stale lock behind.
- ``die_with_parent``: on Linux the kernel kills this process when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); a thread also polls the parent, which covers other
  systems.
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
from tokenmill.infra.lock import PidLock
from tokenmill.infra.outputs import OutputKind

LOCK_NAME = ".lock"
# What `--out` may be: a run directory (any of what a run writes first), or nothing yet.
RUN_OUTPUT = OutputKind("a run directory", ("checkpoints", "metrics.jsonl", "config.yaml", "tensorboard", LOCK_NAME))
# Set by the supervisor (supervisor.py) for its ranks: the process a rank must not outlive, and
# the mark of a rank for whom SIGTERM means stop now (stop.py).
SUPERVISOR_PID_ENV = "TOKENMILL_SUPERVISOR_PID"
# Set by `tokenmill run` for the `tokenmill train` it starts, which must not outlive the run.
PIPELINE_PID_ENV = "TOKENMILL_PIPELINE_PID"
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


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


def die_with_parent(expected_parent: int | None = None) -> None:
    """End this process (SIGKILL) as soon as its parent is gone.

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

    def watch() -> None:
        while True:
            time.sleep(POLL_SECONDS)
            if os.getppid() != parent:
                _die()

    threading.Thread(target=watch, name="tokenmill-parent-watch", daemon=True).start()


def name_process(name: str) -> None:
    """Name this process as `ps -o comm`, `top` and psutil's ``name()`` show it (Linux; at most
    15 bytes), where its command line is its parent's (a forked rank)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass


def env_pid(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None
