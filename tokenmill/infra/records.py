"""Completion records: what a piece of work writes last to say that its output is complete, and
how a rerun checks it.

A record is one small JSON object, written in one atomic step (a local rename, or a single PUT
on object storage) after the output it speaks for, so a record that exists names a complete
output; one torn by a crash of an older writer, or written by hand, reads as absent. A record
that says which work it finished carries that work's key: a `digest` of everything that
decides the output, input files by their `identity` (path, size, version). A rerun trusts a
record only when its key is the one it would write itself (`read_record(..., key=...)`).

The same records serve

- a curate stage's partitions (`curate/resume.py`: `.tasks/task-NNNNN.json` with the counts;
  the key is in the name of the stage's partial directory),
- dedup's phases (`curate/dedup/work.py`: `config.json` with the key, `<phase>.done`),
- a recipe's steps (`pipelines/step_graph.py`: `.state/<step>.json` with the step's fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from tokenmill.infra import storage


def digest(obj: Any, length: int | None = 16) -> str:
    """A hex SHA-256 of `obj` as canonical JSON (sorted keys), cut to `length` characters."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def identity(paths: Iterable[str | os.PathLike]) -> list[list[Any]]:
    """`storage.fingerprints` of every file under each path, as a key holds them: a changed
    input changes the key. A path that is missing or cannot be read here (gone, no access)
    enters by its name alone."""
    found: list[list[Any]] = []
    for path in paths:
        try:
            files = storage.fingerprints(path)
        except Exception:
            files = []
        found += [list(item) for item in files] or [[str(path), None, None]]
    return found


def write_record(
    path: str | os.PathLike,
    record: dict[str, Any],
    *,
    indent: int | None = None,
    default: Callable[[Any], Any] = str,
) -> None:
    """Write a record, after the output it speaks for, in one atomic step (a URL in it without its
    credentials: records are kept beside the output)."""
    storage.write_text(path, storage.redact(json.dumps(record, indent=indent, default=default)) + "\n")


def read_record(path: str | os.PathLike, *, key: str | None = None, field: str = "key") -> dict[str, Any] | None:
    """The record at `path`, or None when it is missing, torn or not an object, or (with `key`)
    when its `field` is not `key`: a record of other work."""
    if not storage.exists(path):
        return None
    try:
        record = json.loads(storage.read_text(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    if key is not None and record.get(field) != key:
        return None
    return record
