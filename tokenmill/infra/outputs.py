"""What a command may write over, and one writer at a time: `claim_output`.

A command replaces its own earlier output (that is how a rerun or `--force` works), and
nothing else. Before any work starts, `claim_output` refuses, in one line:

- an output that exists and is not an earlier output of the same kind of command (a stage
  directory with its manifest, a shard prefix with its `.json`, a run directory, ...): a
  user's folder or file is never replaced or turned into something else;
- an output that cannot be written: a file where a directory goes, a directory where a file
  goes, a folder above it that is a file;
- an output equal to one of the inputs, inside one, or holding one.

It then holds the output's lock for the whole command, so that a second writer of the same
output is refused, in one line naming the holder, rather than publishing over the first:

- on local disk an flock on ``.NAME.lock`` beside the output (`lock.PidLock`): the kernel
  drops it when the holder ends, however it ends;
- on object storage, which has no lock, the object ``.NAME.lock`` beside the output, created
  with a conditional write (``If-None-Match: *``: of two writers exactly one creates it),
  holding the holder's host, pid and start time, and removed when the command ends. One left
  by a killed writer on the same host is taken over once that pid has ended; from another
  host it is named in the refusal, with the command that removes it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.lock import PidLock, pid_alive

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputKind:
    """What one kind of output looks like.

    `layout`: "directory" (a stage directory, an index, a run), "file" (a tokenizer, a model
    file) or "prefix" (``PREFIX`` + each of `suffixes`). `markers` name the files whose
    presence says the output was written by this kind of command (any one is enough): names
    inside a directory ("manifest.json"), or siblings of a file or prefix, formatted with the
    output's `name` and `stem` ("{name}.meta.json", "{stem}.json"). `noun` is what the
    refusal calls it ("a stage directory")."""

    noun: str
    markers: tuple[str, ...]
    layout: str = "directory"
    suffixes: tuple[str, ...] = ()
    # What else marks an earlier output of this kind that no marker beside it shows (a shard
    # bound for object storage keeps its unfinished parts in a local working copy).
    leftover: Callable[[storage.Location], bool] | None = None

    def exists(self, target: storage.Location) -> bool:
        if self.layout == "prefix":
            return any(storage.exists(f"{target}{suffix}") for suffix in self.suffixes)
        return storage.exists(target)

    def is_own(self, target: storage.Location) -> bool:
        """Whether what is there is an earlier output of this kind, or an empty directory."""
        if storage.isdir(target) != (self.layout == "directory") and self.layout != "prefix":
            return False
        if any(storage.exists(path) for path in self.marker_paths(target)):
            return True
        if self.leftover is not None and self.leftover(target):
            return True
        return self.layout == "directory" and _empty(target)

    def marker_paths(self, target: storage.Location) -> list[str]:
        if self.layout == "directory":
            return [target.join(name).path for name in self.markers]
        parent = storage.parent(target.native())
        stem = Path(target.name).stem
        return [storage.join(parent, name.format(name=target.name, stem=stem)) for name in self.markers]


def _empty(directory: storage.Location) -> bool:
    if directory.is_local:
        return not any(directory.local_path.iterdir())
    return not storage.glob(directory.native(), "*")


def _inside(path: str, other: str) -> bool:
    """Whether `path` is `other` or below it (both absolute, same spelling)."""
    return path == other or path.startswith(other.rstrip("/") + "/")


def _resolved(path: str | os.PathLike) -> str:
    location = storage.Location(path).absolute()
    return str(location.local_path.resolve()) if location.is_local else str(location).rstrip("/")


def check_output(
    output: str | os.PathLike, kind: OutputKind, *, flag: str, inputs: Sequence[Any] = ()
) -> storage.Location:
    """Refuse, in one line naming `flag`, an output this command must not write (see the module
    docstring); returns its absolute location. Creates nothing."""
    target = storage.Location(output).absolute()
    here = _resolved(target)
    for given in inputs:
        source = _resolved(given)
        if _inside(here, source) or _inside(source, here):
            relation = "is" if here == source else ("is inside" if _inside(here, source) else "holds")
            raise TokenmillError(f"{flag} {output} {relation} the input {given}; write the output somewhere else")
    if target.is_local:
        _check_local_parents(target.local_path, flag, output)
    if kind.exists(target) and not kind.is_own(target):
        raise TokenmillError(f"{flag} {output} {_why_not_own(target, kind)}; choose another {flag} or remove it")
    return target


def _check_local_parents(path: Path, flag: str, output: Any) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise TokenmillError(f"{flag} {output} cannot be written: {parent} is a file")
            return


def _why_not_own(target: storage.Location, kind: OutputKind) -> str:
    if kind.layout == "directory" and not storage.isdir(target):
        return f"is a file, not {kind.noun}"
    if kind.layout != "directory" and storage.isdir(target):
        return f"is a directory, not {kind.noun}"
    marker = storage.basename(kind.marker_paths(target)[0])
    if kind.layout == "directory":
        return f"exists and is not {kind.noun} (it has no {marker})"
    return f"exists and is not {kind.noun} (there is no {marker} beside it)"


def lock_name(target: storage.Location) -> str:
    """The lock of an output: ``.NAME.lock`` beside it."""
    return storage.join(storage.parent(target.native()), f".{target.name}.lock")


def _in_use(flag: str, output: Any, holder: str) -> TokenmillError:
    return TokenmillError(
        f"another tokenmill process ({holder}) is writing {flag} {output}; wait for it or choose another {flag}"
    )


@contextmanager
def output_lock(target: storage.Location, *, flag: str, output: Any) -> Iterator[None]:
    """Hold the lock of `target` (see the module docstring) for the body."""
    path = lock_name(target)

    def in_use(holder: str) -> TokenmillError:
        return TokenmillError(
            f"another tokenmill process ({holder}) is writing {flag} {output}; wait for it or choose another {flag}"
        )

    lock = PidLock(path, lambda pid: in_use(f"pid {pid}")) if target.is_local else RemoteLock(path, in_use)
    with lock:
        yield


class RemoteLock:
    """A lock object on object storage: created only if absent (a conditional PUT), holding its
    holder's host, pid and start time; removed by `release`. One left by a process of this
    host that has ended is taken over; any other holder is named by ``in_use(holder)``,
    followed by the object to delete if that holder is gone."""

    def __init__(self, url: str, in_use: Callable[[str], TokenmillError]) -> None:
        self.url = url
        self.in_use = in_use
        self._held = False

    def acquire(self) -> RemoteLock:
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        other: dict[str, Any] = {}
        for _ in range(2):
            if storage.create_exclusive(self.url, json.dumps(holder).encode()):
                self._held = True
                return self
            try:
                other = json.loads(storage.read_bytes(self.url))
            except (TokenmillError, ValueError):  # removed meanwhile, or not the JSON of a holder
                other = {}
            if other.get("host") != holder["host"] or pid_alive(other.get("pid")):
                break
            # Left by a process of this machine that no longer exists (killed): safe to take.
            log.warning(f"removing {self.url}, left by pid {other.get('pid')}, which has ended")
            storage.remove(self.url)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(other.get("started", 0)))
        error = self.in_use(f"host {other.get('host', '?')}, pid {other.get('pid', '?')}, since {since}")
        raise type(error)(f"{error} (if that process is gone, delete {self.url})")

    def release(self) -> None:
        if self._held:
            storage.remove(self.url)
            self._held = False

    def __enter__(self) -> RemoteLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def claim_output(
    output: str | os.PathLike, kind: OutputKind, *, flag: str, inputs: Sequence[Any] = (), lock: bool = True
) -> Iterator[storage.Location]:
    """Check `output` (`check_output`) and hold its lock (`output_lock`) for the body; yields
    its absolute location."""
    target = check_output(output, kind, flag=flag, inputs=inputs)
    if not lock:
        yield target
        return
    with output_lock(target, flag=flag, output=output):
        yield target
