"""Resume inside a stage: per-partition completion records in the stage's work directory.

A stage writes its output into `.NAME.partial-<key>/` beside `--output`, where `<key>` is a hash
of the stage's name, config, library versions, inputs (each file's path, size and mtime) and
number of partitions. A worker that finishes a partition writes its output parts first, then
`.tasks/task-NNNNN.json` (atomically) with the partition's counts, so a record that exists
names a partition whose every part is complete. A rerun of the same stage on the same inputs
finds the directory, skips the recorded partitions, adds their counts, and runs only the rest;
a changed config or input gives another key, and the old directory is removed. Part files are
named by partition and batch, so a partition that runs again (after a crash, or on a second
worker after its first one died) overwrites its own parts instead of adding to them. The
directory is renamed into place only when every partition has a record (`stage.run_tasks`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from tokenmill.infra.atomic import atomic_write_text

log = logging.getLogger(__name__)

TASKS_DIR = ".tasks"


def _input_files(inputs: list[str]) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every file under the inputs: a changed input changes the key."""
    found: list[tuple[str, int, int]] = []
    for name in inputs:
        path = Path(name)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            try:
                stat = file.stat()
            except OSError:
                continue  # not a local file (a URL, or gone): its name alone is in the key
            found.append((str(file), stat.st_size, stat.st_mtime_ns))
    return found


def stage_key(
    stage_name: str, config: dict[str, Any], inputs: list[str], versions: dict[str, str], n_tasks: int
) -> str:
    """A hash of everything that decides a stage's output, naming its work directory."""
    identity = {
        "stage": stage_name,
        "config": config,
        "inputs": inputs,
        "files": _input_files(inputs),
        "versions": versions,
        "tasks": n_tasks,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def partial_dir(output: Path, key: str) -> Path:
    """The work directory of `output` for a stage run with this key; work directories of other
    keys (an older config or input) are removed, so a changed stage starts over."""
    prefix = f".{output.name}.partial-"
    target = output.with_name(prefix + key)
    for other in output.parent.glob(prefix + "*"):
        if other != target and other.is_dir():
            log.info("%s: removing the partial output of another config or input: %s", output.name, other.name)
            shutil.rmtree(other, ignore_errors=True)
    return target


def record_path(work_dir: str | Path, task_index: int) -> Path:
    return Path(work_dir) / TASKS_DIR / f"task-{task_index:05d}.json"


def record_done(work_dir: str | Path, task_index: int, counts: dict[str, Any]) -> None:
    """Worker side: mark a partition finished, after all its parts are written."""
    path = record_path(work_dir, task_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(counts, default=int) + "\n")


def finished_tasks(work_dir: Path, n_tasks: int) -> dict[int, dict[str, Any]]:
    """Counts of the partitions a previous run of this stage finished, by task index."""
    done: dict[int, dict[str, Any]] = {}
    for index in range(n_tasks):
        path = record_path(work_dir, index)
        try:
            counts = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # absent, or torn by a crash of another writer: run the partition again
        counts["rejected"] = Counter(counts.get("rejected", {}))
        counts["stats"] = Counter(counts.get("stats", {}))
        done[index] = counts
    return done


def remove_records(work_dir: Path) -> None:
    """Drop the records before publication: the published stage holds only its documents."""
    shutil.rmtree(work_dir / TASKS_DIR, ignore_errors=True)
