"""Reading a checkpoint's DCP ``.metadata`` without letting it run code.

torch.distributed.checkpoint writes ``.metadata`` with `pickle` and its `FileSystemReader`
reads it back with a plain `pickle.load`, so a crafted ``.metadata`` runs whatever its pickle
names. `MetadataReader` is that reader with one change: ``.metadata`` is unpickled by
`RestrictedUnpickler`, which builds only the classes DCP's metadata is made of (the dataclasses
of `torch.distributed.checkpoint.metadata`, `torch.Size`, dtypes and layouts, paths) and refuses
any other global in one line, as ``torch.load(weights_only=True)`` does for the tensor files.
"""

from __future__ import annotations

import collections
import pathlib
import pickle
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

from tokenmill.train.checkpoint_files import CheckpointError

# (module, name) of every class or function a DCP ``.metadata`` pickle may name.
_METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        (dcp_metadata.__name__, cls.__name__): cls
        for cls in (
            dcp_metadata.Metadata,
            dcp_metadata.MetadataIndex,
            dcp_metadata.ChunkStorageMetadata,
            dcp_metadata.TensorStorageMetadata,
            dcp_metadata.BytesStorageMetadata,
            dcp_metadata.TensorProperties,
            dcp_metadata.StorageMeta,
            dcp_metadata._MEM_FORMAT_ENCODING,
        )
    },
    (dcp_filesystem.__name__, "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a layout by its name
    ("collections", "OrderedDict"): collections.OrderedDict,
    # StorageMeta.checkpoint_id: the path the checkpoint was saved to.
    **{(module, "PosixPath"): pathlib.PosixPath for module in ("pathlib", "pathlib._local")},
    **{(module, "PurePosixPath"): pathlib.PurePosixPath for module in ("pathlib", "pathlib._local")},
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds DCP metadata and nothing else (`_METADATA_GLOBALS`, torch dtypes)."""

    def __init__(self, file: IO[bytes], where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_GLOBALS.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"checkpoint metadata {self.where} refuses to load class {module}.{name}: a DCP .metadata holds"
            " only checkpoint metadata, and unpickling anything else could run code"
        )


def load_metadata(file: IO[bytes], where: str) -> dcp_metadata.Metadata:
    """The `Metadata` pickled in ``file`` (``where`` names it in errors), built only from the
    classes DCP's metadata is made of."""
    try:
        metadata = RestrictedUnpickler(file, where).load()
    except CheckpointError:
        raise
    except Exception as error:  # a truncated or garbled pickle raises many types
        raise CheckpointError(f"checkpoint metadata {where} is not readable: {type(error).__name__}: {error}") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CheckpointError(f"checkpoint metadata {where} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class MetadataReader(FileSystemReader):
    """DCP's `FileSystemReader`, reading ``.metadata`` through `load_metadata`. DCP turns a
    reader's error into text inside its own (with a rank's traceback), so the refusal is also
    kept in ``refusal`` for the caller to raise as it is."""

    refusal: CheckpointError | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            try:
                metadata = load_metadata(metadata_file, str(path))
            except CheckpointError as refusal:
                self.refusal = refusal
                raise
        # What FileSystemReader.read_metadata does after unpickling.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
