"""Checkpoint directories without torch: finding a run's checkpoints, reading and verifying a
checkpoint's ``meta.json``, and a run directory's copy on object storage (`RemoteRun`).

The launcher of a multi-rank run and the recipe runner check and resume runs with these alone,
so they never load torch; writing and loading the tensors is checkpoint.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.train.stop import STOP_FILE

META = "meta.json"
LATEST = "latest"
FORMAT_VERSION = 1

log = logging.getLogger(__name__)


class CheckpointError(TokenmillError):
    """A checkpoint is missing, incomplete or corrupted."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RemoteRun:
    """A run directory on object storage, written through its local copy in the cache
    (`TrainConfig.run_dir`). The URL holds the same layout as a local run directory.

    Uploads follow the rule of local publication, with upload order in place of renames: a
    checkpoint's shard files, the run's other files (metrics.jsonl, config.yaml, tensorboard),
    the checkpoint's ``meta.json``, and ``checkpoints/latest`` last. A reader (a resumed run on
    another machine) that follows ``latest`` finds a complete checkpoint; one killed mid-upload
    leaves the previous ``latest`` in place. Pruning to ``keep_last`` happens after ``latest``
    moved on, so the checkpoint it names is never the one removed."""

    def __init__(self, url: str, local: Path | None = None) -> None:
        self.mirror = storage.Mirror(url, "runs", local)  # local: a copy kept elsewhere than the cache
        self.local = self.mirror.local

    def _checkpoints(self) -> dict[str, bool]:
        """The checkpoint directories on the remote side: name -> complete (has its meta.json)."""
        found: dict[str, bool] = {}
        for name in self.mirror.files("checkpoints"):
            parts = name.split("/")
            if len(parts) == 3 and parts[1].startswith("step_"):
                found[parts[1]] = found.get(parts[1], False) or parts[2] == META
        return found

    def pull(self) -> Path | None:
        """Download the checkpoint the remote ``latest`` names (files that are already in the
        cache unchanged are kept) and the run's metrics; point the local ``latest`` at it and
        return its local path, or None when the URL holds no checkpoint yet."""
        root = self.local / "checkpoints"
        pointer = self.mirror.read(f"checkpoints/{LATEST}")
        name = pointer.decode().strip() if pointer is not None else ""
        if not name or not self._checkpoints().get(name):
            (root / LATEST).unlink(missing_ok=True)
            return None
        files = [f for f in self.mirror.files(f"checkpoints/{name}") if f.rsplit("/", 1)[-1] != META]
        self.mirror.pull([*files, f"checkpoints/{name}/{META}"])
        if "metrics.jsonl" not in self.mirror.pull(["metrics.jsonl"]):
            (self.local / "metrics.jsonl").unlink(missing_ok=True)
        atomic_write_text(root / LATEST, name + "\n", durable=True)
        log.debug("pulled %s/checkpoints/%s", self.mirror.url, name)  # the trainer says it resumes from it
        return root / name

    def push(self, final: Path) -> None:
        """Upload the checkpoint ``final`` (published locally), then move the remote ``latest``."""
        run = self.local
        shards = sorted(p.relative_to(run).as_posix() for p in final.iterdir() if p.is_file() and p.name != META)
        others = sorted(
            p.relative_to(run).as_posix()
            for p in run.rglob("*")
            if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(run).parts)
            and p.relative_to(run).parts[0] not in ("checkpoints", STOP_FILE)  # a stop request is local
        )
        meta = f"checkpoints/{final.name}/{META}"
        self.mirror.remove(meta)  # a step saved again: its old files stop counting as a checkpoint first
        self.mirror.push([*shards, *others], last=[meta])
        # Named here, not copied from the local pointer, which a trainer running on may have moved.
        storage.write_text(f"{self.mirror.url}/checkpoints/{LATEST}", final.name + "\n")
        # Older checkpoints the run no longer keeps, and the parts of one whose upload was cut
        # short. The trainer may have moved on meanwhile (a background upload), so only what is
        # older than this checkpoint goes: never the one `latest` now names.
        kept = {p.name for p in list_checkpoints(run)}
        for name in sorted(self._checkpoints()):
            if name not in kept and (step_of(Path(name)) or 0) < (step_of(final) or 0):
                self.mirror.remove(f"checkpoints/{name}/")
        log.info("uploaded checkpoint %s to %s", final.name, self.mirror.url)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (with meta.json) of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith("step_") and (path / META).is_file():
            try:
                found.append((int(path.name[5:]), path))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir, a run dir (its ``latest``), or a ``checkpoints/`` dir -> checkpoint dir."""
    path = Path(path)
    if (path / ".metadata").exists() or (path / META).exists():
        return path
    for root in (path / "checkpoints", path):
        latest = root / LATEST
        if latest.is_file():
            target = root / latest.read_text().strip()
            if not target.is_dir():
                raise CheckpointError(f"{latest} points to {target}, which does not exist")
            return target
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the path does not exist")
    raise CheckpointError(
        f"no checkpoint at {path}: expected a step_<N> directory or a run directory with checkpoints/latest"
    )


def step_of(path: Path) -> int | None:
    try:
        return int(path.name[len("step_") :]) if path.name.startswith("step_") else None
    except ValueError:
        return None


def previous_hint(ckpt: Path) -> str:
    """Name the newest complete checkpoint older than ``ckpt``, the way out of a bad one."""
    step = step_of(ckpt)
    if step is None:
        return ""
    older = [p for p in list_checkpoints(ckpt.parent.parent) if (step_of(p) or 0) < step]
    if older:
        return f"; the previous checkpoint {older[-1]} is still usable (resume with --resume {older[-1]})"
    return ""


def read_meta(ckpt: str | Path, verify: bool = True) -> dict[str, Any]:
    """meta.json of a checkpoint; with ``verify``, check every file's size and sha256."""
    ckpt = Path(ckpt)
    meta_path = ckpt / META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {META} is missing{previous_hint(ckpt)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupted: {META} is not valid JSON ({error}){previous_hint(ckpt)}"
        ) from None
    if verify:
        for name, expected in meta.get("files", {}).items():
            path = ckpt / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint {ckpt} is incomplete: {name} is missing{previous_hint(ckpt)}")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointError(
                    f"checkpoint {ckpt} is truncated or corrupted: {name} has {size} bytes, "
                    f"expected {expected['bytes']}{previous_hint(ckpt)}"
                )
            if file_sha256(path) != expected["sha256"]:
                raise CheckpointError(
                    f"checkpoint {ckpt} is corrupted: {name} fails its sha256 check{previous_hint(ckpt)}"
                )
    return meta
