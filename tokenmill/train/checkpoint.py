"""Checkpoints: ``RUN/checkpoints/step_<N>/`` written with torch.distributed.checkpoint.

Layout of one checkpoint::

    step_<N>/.metadata, __<rank>_<i>.distcp   DCP: model + optimizer, keyed by parameter name,
                                               so a layout saved under one parallelism loads
                                               under another
    step_<N>/meta.json                         model config, train config, tokenizer, step,
                                               consumed_samples, RNG states, and the size +
                                               sha256 of every file (corruption check)
    checkpoints/latest                         the name of the newest complete checkpoint

Writes are atomic: everything goes to ``.step_<N>.tmp/`` and is renamed into place, then
``latest`` is replaced; a crash mid-save leaves the previous checkpoint untouched. With
``AsyncCheckpointer`` the files are written in the background while training goes on, and
published the same way once complete.

A run directory on object storage (``out: s3://...``) is written locally first, into its copy
in the cache (`RemoteRun`); each published checkpoint is then uploaded in the same order: the
shard files, ``meta.json``, then ``latest``. A resumed run downloads what ``latest`` names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tokenmill.errors import DiskFullError, TokenmillError
from tokenmill.infra import faults, storage
from tokenmill.infra.atomic import atomic_write_text, fsync_dir, remove_leftovers, replace_dir, temp_sibling
from tokenmill.train.faults import inject
from tokenmill.train.model import GPT, ModelConfig
from tokenmill.train.stop import STOP_FILE

META = "meta.json"
LATEST = "latest"
FORMAT_VERSION = 1

log = logging.getLogger(__name__)


class CheckpointError(TokenmillError):
    """A checkpoint is missing, incomplete or corrupted."""


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    state = {
        "python": base64.b64encode(_pickle(random.getstate())).decode(),
        "numpy": base64.b64encode(_pickle(np.random.get_state())).decode(),
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_unpickle(base64.b64decode(state["python"])))
    np.random.set_state(_unpickle(base64.b64decode(state["numpy"])))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8))


def _pickle(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj)


def _unpickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)  # noqa: S301 - our own RNG state, written by us


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_table(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != META
    }


def _paths(run_dir: str | Path, step: int) -> tuple[Path, Path, Path]:
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    return root, final, temp_sibling(final, shared=True)  # every rank writes its shards into it


def _prepare(run_dir: str | Path, step: int) -> Path:
    """An empty shared temporary directory for every rank to write into; returns its path."""
    root, final, tmp = _paths(run_dir, step)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final)
    _barrier()
    return tmp


def _publish(run_dir: str | Path, step: int, meta: dict[str, Any], keep_last: int) -> Path:
    """Rank 0, once every rank's files are in the shared temporary directory: meta.json, the rename
    into place, ``latest``, pruning to the last ``keep_last``."""
    root, final, tmp = _paths(run_dir, step)
    meta = dict(meta, step=step, format_version=FORMAT_VERSION, files=_file_table(tmp))
    _write_json(tmp / META, meta)
    replace_dir(tmp, final)  # re-saving the same step (e.g. after a resume) replaces it
    fsync_dir(root)
    atomic_write_text(root / LATEST, final.name + "\n", durable=True)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _publish_and_upload(
    run_dir: str | Path, step: int, meta: dict[str, Any], keep_last: int, remote: RemoteRun | None
) -> None:
    final = _publish(run_dir, step, meta, keep_last)
    if remote is not None:
        remote.push(final)


@contextmanager
def _disk_full_is_an_error(run_dir: str | Path, step: int) -> Iterator[None]:
    """A full disk while a checkpoint is written, as one line naming the checkpoint and the last
    complete one, which a resumed run starts from (the partial one is never published)."""
    try:
        yield
    except BaseException as error:  # DCP wraps a writer's error in its own, a BaseException
        root = _paths(run_dir, step)[0]
        if isinstance(error, TokenmillError | KeyboardInterrupt | SystemExit) or not faults.is_disk_full(
            error, where=root
        ):
            raise
        complete = list_checkpoints(run_dir)
        kept = f"the last complete checkpoint {complete[-1]} is kept" if complete else "no checkpoint had completed"
        raise DiskFullError(f"checkpoint step_{step}", str(root), kept, "free space and rerun with --resume") from error


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    state: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int = 3,
    remote: RemoteRun | None = None,
) -> Path:
    """Save DCP ``state`` + ``meta`` as ``step_<step>`` atomically; prune to the last K; upload
    to ``remote`` (the run's URL), if any."""
    with _disk_full_is_an_error(run_dir, step):
        tmp = _prepare(run_dir, step)
        with warnings.catch_warnings():  # one process without a process group is intended here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=str(tmp))
        _barrier()
        if _rank() == 0:
            _publish_and_upload(run_dir, step, meta, keep_last, remote)
        _barrier()
    return _paths(run_dir, step)[1]


class AsyncCheckpointer:
    """Checkpoints written in the background (DCP ``async_save``), one at a time.

    ``save`` returns once the state is copied (staged) to host memory; the files are written
    by a thread while training goes on, over a process group of their own (gloo), so the
    writer's collectives never interleave with the training's. Rank 0 publishes the step
    directory and ``latest`` only after every rank's files are written: a run killed
    before that resumes from the previous complete checkpoint."""

    def __init__(self, remote: RemoteRun | None = None) -> None:
        self._remote = remote  # where each published checkpoint is uploaded, if anywhere
        self._pending: Future | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenmill-checkpoint")
        self._group: dist.ProcessGroup | None = None

    def save(
        self, run_dir: str | Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep_last: int = 3
    ) -> Path:
        self.wait()  # one checkpoint in flight: the previous one is published first
        distributed = dist.is_available() and dist.is_initialized()
        if not distributed:  # one process is intended; DCP warns from its writer thread
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        elif self._group is None:
            self._group = dist.new_group(backend="gloo")  # every rank, at the same save
        with _disk_full_is_an_error(run_dir, step):
            tmp = _prepare(run_dir, step)
            written = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._group, no_dist=not distributed)
        rank = _rank()

        def finish() -> None:
            with _disk_full_is_an_error(run_dir, step):
                written.result()  # this rank's files; on rank 0 also .metadata, i.e. every rank's
                inject("checkpoint", step)
                if rank == 0:
                    _publish_and_upload(run_dir, step, meta, keep_last, self._remote)

        self._pending = self._executor.submit(finish)
        return _paths(run_dir, step)[1]

    def poll(self) -> None:
        """Raise the error of a finished background write, if any."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Block until the checkpoint in flight is published (or raise its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


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
            if name not in kept and (_step_of(Path(name)) or 0) < (_step_of(final) or 0):
                self.mirror.remove(f"checkpoints/{name}/")
        log.info("uploaded checkpoint %s to %s", final.name, self.mirror.url)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


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


def _step_of(path: Path) -> int | None:
    try:
        return int(path.name[len("step_") :]) if path.name.startswith("step_") else None
    except ValueError:
        return None


def _previous_hint(ckpt: Path) -> str:
    """Name the newest complete checkpoint older than ``ckpt``, the way out of a bad one."""
    step = _step_of(ckpt)
    if step is None:
        return ""
    older = [p for p in list_checkpoints(ckpt.parent.parent) if (_step_of(p) or 0) < step]
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
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {META} is missing{_previous_hint(ckpt)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"checkpoint {ckpt} is corrupted: {META} is not valid JSON ({error}){_previous_hint(ckpt)}"
        ) from None
    if verify:
        for name, expected in meta.get("files", {}).items():
            path = ckpt / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint {ckpt} is incomplete: {name} is missing{_previous_hint(ckpt)}")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointError(
                    f"checkpoint {ckpt} is truncated or corrupted: {name} has {size} bytes, "
                    f"expected {expected['bytes']}{_previous_hint(ckpt)}"
                )
            if _sha256(path) != expected["sha256"]:
                raise CheckpointError(
                    f"checkpoint {ckpt} is corrupted: {name} fails its sha256 check{_previous_hint(ckpt)}"
                )
    return meta


def _dcp_load(state: dict[str, Any], ckpt: Path) -> None:
    try:
        with warnings.catch_warnings():  # torch's warning for a load without a process group, as intended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(ckpt))
    except Exception as error:  # DCP raises many types for bad files; name the checkpoint
        raise CheckpointError(
            f"checkpoint {ckpt} could not be read: {type(error).__name__}: {error}{_previous_hint(ckpt)}"
        ) from error


def load_checkpoint(ckpt: str | Path, state: dict[str, Any], verify: bool = True) -> dict[str, Any]:
    """Load DCP data into ``state`` in place (its tensors give the target layout); return meta."""
    ckpt = resolve_checkpoint(ckpt)
    meta = read_meta(ckpt, verify=verify and _rank() == 0)
    _dcp_load(state, ckpt)
    return meta


def load_for_inference(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, ModelConfig, dict[str, Any]]:
    """(model in eval mode, its config, meta) from a run dir or a checkpoint dir."""
    ckpt = resolve_checkpoint(path)
    meta = read_meta(ckpt)
    config = ModelConfig.from_dict(meta["model"])
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    model.tie_embedding_weights()
    model.init_weights(buffer_device=torch.device(device))
    state = {"model": {k: v for k, v in model.state_dict().items()}}
    _dcp_load(state, ckpt)
    model.load_state_dict(state["model"])
    model.eval()
    return model, config, meta
