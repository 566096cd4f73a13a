"""Resume inside a stage: per-partition completion records in the stage's work directory.

A stage writes its output into `.NAME.partial-<key>/` beside `--output`, where `<key>` is a hash
of the stage's name, config, library versions, inputs (each file's path, size and mtime) and
number of partitions. A worker that finishes a partition writes its output parts first, then
`.tasks/task-NNNNN.json` (atomically) with the partition's counts, so a record that exists
names a partition whose every part is complete. A rerun of the same stage on the same inputs
finds the directory, skips the recorded partitions (`tokenmill.infra.records`), adds their counts, and runs only the rest;
a changed config or input gives another key, and the old directory is removed. Part files are
named by partition and batch, so a partition that runs again (after a crash, or on a second
worker after its first one died) overwrites its own parts instead of adding to them. The
directory is renamed into place only when every partition has a record (`stage.run_tasks`).

On object storage the same holds with prefixes: `.NAME.partial-<key>/` beside the output URL,
a record is one object written by a single PUT after the partition's parts (an object is either
whole or absent, so no rename is needed), and publication copies the parts into place with the
manifest last (`storage.publish_prefix`). Inputs on object storage enter the key by size and
version (ETag), as local files do by size and mtime.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tokenmill.infra import records, storage

TASKS_DIR = ".tasks"


def stage_key(
    stage_name: str, config: dict[str, Any], inputs: list[str], versions: dict[str, str], n_tasks: int
) -> str:
    """A hash of everything that decides a stage's output, naming its work directory."""
    identity = {
        "stage": stage_name,
        "config": config,
        "inputs": inputs,
        "files": records.identity(inputs),
        "versions": versions,
        "tasks": n_tasks,
    }
    return records.digest(identity)


def partial_dir(output: str | Path, key: str) -> str:
    """The work directory (a local path, or a URL prefix) of `output` for a stage run with this
    key; work directories of other keys (an older config or input) are removed, so a changed
    stage starts over."""
    target = storage.join(storage.parent(output), storage.work_prefix(output) + key)
    storage.remove_stale_temporaries(output, keep=target)
    return target


def record_path(work_dir: str | Path, task_index: int) -> str:
    return storage.join(work_dir, TASKS_DIR, f"task-{task_index:05d}.json")


def record_done(work_dir: str | Path, task_index: int, counts: dict[str, Any]) -> None:
    """Worker side: mark a partition finished, after all its parts are written."""
    records.write_record(record_path(work_dir, task_index), counts, default=int)


def finished_tasks(work_dir: str | Path, n_tasks: int) -> dict[int, dict[str, Any]]:
    """Counts of the partitions a previous run of this stage finished, by task index (a record
    torn by a crash of another writer, or gone, leaves its partition to run again)."""
    done: dict[int, dict[str, Any]] = {}
    recorded = {storage.basename(url) for url, _ in storage.list_files(storage.join(work_dir, TASKS_DIR))}
    for index in range(n_tasks):
        path = record_path(work_dir, index)
        if storage.basename(path) not in recorded:
            continue
        counts = records.read_record(path)
        if counts is None:
            continue
        counts["rejected"] = Counter(counts.get("rejected", {}))
        counts["stats"] = Counter(counts.get("stats", {}))
        done[index] = counts
    return done


def remove_records(work_dir: str | Path) -> None:
    """Drop the records before publication: the published stage holds only its documents."""
    storage.remove(storage.join(work_dir, TASKS_DIR))
