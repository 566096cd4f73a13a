"""The harness's Hugging Face datasets, read with `datasets`: from the hub, or from a local copy.

lm-evaluation-harness 0.4 loads each task with `datasets.load_dataset(dataset_path, dataset_name,
split=...)`. Without `--data-dir` tokenmill makes the same call. A data directory may also hold
those datasets in the hub's own layout, under `DATA_DIR/<dataset id>[/<config>]/`:

- a `DatasetDict` (or one split's `Dataset`, in `<split>/`) written by `save_to_disk`, or
- the hub repository's data files for the split: `<split>-00000-of-00001.parquet` (any folder
  depth, as the hub stores them), `<split>.jsonl`, or any file inside a folder named `<split>`
  (the hub's parquet export layout); parquet, JSON lines, JSON, CSV and Arrow files are read.

A dataset with a config (`aps/super_glue` `boolq`) lives in `DATA_DIR/aps/super_glue/boolq/`; a
dataset without one (or `default`) directly in `DATA_DIR/<dataset id>/`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmill.errors import TokenmillError

Doc = dict[str, Any]

# Data file suffix -> the `datasets` packaged builder that reads it.
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}


class HubUnavailable(Exception):
    """`datasets` could not load a dataset from the hub (offline, no network, not found)."""


@dataclass(frozen=True)
class LocalSplit:
    """Where one split of a hub dataset lies in a data directory."""

    kind: str  # "saved" (save_to_disk) or "files" (the hub repository's data files)
    paths: tuple[Path, ...]
    key: str | None = None  # the split inside a saved DatasetDict

    def describe(self) -> str:
        return str(self.paths[0]) if len(self.paths) == 1 else f"{self.paths[0].parent} ({len(self.paths)} files)"


def hub_dir(data_dir: Path, dataset_id: str, config: str | None) -> Path | None:
    """The folder holding `dataset_id` (and `config`) in a data directory, if there is one."""
    root = data_dir / dataset_id
    if config and (root / config).is_dir():
        return root / config
    # A named config must have its own folder: another config's rows must never stand in.
    if (config in (None, "default")) and root.is_dir():
        return root
    return None


def expected_dir(data_dir: Path, dataset_id: str, config: str | None) -> Path:
    root = data_dir / dataset_id
    return root / config if config and config != "default" else root


def _matches_split(path: Path, folder: Path, split: str) -> bool:
    name = path.name
    stem = name.split(".", 1)[0]
    if stem == split or name.startswith(f"{split}-"):
        return True
    return split in path.relative_to(folder).parts[:-1]


def find_local_split(data_dir: Path, dataset_id: str, config: str | None, split: str) -> LocalSplit | None:
    """The saved dataset or the data files of `split`, or None when the data directory lacks them."""
    folder = hub_dir(data_dir, dataset_id, config)
    if folder is None:
        return None
    listing = folder / "dataset_dict.json"
    if listing.is_file():
        try:
            splits = json.loads(listing.read_text(encoding="utf-8")).get("splits", [])
        except (json.JSONDecodeError, AttributeError) as error:
            raise TokenmillError(f"{listing}: not a `save_to_disk` dataset_dict.json ({error})") from error
        return LocalSplit("saved", (folder,), split) if split in splits else None
    if (folder / split / "state.json").is_file():
        return LocalSplit("saved", (folder / split,))
    # Hidden paths (.cache/, .git/) hold no rows of the dataset.
    visible = (p for p in folder.rglob("*") if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    files = sorted(p for p in visible if p.is_file() and p.suffix in BUILDERS and _matches_split(p, folder, split))
    if not files:
        return None
    suffixes = {BUILDERS[p.suffix] for p in files}
    if len(suffixes) > 1:
        names = ", ".join(str(p) for p in files)
        raise TokenmillError(f"split {split} of {dataset_id} has files of several formats: {names}")
    return LocalSplit("files", tuple(files))


def read_local_split(found: LocalSplit) -> list[Doc]:
    """Rows of a split found by `find_local_split`, in stored order."""
    datasets = _import_datasets()
    try:
        if found.kind == "saved":
            data = datasets.load_from_disk(str(found.paths[0]))
            if found.key is not None:
                data = data[found.key]
        else:
            builder = BUILDERS[found.paths[0].suffix]
            data = datasets.load_dataset(builder, data_files=[str(p) for p in found.paths], split="train")
    except Exception as error:  # datasets raises many types for unreadable files
        raise TokenmillError(f"cannot read {found.describe()} with `datasets` ({_one_line(error)})") from error
    return data.to_list()


def load_hub_split(dataset_id: str, config: str | None, split: str) -> list[Doc]:
    """`datasets.load_dataset(dataset_id, config, split=split)`, as the harness calls it."""
    datasets = _import_datasets()
    try:
        data = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as error:  # offline, no network, unknown id: datasets raises many types
        raise HubUnavailable(offline_reason(error)) from error
    return data.to_list()


def offline_reason(error: BaseException) -> str:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var} is set and it is not in the local cache"
    return _one_line(error)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError as error:  # pragma: no cover - datasets is a dependency of tokenmill
        raise TokenmillError("reading the harness's datasets needs `pip install datasets`") from error
    if not sys.stderr.isatty():
        datasets.disable_progress_bars()  # as tokenmill's own bars: a pipe or log gets no redraws
    return datasets
