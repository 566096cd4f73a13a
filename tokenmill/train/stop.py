"""Stopping a run at a checkpoint on request: a job's time limit or pre-emption is near.

A request is one of:

- SIGUSR1 to a training process (Slurm's warning signal, `--signal=USR1@SECONDS`);
- SIGTERM to a training process that is not a rank of `tokenmill train`'s own supervisor (a
  single process, or ranks under torchrun as in a Slurm job: Slurm sends SIGTERM at the time
  limit and on pre-emption, then SIGKILL after its KillWait). Ranks of the supervisor
  (supervisor.py) are sent SIGTERM when another rank failed or on Ctrl-C, which means stop now;
- the file ``RUN/STOP`` (``touch RUN/STOP``): how the launcher of a multi-rank run and a Slurm
  batch script, which cannot signal ranks on other nodes, pass the request on. Rank 0 alone
  looks for it, once per step.

Ranks see a request at different times (or one rank alone sees it): each step ends with an
all-reduce (max) of the flag, so every rank stops after the same step, and the checkpoint
written there is consistent. The run then exits with ``STOPPED_EXIT``; ``--resume`` continues it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tokenmill.entry import INTERRUPTED_EXIT
from tokenmill.errors import TokenmillError
from tokenmill.train.lifecycle import SUPERVISOR_PID_ENV

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# The exit status of a run that stopped at a checkpoint on request (not a failure: resume it).
STOPPED_EXIT = 99
STOP_FILE = "STOP"


class TrainingStopped(TokenmillError):
    """Training stopped at a checkpoint on request; the run is to be resumed."""

    exit_status = STOPPED_EXIT


def stop_signals() -> list[signal.Signals]:
    """The signals this process treats as a request to stop at the next step's end."""
    if os.environ.get(SUPERVISOR_PID_ENV):
        return [signal.SIGUSR1]
    return [signal.SIGUSR1, signal.SIGTERM]


def request_stop(run_dir: str | Path) -> Path:
    """Ask the run writing ``run_dir`` to stop at a checkpoint (the ``STOP`` file)."""
    path = Path(run_dir) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


class StopRequest:
    """Signal handlers and the ``STOP`` file, read at the end of every step by ``agreed``."""

    def __init__(self, run_dir: str | Path, *, watch_file: bool, world_size: int) -> None:
        self.file = Path(run_dir) / STOP_FILE
        self.watch_file = watch_file
        self.world_size = world_size
        self.reason: str | None = None
        self._previous: dict[signal.Signals, object] = {}

    def install(self) -> StopRequest:
        for sig in stop_signals():
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (tests that train in a thread): no signals
                break
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the step in progress (maybe inside a collective) finishes first.
        self.reason = self.reason or signal.Signals(signum).name

    def agreed(self, device: torch.device) -> bool:
        """Whether every rank stops after this step: one rank's request is every rank's."""
        if self.reason is None and self.watch_file and self.file.exists():
            self.reason = f"{self.file}"
        if self.world_size == 1:
            return self.reason is not None
        # Imported here: the launcher and the recipe runner read this module's constants and
        # never load torch.
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.reason is not None else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.reason is None:
            self.reason = "another rank's request"
        return bool(flag.item())

    def clear_file(self) -> None:
        """The request is acted on: the next job of the run must not stop at its first step."""
        self.file.unlink(missing_ok=True)


# How long Ctrl-C waits for the interpreter to stop the run itself before the process ends.
INTERRUPT_GRACE_S = 3.0


@contextmanager
def prompt_interrupt(last_line: Callable[[], str | None], grace_s: float = INTERRUPT_GRACE_S) -> Iterator[None]:
    """Ctrl-C ends this process within ``grace_s`` also while the main thread is inside one
    long native call (the forward of a huge batch, minutes on the CPU), where Python raises
    KeyboardInterrupt only once the call returns. The interpreter's C handler writes each
    signal to a pipe (`signal.set_wakeup_fd`) at once; a thread reading it gives the main thread
    ``grace_s`` to stop by itself, then prints ``last_line()`` (None: nothing) and ends the
    process with status 130. Nothing is published half-way: checkpoints appear by rename."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                received = os.read(read_fd, 64)
            except OSError:
                return
            if not received:
                return
            if signal.SIGINT in received and not done.wait(grace_s):
                line = last_line()
                if line:
                    print(line, file=sys.stderr, flush=True)
                os._exit(INTERRUPTED_EXIT)

    watcher = threading.Thread(target=watch, name="tokenmill-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the watcher reads the end of the pipe and returns
        watcher.join(timeout=grace_s + 1)
        os.close(read_fd)
