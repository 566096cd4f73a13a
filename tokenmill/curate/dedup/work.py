"""The work directory of a dedup run: one checkpoint per phase, so a crash redoes only the
phase (or, for per-file phases, only the files) that had not finished.

Layout: `config.json` (fingerprint of the config and inputs; a different fingerprint starts
afresh), one sub-directory per phase, and `<phase>.done` markers written after the phase's
last file. Every Parquet file is written to a temporary name and renamed, so a file that
exists is complete.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.infra import records
from tokenmill.infra.atomic import atomic_path
from tokenmill.infra.cluster import collect


def write_parquet_atomic(frame: pd.DataFrame | pa.Table, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def partition_file(directory: str | Path, partition_info: dict[str, Any] | None, stem: str = "part") -> Path:
    """The file of one partition of a Dask dataframe, named by the partition's number: a task
    that runs again (its worker died after writing) replaces its file instead of adding one."""
    if partition_info is None:
        raise RuntimeError("partition_info missing: write partitions through map_partitions")
    return Path(directory) / f"{stem}-{partition_info['number']:05d}.parquet"


def parquet_files(directory: str | Path) -> list[str]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(str(p) for p in directory.rglob("*.parquet") if not p.name.startswith("."))


class WorkDir:
    """The checkpoints of one dedup run, kept under the key of its config and inputs (the
    completion records of `tokenmill.infra.records`: `config.json` with the key, one
    `<phase>.done` per finished phase)."""

    def __init__(self, path: str | Path, fingerprint: dict[str, Any]):
        self.path = Path(path).resolve()
        digest = records.digest(fingerprint, length=None)
        config_file = self.path / "config.json"
        if config_file.exists() and records.read_record(config_file, key=digest, field="digest") is None:
            # Checkpoints of another config or other inputs must not be reused.
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        if not config_file.exists():
            records.write_record(config_file, {"digest": digest, "fingerprint": fingerprint}, indent=2)
        self.resumed: list[str] = []

    def dir(self, phase: str) -> Path:
        return self.path / phase

    def done(self, phase: str) -> bool:
        return records.read_record(self.path / f"{phase}.done") is not None

    def mark_done(self, phase: str, info: dict[str, Any] | None = None) -> None:
        records.write_record(self.path / f"{phase}.done", info or {})

    def info(self, phase: str) -> dict[str, Any]:
        return records.read_record(self.path / f"{phase}.done") or {}

    def phase(self, phase: str, run: Callable[[Path], dict[str, Any] | None]) -> dict[str, Any]:
        """Run `run(directory)` unless the phase finished before; return its info."""
        if self.done(phase):
            self.resumed.append(phase)
            return self.info(phase)
        directory = self.dir(phase)
        if directory.exists() and phase not in PER_FILE_PHASES:
            shutil.rmtree(directory)  # a half-written whole-dataset phase restarts from scratch
        directory.mkdir(parents=True, exist_ok=True)
        info = run(directory) or {}
        self.mark_done(phase, info)
        return info

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# Phases that keep their own partial progress on resume: per-file phases keep the finished
# files; components keeps its last finished iteration.
PER_FILE_PHASES = {"signatures", "hashes", "components"}


def compute_with_progress(client, collection, desc: str, progress: bool) -> list:
    """Compute a Dask collection's partitions with one progress tick per partition."""
    from distributed import futures_of

    persisted = client.persist(collection)
    futures = futures_of(persisted)
    collect(futures, desc=desc, unit="part", progress=progress)
    return client.gather(futures)


def write_partitions(client, frame, directory: Path, desc: str, progress: bool) -> int:
    """Write each partition of a Dask dataframe as its own Parquet file; returns the row count."""
    target = str(directory)

    def _write(df: pd.DataFrame, partition_info: dict[str, Any] | None = None) -> pd.DataFrame:
        write_parquet_atomic(df.reset_index(drop=True), partition_file(target, partition_info))
        return pd.DataFrame({"rows": [len(df)]})

    written = frame.map_partitions(_write, meta={"rows": "int64"}, enforce_metadata=False)
    results = compute_with_progress(client, written, desc, progress)
    return int(sum(int(r["rows"].sum()) for r in results))
