"""Atomic publication: a reader sees the old file (or directory) or the new one, never half of
one. Files are written to a temporary sibling and `os.replace`d over the target; directories
are built in a temporary sibling and swapped in. A killed writer leaves at most a hidden
``.NAME.tmp-*`` sibling, which `remove_leftovers` (or the next publication) cleans."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def temp_sibling(path: str | Path, shared: bool = False) -> Path:
    """A fresh hidden name beside ``path``: ``.NAME.tmp-<pid>-<random>``; with ``shared``,
    ``.NAME.tmp``, the same in every process, for a directory that several ranks write into
    together (the caller clears it first, as a leftover)."""
    path = Path(path)
    if shared:
        return path.with_name(f".{path.name}.tmp")
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove_leftovers(path: str | Path) -> None:
    """Remove the temporary siblings a killed writer of ``path`` left behind."""
    path = Path(path)
    for leftover in path.parent.glob(f".{path.name}.tmp*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def remove_leftovers_in(directory: str | Path) -> None:
    """Remove the temporary files that killed writers left anywhere in ``directory`` (its own
    entries only), whatever their targets."""
    for leftover in Path(directory).glob(".*.tmp-*"):
        if leftover.is_file():
            leftover.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write a file to; on a clean exit it replaces
    ``path`` in one step, on an error it is removed."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8", durable: bool = False) -> Path:
    """Write ``text`` to ``path`` in one step; with ``durable`` the bytes reach the disk before
    the rename and the rename itself is synced (what a checkpoint pointer needs to survive a
    power loss, not only a killed process)."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding=encoding) as handle:
        handle.write(text)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    if durable:
        fsync_dir(path.parent)
    return path


def fsync_dir(path: str | Path) -> None:
    """Sync a directory's entries (a rename into it) to disk; a no-op where that is not possible."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_dir(tmp_dir: str | Path, target: str | Path) -> None:
    """Swap the finished directory ``tmp_dir`` in as ``target``: the old target, if any, is
    moved aside and removed after the new one is in place."""
    tmp_dir, target = Path(tmp_dir), Path(target)
    old = None
    if target.exists():
        old = temp_sibling(target)
        target.rename(old)
    tmp_dir.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on a clean exit it becomes
    ``target`` (replacing an old one), on an error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_json(path: str | Path) -> Any | None:
    """The JSON a file holds, or None when it is missing or not valid JSON (a state or
    metadata file that a reader treats as absent: written by a killed older writer, or
    by hand)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
