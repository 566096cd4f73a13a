"""A rank waiting in one collective for longer than ``parallel.collective_timeout`` ends the job.

A rank that stops (SIGSTOP, a stuck device, a lost node) leaves the others blocked in their
next collective, and neither gloo's nor NCCL's own timeouts cover every group a 3D layout
creates (DeviceMesh sub-groups default to 30 minutes). A thread of each rank looks at the
main thread's stack every second: when the same torch.distributed call has been waiting
longer than the timeout, it prints one line naming this rank and the operation (the
torch.distributed function, and the tokenmill function that called it) and ends the process
with `HANG_EXIT`, so the launcher stops the job, or restarts it under ``--max-restarts``.
A collective that fails (a peer died: "Connection reset by peer") is reported the same way,
as one line naming the rank and the operation (`collective_failure`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

from tokenmill.errors import TEMPFAIL_EXIT, TokenmillError

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

HANG_EXIT = 124  # as timeout(1): the job did not finish in time
PEER_FAILED_EXIT = TEMPFAIL_EXIT  # EX_TEMPFAIL: this rank is fine, a peer failed (the launcher looks past it)
POLL_SECONDS = 1.0
_TORCH_DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep
_TOKENMILL = os.sep + "tokenmill" + os.sep
_WRAPPERS = {"wrapper", "wait", "_wait", "__call__", "inner", "_fn"}


# Functions of ours that block on other ranks outside torch.distributed's Python code (a Work's
# wait), by code object, with the operation's name: seen as collectives (`waits_for_peers`).
_PEER_WAITS: dict[CodeType, str] = {}


def waits_for_peers(operation: str) -> Callable[[F], F]:
    """Mark a function that waits on other ranks (``work.wait()`` of an asynchronous send or
    receive) as the collective ``operation``: the watchdog times it, and its failure is said in
    one line, as for torch.distributed's own calls."""

    def mark(function: F) -> F:
        _PEER_WAITS[function.__code__] = operation
        return function

    return mark


def _qualified(frame: FrameType) -> str:
    code = frame.f_code
    return getattr(code, "co_qualname", code.co_name)


def collective_of(frame: FrameType | None) -> tuple[FrameType, str, str] | None:
    """(the innermost torch.distributed frame, its operation, the tokenmill caller) of a
    stack, or None when the stack is not inside torch.distributed."""
    inner: FrameType | None = None
    name = caller = ""
    while frame is not None:
        filename = frame.f_code.co_filename
        marked = _PEER_WAITS.get(frame.f_code)
        if marked is not None:
            inner, name = inner or frame, name or marked
        elif _TORCH_DISTRIBUTED in filename:
            if inner is None:
                inner = frame
            if not name and frame.f_code.co_name not in _WRAPPERS:
                module = filename.rsplit(_TORCH_DISTRIBUTED, 1)[1].removesuffix(".py").replace(os.sep, ".")
                name = f"{_qualified(frame)} (torch.distributed.{module})"
        elif inner is not None and _TOKENMILL in filename:
            caller = _qualified(frame)
            break
        frame = frame.f_back
    if inner is None:
        return None
    return inner, name or _qualified(inner), caller


class CollectiveError(TokenmillError):
    """A collective failed because a peer did; the message names the rank and the operation."""

    exit_status = PEER_FAILED_EXIT


def collective_failure(error: BaseException, rank: int) -> CollectiveError | None:
    """The error raised inside a torch.distributed call as one line naming the rank and the
    operation; None for an error raised elsewhere."""
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    found = collective_of(tb.tb_frame)
    if found is None:
        return None
    _, name, caller = found
    text = str(error).strip()
    first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]) if text else type(error).__name__
    where = f" in {caller}" if caller else ""
    return CollectiveError(f"rank {rank}: collective {name}{where} failed: {first}")


class CollectiveWatchdog:
    """Watch the thread that created it; ``stop()`` ends the watch."""

    def __init__(self, timeout_s: float, rank: int, poll_s: float = POLL_SECONDS) -> None:
        self.timeout_s = timeout_s
        self.rank = rank
        self.poll_s = poll_s
        self._target = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenmill-collective-watchdog", daemon=True)

    def start(self) -> CollectiveWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        waiting: FrameType | None = None
        lasti, since = -1, 0.0
        while not self._stop.wait(self.poll_s):
            found = collective_of(sys._current_frames().get(self._target))
            if found is None:
                waiting = None
                continue
            frame, name, caller = found
            # The same frame object at the same instruction: still the same call, waiting.
            if frame is not waiting or frame.f_lasti != lasti:
                waiting, lasti, since = frame, frame.f_lasti, time.monotonic()
                continue
            waited = time.monotonic() - since
            if waited >= self.timeout_s:
                where = f" in {caller}" if caller else ""
                log.error(
                    "rank %d: collective %s%s waited %.0f s for the other ranks (parallel.collective_timeout = %g s); "
                    "another rank is stopped, hung or gone",
                    self.rank,
                    name,
                    where,
                    waited,
                    self.timeout_s,
                )
                os._exit(HANG_EXIT)  # the main thread is blocked inside the collective: end here
            del found
        waiting = None
