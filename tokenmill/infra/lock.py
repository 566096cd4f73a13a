"""One writer at a time: an exclusive, non-blocking ``fcntl.flock`` on a file whose content is
the holder's pid. The kernel releases an flock when its holder ends, however it ends, so a
killed writer never leaves a stale lock behind (its file stays, and the next writer takes it);
the pid is only there for the message the next writer prints. A holder that ends normally
removes the file.

Used for a training run directory (``RUN/.lock``), a recipe's work directory
(``WORKDIR/.state/lock``) and every other output (``.NAME.lock`` beside it,
`tokenmill.infra.outputs`); each caller says in its own words who holds the lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tokenmill.errors import TokenmillError

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock rather than no run
    fcntl = None  # type: ignore[assignment]


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (a pid that is not a number: no)."""
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # exists, owned by someone else (a reused pid): treat as alive
        return True
    return True


def holder_pid(path: Path) -> str:
    """The pid written in a lock file, or "unknown" (none yet, or unreadable)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def _names(path: Path, fd: int) -> bool:
    """Whether `path` is still the file open as `fd`."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False


class PidLock:
    """An exclusive, non-blocking flock on ``path`` (its folder is created). When another
    process holds it, ``in_use(holder_pid)`` is raised; it says which lock this is."""

    def __init__(self, path: str | Path, in_use: Callable[[str], TokenmillError]) -> None:
        self.path = Path(path)
        self.in_use = in_use
        self._fd: int | None = None

    def acquire(self) -> PidLock:
        if fcntl is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            # Opened without truncating: the holder's pid must survive a loser's attempt.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self.in_use(holder_pid(self.path)) from None
            if _names(self.path, fd):
                break
            # The file was removed by a holder that released it meanwhile: lock the new one.
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            # Removed while still held, so that no file is left beside an output; a process
            # that opened it meanwhile finds, once it has the flock, that the path no longer
            # names its file, and starts again (`acquire`).
            self.path.unlink(missing_ok=True)
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None

    def check_free(self) -> None:
        """Raise ``in_use`` if a process holds the lock; create and hold nothing."""
        if fcntl is None or not self.path.is_file():
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self.in_use(holder_pid(self.path)) from None
        finally:
            os.close(fd)

    def __enter__(self) -> PidLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
