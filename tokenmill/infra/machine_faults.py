"""Faults of the machines a command runs on, said in one line: a full disk and a lost Dask
scheduler.

A command that writes through Dask runs its work inside `reported_faults`, naming what runs, the
output it writes and (asked after the failure) what it keeps for a rerun. The errors arrive in
many shapes: an `OSError` with errno ENOSPC, pyarrow's `OSError` carrying only the C library's
message, a worker's error re-raised in the client, a future cancelled because the client lost
its scheduler, a closed comm. The CLI maps any other full disk to one line too
(`disk_full_error`), so no command prints a traceback for either fault.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from tokenmill.errors import DiskFullError, SchedulerLostError, TokenmillError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# pyarrow's writers (and errors re-raised from a Dask worker) keep the message but not the errno.
DISK_FULL_MESSAGES = tuple(os.strerror(code) for code in DISK_FULL_ERRNOS)
# What a client sees when its scheduler is gone: futures cancelled on the lost connection, a
# closed comm, a connection refused or timed out while it tries to reconnect.
SCHEDULER_LOST_REASON = "scheduler-connection-lost"


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(error: BaseException, where: str | os.PathLike | None = None) -> bool:
    """Whether `error` (or one it was raised from) is a full disk or an exceeded quota. With
    `where`, the directory being written, a write error also counts when that file system has
    (almost) no space left: some writers lose the errno on the way (torch's zip writer says
    only "unexpected pos")."""
    for item in _chain(error):
        if isinstance(item, OSError) and item.errno in DISK_FULL_ERRNOS:
            return True
        if any(message in str(item) for message in DISK_FULL_MESSAGES):
            return True
    return where is not None and not isinstance(error, KeyboardInterrupt) and space_left(where) < NEARLY_FULL_BYTES


# A file system with less space than this left after a failed write has run out of it.
NEARLY_FULL_BYTES = 1 << 20


def space_left(where: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on the file system of `where` (or of its
    nearest existing parent); a very large number where this cannot be known."""
    path = os.path.abspath(where)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return 1 << 62
    return stats.f_bavail * stats.f_frsize


def disk_full_error(
    error: BaseException, what: str, target: str | None = None, kept: str | None = None
) -> DiskFullError:
    """One line for a full disk met by `what`; names the file being written when no `target`
    is given and the error knows it."""
    if target is None:
        target = next((item.filename for item in _chain(error) if isinstance(item, OSError) and item.filename), None)
    return DiskFullError(what, str(target) if target is not None else None, kept)


def scheduler_reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something still listens at a tcp:// or tls:// scheduler address (True for an
    address of another kind, which cannot be probed this way)."""
    parts = urlsplit(address)
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or not parts.port:
        return True
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def is_scheduler_lost(error: BaseException, address: str | None) -> bool:
    """Whether `error` is the client's view of its scheduler going away: a future cancelled on
    the lost connection, or a connection error while nothing listens at `address` any more."""
    import asyncio
    import concurrent.futures

    from distributed.comm.core import CommClosedError

    connection_errors = (
        asyncio.CancelledError,
        concurrent.futures.CancelledError,
        CommClosedError,
        ConnectionError,
        TimeoutError,
        OSError,
    )
    for item in _chain(error):
        if getattr(item, "reason", None) == SCHEDULER_LOST_REASON:
            return True
        if isinstance(item, connection_errors) and not is_disk_full(item):
            return address is not None and _stops_answering(address)
    return False


def _stops_answering(address: str, probes: int = 3, interval_s: float = 0.5) -> bool:
    """Whether the scheduler at `address` stops listening within a few probes: a killed
    scheduler's socket can outlive the connection the client saw close, on a loaded host."""
    for probe in range(probes):
        if probe:
            time.sleep(interval_s)
        if not scheduler_reachable(address):
            return True
    return False


def as_user_error(
    error: BaseException, what: str, target: str | None, kept: Callable[[], str | None], address: str | None
) -> TokenmillError | None:
    """The one-line error for a full disk or a lost scheduler (at `address`, when connected)
    met by `what` writing `target`, with what it keeps for a rerun (`kept()`, asked now);
    None for any other error."""
    if isinstance(error, TokenmillError | KeyboardInterrupt | SystemExit):
        return None
    if is_disk_full(error):
        return disk_full_error(error, what, target, kept())
    if address is not None and is_scheduler_lost(error, address):
        return SchedulerLostError(what, address, kept())
    return None


@contextmanager
def reported_faults(
    what: str | Callable[[], str],
    target: str | None,
    kept: Callable[[], str | None],
    address: Callable[[], str | None] = lambda: None,
) -> Iterator[None]:
    """Run a command's work; a full disk or a lost scheduler ends it with one line
    (`as_user_error`). `address()` gives the scheduler's address once connected; `what` may be
    a function, for work that goes through phases."""
    try:
        yield
    except BaseException as error:
        fault = as_user_error(error, what() if callable(what) else what, target, kept, address())
        if fault is None:
            raise
        raise fault from error


def partitions_kept(done: int, total: int, directory: str | os.PathLike | None) -> str:
    """What a partitioned run keeps for a rerun, in words."""
    if not done or directory is None:
        return "its one partition had not finished" if total == 1 else f"none of {total} partitions had finished"
    return f"{done} of {total} partitions are kept in {directory}"
