"""The document-directory contract (docs/architecture.md, format 1) that curation writes and tokenization
reads: directories of Parquet files with the columns `id`, `text`, `source`; a stage directory
holds `kept/`, `rejected/` and `manifest.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage

REQUIRED_COLUMNS = ("id", "text", "source")
KEPT_DIR = "kept"
REJECTED_DIR = "rejected"
MANIFEST_FILE = "manifest.json"


def input_list(input: str | Path | list[str | Path] | tuple[str | Path, ...]) -> list[str | Path]:
    """An input given as one path or URL, or several, as a list."""
    return list(input) if isinstance(input, (list, tuple)) else [input]


def resolve_input_files(path: str | Path | list[str | Path]) -> list[Path | str]:
    """Parquet files of a document input: a stage directory (its `kept/`), a directory of
    Parquet files, a single Parquet file, or a list of any of these. Sorted, so that partition
    numbering does not depend on the file system. Local files come back as `Path`s, files on
    object storage as URL strings."""
    if isinstance(path, (list, tuple)):
        files: list[Path | str] = []
        for item in path:
            files.extend(resolve_input_files(item))
        return files
    location = storage.Location(path)
    if not location.is_local:
        return _resolve_remote_files(location.path)
    path = Path(path)
    if not path.exists():
        raise TokenmillError(f"input not found: {path}")
    if path.is_file():
        if path.suffix != ".parquet":
            raise TokenmillError(
                f"input {path} is not a Parquet file; raw corpora go through `tokenmill curate ingest` first"
            )
        return [path.absolute()]
    # Absolute: the files are read by Dask workers, whose working directory is not the command's
    # on a cluster given by --scheduler or DASK_SCHEDULER_ADDRESS.
    path = path.absolute()
    if (path / KEPT_DIR).is_dir() and (path / MANIFEST_FILE).exists():
        if not kept_written(path):
            stages = " + ".join(read_manifest(path)["chain"]["stages"])
            raise TokenmillError(
                f"{path} ran inside a chain ({stages}) whose last stage alone wrote its kept documents: read"
                " that one, or run the chain with --keep-intermediate (keep_intermediate: true in a recipe)"
            )
        path = path / KEPT_DIR
    files = sorted(
        p for p in path.rglob("*.parquet") if not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not files:
        raise TokenmillError(
            f"no Parquet documents under {path}; give a stage directory (with kept/ and manifest.json) or a directory of Parquet files"
        )
    return files


def _resolve_remote_files(url: str) -> list[str]:
    """`resolve_input_files` for a URL. Publication on object storage writes the manifest last,
    so a stage directory without one is an interrupted publication, never a finished output."""
    if storage.isfile(url):
        if not url.endswith(".parquet"):
            raise TokenmillError(
                f"input {url} is not a Parquet file; raw corpora go through `tokenmill curate ingest` first"
            )
        return [url]
    if not storage.exists(url):
        raise TokenmillError(f"input not found: {url}")
    kept = f"{url}/{KEPT_DIR}"
    if storage.exists(f"{url}/{MANIFEST_FILE}"):
        url = kept
    elif storage.exists(kept):
        raise TokenmillError(
            f"{url} is an unfinished stage output ({KEPT_DIR}/ without {MANIFEST_FILE}: its publication was"
            " interrupted); run that stage again"
        )
    files = [name for name, _ in storage.list_files(url, ".parquet")]
    if not files:
        raise TokenmillError(
            f"no Parquet documents under {url}; give a stage directory (with kept/ and manifest.json) or a directory of Parquet files"
        )
    return files


def check_document_columns(table_columns: list[str], where: str | Path) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in table_columns]
    if missing:
        raise TokenmillError(
            f"{where} lacks the document column(s) {', '.join(missing)} (documents need id, text, source)"
        )


def read_manifest(stage_dir: str | Path) -> dict[str, Any]:
    path = storage.join(stage_dir, MANIFEST_FILE)
    return storage.read_json(path, missing=f"{stage_dir} is not a stage directory: {MANIFEST_FILE} is missing")


def kept_written(stage_dir: str | Path) -> bool:
    """Whether a stage directory holds its kept documents: a stage inside a chain
    (`tokenmill curate chain`) may leave them to the next stage alone."""
    if not storage.exists(storage.join(stage_dir, MANIFEST_FILE)):
        return False
    return (read_manifest(stage_dir).get("chain") or {}).get("kept_written", True)


def upstream_manifest(path: str | Path | list) -> dict[str, Any] | None:
    """The manifest of the stage an input came from, when the input is a stage directory."""
    if isinstance(path, (list, tuple)):
        return None
    location = storage.Location(path)
    if not location.is_local:
        url = location.path
        for candidate in (url, str(storage.parent(url))):
            if storage.exists(f"{candidate}/{MANIFEST_FILE}"):
                return read_manifest(candidate)
        return None
    path = Path(path)
    for candidate in (path, path.parent):
        if (candidate / MANIFEST_FILE).exists() and (candidate / KEPT_DIR).is_dir():
            return read_manifest(candidate)
    return None
