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
from torch.distributed.checkpoint.api import CheckpointException

from tokenmill.errors import DiskFullError, TokenmillError
from tokenmill.infra import machine_faults
from tokenmill.infra.atomic import atomic_write_text, fsync_dir, remove_leftovers, replace_dir, temp_sibling
from tokenmill.train.checkpoint_files import (
    FORMAT_VERSION,
    LATEST,
    META,
    CheckpointError,
    RemoteRun,
    file_sha256,
    list_checkpoints,
    previous_hint,
    read_meta,
    resolve_checkpoint,
)
from tokenmill.train.checkpoint_metadata import MetadataReader
from tokenmill.train.fault_injection import inject
from tokenmill.train.model import GPT
from tokenmill.train.model_config import ModelConfig

log = logging.getLogger(__name__)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """The RNG states a resumed run restores: Python's and NumPy's as JSON (exactly; never a
    pickle, which would run code when loaded), torch's as its bytes."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, Any], where: Path | str) -> None:
    """Restore `rng_state`'s states. A checkpoint written before they were JSON holds Python's and
    NumPy's as pickles, which are not loaded (a crafted one runs code): those two generators keep
    their seeded state, with a warning naming the checkpoint ``where``."""
    if isinstance(state["python"], str) or isinstance(state["numpy"], str):
        log.warning(
            "%s stores the Python and NumPy random states as pickles, which are never loaded (a pickle can run"
            " code); both generators continue from their seeded state instead",
            where,
        )
    else:
        try:
            version, internal, gauss_next = state["python"]
            random.setstate((version, tuple(internal), gauss_next))
            name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
            np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
        except (TypeError, ValueError, OverflowError) as error:  # what the generators say of a bad state
            raise CheckpointError(f"{where}: its random states are not valid: {error}") from None
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8))


def _file_table(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
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
        if isinstance(error, TokenmillError | KeyboardInterrupt | SystemExit) or not machine_faults.is_disk_full(
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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _dcp_load(state: dict[str, Any], ckpt: Path) -> None:
    reader = MetadataReader(str(ckpt))
    try:
        with warnings.catch_warnings():  # torch's warning for a load without a process group, as intended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader)
    except (Exception, CheckpointException) as error:  # DCP raises many types for bad files; name the checkpoint
        if reader.refusal is not None:  # the reader's own line, which DCP folds into its messages
            raise reader.refusal from None
        failures = getattr(error, "failures", None)
        if failures:  # a CheckpointException's text is every rank's traceback: name the first error
            error = next(iter(failures.values()))[0]
        raise CheckpointError(
            f"checkpoint {ckpt} could not be read: {type(error).__name__}: {error}{previous_hint(ckpt)}"
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
