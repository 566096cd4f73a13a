"""Paths that may be URLs: local files stay on the plain `os` / `pathlib` path (no fsspec in the
hot loop), anything else (``s3://``, ``gs://``, ``hf://``, ``https://``) goes through fsspec
with the credentials of the usual environment (AWS_* variables, AWS_ENDPOINT_URL, ~/.aws,
fsspec's own config).

Object stores have no rename, so publication there is ordered instead of atomic: a stage
writes under a hidden temporary prefix beside its output, the finished files are copied into
place, and the completion marker (a stage's ``manifest.json``, a shard's ``PREFIX.json``) is
written last. Readers take an output as finished only when its marker is there, and a re-run
removes the temporary prefixes a killed writer left behind.

`Location` is the one type for both kinds of place (local disk a case of it), and the module's
functions take either spelling and branch once, here. Work that must happen on local disk (a
memory-mapped shard, a tokenizer file, a dedup index, a training run, a recipe's work directory)
goes through one `Mirror`: a local copy in a cache directory (``$TOKENMILL_CACHE``, default
``~/.cache/tokenmill``), keyed by URL, whose files are checked against the objects' etags and
sizes, downloaded when they differ and published back in the caller's order.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tokenmill.errors import TokenmillError

log = logging.getLogger(__name__)

# The package to install for a protocol whose fsspec implementation is missing.
_PACKAGES = {
    "s3": "s3fs (pip install 'tokenmill[s3]')",
    "s3a": "s3fs (pip install 'tokenmill[s3]')",
    "gs": "gcsfs (pip install gcsfs)",
    "gcs": "gcsfs (pip install gcsfs)",
    "hf": "huggingface_hub (pip install huggingface_hub)",
    "http": "aiohttp (pip install aiohttp)",
    "https": "aiohttp (pip install aiohttp)",
}


def is_url(path: str | os.PathLike | Any) -> bool:
    """True for a URL that fsspec opens (``s3://...``); False for a local path or ``file://``."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


# Query parameters of a presigned or token URL that carry a credential or that each signature
# changes (its date and expiry), by lower-cased name: S3 (SigV4 and V2), GCS, Azure's `sig`, and
# bearer tokens. Removed, not masked, so that the same object signed again has the same name.
_CREDENTIAL_PARAMETERS = frozenset({"signature", "awsaccesskeyid", "expires", "sig", "token", "access_token"})
_CREDENTIAL_PREFIXES = ("x-amz-", "x-goog-")
# A URL inside a message: up to a space or a quote, less the punctuation that ends a phrase.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>:,.;)\]]")


def redact(text: str | os.PathLike) -> str:
    """``text`` (a URL, or a message naming URLs) with every URL's credentials removed: the
    ``user:password@`` of its address and the query parameters of a signature or a token
    (``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``Signature``,
    ``AWSAccessKeyId``, ``sig``, ``token``, ...). What is stored (manifests, ids, sources) or
    printed (log lines, errors, reports) goes through it; what is read keeps the whole URL."""
    return _URL_IN_TEXT.sub(lambda match: _redact_url(match.group(0)), str(text))


def _redact_url(url: str) -> str:
    from urllib.parse import unquote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL after all (an odd bracket in its address)
        return url
    netloc = parts.netloc.rpartition("@")[2]
    kept = [
        pair
        for pair in parts.query.split("&")
        if pair
        and not (
            (name := unquote(pair.split("=", 1)[0]).lower()) in _CREDENTIAL_PARAMETERS
            or name.startswith(_CREDENTIAL_PREFIXES)
        )
    ]
    return urlunsplit((parts.scheme, netloc, parts.path, "&".join(kept), parts.fragment))


def local_path(path: str | os.PathLike) -> Path:
    """A local path as a `Path` (``file://`` stripped)."""
    text = str(path)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


def absolute(path: str | os.PathLike) -> str:
    """The path as recorded in manifests: an absolute local path, or the URL unchanged."""
    return str(path).rstrip("/") if is_url(path) else str(local_path(path).resolve())


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base/part/...``: a URL for a URL, a local path otherwise (a string either way)."""
    if is_url(base):
        return posixpath.join(str(base).rstrip("/"), *parts)
    return str(local_path(base).joinpath(*parts))


def join_inside(root: str | os.PathLike, relative: str, what: str = "path") -> str:
    """``root/relative`` for a relative path that came from data (a crawl's path list, an index's
    or a listing's keys, a recipe's name), refused in one line naming it (as ``what``) when it is
    absolute, a URL, or climbs out of ``root`` with ``..``: data never decides where, outside
    ``root``, a file is written."""
    parts = relative.replace("\\", "/").split("/")
    if not relative or relative.startswith(("/", "\\", "~")) or "://" in relative or ".." in parts:
        raise TokenmillError(f"{what} {relative!r} is not a relative path inside {root}; refusing to use it")
    return join(root, relative)


def basename(path: str | os.PathLike) -> str:
    return posixpath.basename(str(path).rstrip("/")) if is_url(path) else local_path(path).name


def public_name(path: str | os.PathLike) -> str:
    """The file name that documents' ids and sources record: `basename` of the path without the
    credentials of a presigned URL (see `redact`), so that it is the same however it was signed."""
    return basename(redact(path))


def parent(path: str | os.PathLike) -> str:
    if is_url(path):
        return posixpath.dirname(str(path).rstrip("/"))
    return str(local_path(path).parent)


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a URL, with a one-line error when the protocol's
    package is missing."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as error:
        package = _PACKAGES.get(protocol)
        if isinstance(error, ImportError) or "not known" in str(error) or "install" in str(error).lower():
            needs = package or f"an fsspec implementation for {protocol}://"
            raise TokenmillError(f"reading or writing {url} needs {needs}") from None
        raise TokenmillError(f"cannot open {url}: {error}") from None
    # Listings are cached per process by fsspec; another process (a Dask worker) may have
    # written since, so never trust a stale listing.
    fs.invalidate_cache()
    return fs, path


@contextmanager
def storage_errors(url: str | os.PathLike, action: str = "access") -> Iterator[None]:
    """Turn the errors of object stores (missing bucket, no credentials, refused access) into
    one-line `TokenmillError`s naming the URL."""
    url = redact(url)
    try:
        yield
    except TokenmillError:
        raise
    except FileNotFoundError as error:
        raise TokenmillError(f"cannot {action} {url}: not found ({_first_line(error)})") from None
    except PermissionError as error:
        raise TokenmillError(f"cannot {action} {url}: access denied ({_first_line(error)})") from None
    except Exception as error:
        name = type(error).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
            raise TokenmillError(
                f"cannot {action} {url}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or configure ~/.aws)"
            ) from None
        if name in ("ClientError", "EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"):
            raise TokenmillError(f"cannot {action} {url}: {_first_line(error)}") from None
        raise


def _first_line(error: BaseException) -> str:
    text = redact(str(error)).strip().splitlines()
    return text[0] if text else type(error).__name__


def _query(path: str | os.PathLike, local: Any, remote: Any) -> Any:
    """``local(Path)`` for a local path, ``remote(fs, inner path)`` for a URL."""
    if not is_url(path):
        return local(local_path(path))
    fs, inner = filesystem(str(path))
    with storage_errors(path, "read"):
        return remote(fs, inner)


def exists(path: str | os.PathLike) -> bool:
    return _query(path, Path.exists, lambda fs, inner: fs.exists(inner))


def isdir(path: str | os.PathLike) -> bool:
    return _query(path, Path.is_dir, lambda fs, inner: fs.isdir(inner))


def isfile(path: str | os.PathLike) -> bool:
    return _query(path, Path.is_file, lambda fs, inner: fs.isfile(inner))


def size(path: str | os.PathLike) -> int:
    return _query(path, lambda p: p.stat().st_size, lambda fs, inner: int(fs.size(inner)))


def _version(info: dict[str, Any]) -> str:
    """What changes when an object is rewritten: its etag (S3, GCS), else its mtime."""
    for key in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "created"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""


def fingerprint(path: str | os.PathLike) -> tuple[str, int, str]:
    """(absolute path or URL, without credentials, size, version): what resumable work keys its
    outputs on (the same object under a fresh signature has the same key)."""
    if not is_url(path):
        stat = local_path(path).stat()
        return absolute(path), stat.st_size, str(stat.st_mtime_ns)
    fs, inner = filesystem(str(path))
    with storage_errors(path, "read"):
        info = fs.info(inner)
    return redact(absolute(path)), int(info.get("size") or 0), _version(info)


def fingerprints(path: str | os.PathLike) -> list[tuple[str, int, str]]:
    """The `fingerprint` of a file, or of every file under a directory (sorted by name); [] when
    nothing is there. What a step's inputs are keyed on: a changed file changes the key."""
    if not is_url(path):
        local = local_path(path)
        if local.is_file():
            return [fingerprint(local)]
        if local.is_dir():
            return [fingerprint(file) for file in sorted(local.rglob("*")) if file.is_file()]
        return []
    if isdir(path):
        return [fingerprint(url) for url, _ in list_files(path)]
    return [fingerprint(path)] if exists(path) else []


def list_files(directory: str | os.PathLike, suffix: str | None = None) -> list[tuple[str, str]]:
    """(path, path relative to `directory`) of the files under `directory`, sorted, skipping
    hidden files and directories (``.git``, temporary prefixes)."""
    if not is_url(directory):
        root = local_path(directory)
        found = [
            (str(p), p.relative_to(root).as_posix())
            for p in root.rglob(f"*{suffix or ''}")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        ]
        return sorted(found, key=lambda item: item[1])
    fs, inner = filesystem(str(directory))
    inner = inner.rstrip("/")
    protocol = str(directory).split("://", 1)[0]
    with storage_errors(directory, "list"):
        names = fs.find(inner)
    found = []
    for name in names:
        relative = name[len(inner) :].lstrip("/")
        if not relative or any(part.startswith(".") for part in relative.split("/")):
            continue
        if suffix and not relative.endswith(suffix):
            continue
        found.append((f"{protocol}://{name}", relative))
    return sorted(found, key=lambda item: item[1])


def open_input(path: str | os.PathLike, compression: str | None = None) -> IO[bytes]:
    """A binary file object for reading; ``compression`` is ``gzip`` or ``zstd`` (or None)."""
    import fsspec

    if not is_url(path):
        if compression is None:
            return open(local_path(path), "rb")
        return fsspec.open(str(local_path(path)), "rb", compression=compression).open()
    filesystem(str(path))  # the clear error for a missing package
    with storage_errors(path, "read"):
        return fsspec.open(str(path), "rb", compression=compression).open()


# Raw inputs compressed as a whole file, by suffix: the name fsspec gives the codec.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}


def compression_suffix(name: str) -> str | None:
    """`.gz` or `.zst` when the file name ends so (in any case), else None."""
    return next((c for c in COMPRESSIONS if name.lower().endswith(c)), None)


def open_decompressed(path: str) -> IO[bytes]:
    """A raw input file for reading, decompressed as its suffix says (`.gz`, `.zst`)."""
    compression = compression_suffix(path)
    if is_url(path):
        # fsspec's files take no size in readline(): a buffered reader over them does, so a
        # line is read up to a limit, never whole (a record limit holds over a URL as on disk).
        return io.BufferedReader(open_input(path, COMPRESSIONS.get(compression or "")))
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression == ".zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return open(path, "rb")


@contextmanager
def open_output(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary file object for writing. Local files are written to a temporary sibling and
    renamed; on object storage an upload becomes visible only when it completes, and an error
    aborts it."""
    if not is_url(path):
        from tokenmill.infra.atomic import atomic_path

        target = local_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp, open(tmp, "wb") as handle:
            yield handle
        return
    fs, inner = filesystem(str(path))
    with storage_errors(path, "write"):
        handle = fs.open(inner, "wb")
    try:
        yield handle
    except BaseException:
        if hasattr(handle, "discard"):
            handle.discard()  # s3fs: abort the multipart upload, nothing becomes visible
            handle.closed = True  # so that garbage collection does not flush the discarded buffer
        else:
            handle.close()
            with storage_errors(path, "write"):
                fs.rm(inner)
        raise
    with storage_errors(path, "write"):
        handle.close()


def read_bytes(path: str | os.PathLike) -> bytes:
    return _query(path, Path.read_bytes, lambda fs, inner: fs.cat_file(inner))


def read_text(path: str | os.PathLike) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str | os.PathLike, missing: str) -> Any:
    """A JSON file's content; a missing file raises `missing`, invalid JSON says where, in one line."""
    if not isfile(path):
        raise TokenmillError(missing)
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise TokenmillError(f"{path} is not valid JSON: {error}") from None


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write a whole file atomically (a local rename; a single PUT on object storage)."""
    if not is_url(path):
        from tokenmill.infra.atomic import atomic_write_bytes

        local_path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(local_path(path), data)
        return
    fs, inner = filesystem(str(path))
    with storage_errors(path, "write"):
        fs.pipe_file(inner, data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create_exclusive(url: str, data: bytes) -> bool:
    """Write an object only if none exists (a conditional PUT, ``If-None-Match: *``: of two
    writers exactly one creates it); False when one does. Stores without conditional writes
    are refused in one line."""
    fs, inner = filesystem(url)
    with storage_errors(url, "write"):
        try:
            fs.pipe_file(inner, data, mode="create")
        except FileExistsError:
            return False
        except TypeError:  # this filesystem's pipe_file has no exclusive mode
            raise TokenmillError(
                f"{url}: {type(fs).__name__} cannot create an object only if it is absent, "
                "so it cannot keep two writers apart"
            ) from None
    return True


def upload(local: str | os.PathLike, url: str) -> None:
    """Copy a local file to `url` (one object, visible once complete)."""
    fs, inner = filesystem(url)
    with storage_errors(url, "write"):
        fs.put_file(str(local), inner)


def remove(path: str | os.PathLike) -> None:
    """Remove a file or a whole directory / prefix; nothing there is not an error."""
    if not is_url(path):
        target = local_path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
        return
    fs, inner = filesystem(str(path))
    with storage_errors(path, "remove"):
        if fs.exists(inner):
            fs.rm(inner, recursive=True)


def parquet_file(path: str | os.PathLike):
    """A `pyarrow.parquet.ParquetFile` for a local path or a URL (read by range requests)."""
    import pyarrow.parquet as pq

    source = str(local_path(path)) if not is_url(path) else open_input(path)
    try:
        return pq.ParquetFile(source)
    except Exception as error:  # pyarrow raises several types for a corrupt file
        raise TokenmillError(f"cannot read Parquet file {path}: {error}") from None


def glob(directory: str | os.PathLike, pattern: str) -> list[str]:
    """The entries directly in `directory` whose names match `pattern` (``.NAME.tmp-*``), as
    paths or URLs, sorted; none for a directory that does not exist."""
    if not is_url(directory):
        return sorted(str(p) for p in local_path(directory).glob(pattern))
    fs, inner = filesystem(str(directory))
    protocol = str(directory).split("://", 1)[0]
    with storage_errors(directory, "list"):
        return sorted(f"{protocol}://{name}" for name in fs.glob(f"{inner.rstrip('/')}/{pattern}"))


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None):
    """A whole Parquet file as a `pyarrow.Table` (a URL is read by range requests)."""
    import pyarrow.parquet as pq

    if is_url(path):
        return parquet_file(path).read(columns=columns)
    return pq.read_table(str(local_path(path)), columns=columns)


def parquet_dataset(files: list[str]):
    """A `pyarrow.dataset.Dataset` over Parquet files, all local or all on one store."""
    import pyarrow.dataset as ds

    if not files or not is_url(files[0]):
        return ds.dataset([str(local_path(f)) for f in files], format="parquet")
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, _ = filesystem(files[0])
    inner = [filesystem(name)[1] for name in files]
    return ds.dataset(inner, format="parquet", filesystem=PyFileSystem(FSSpecHandler(fs)))


class Location:
    """A place to read and write: a local path, or a URL that fsspec opens. Code that is given a
    stage, shard, index or run directory asks its `Location` rather than the spelling of the
    path; local disk is a case of it (`is_local`, `local_path`) that keeps the plain `os` path.

    ``Location(path).absolute()`` is the form recorded in manifests; `join` and `parent` give
    further locations. The file operations are this module's functions, which take a `Location`
    as well as a path or URL (``storage.exists(location)``)."""

    def __init__(self, path: str | os.PathLike | Location) -> None:
        text = path.path if isinstance(path, Location) else str(path)
        self.is_local = not is_url(text)
        # A URL keeps its spelling, less a trailing slash; a local path its `Path` form.
        self.path = str(local_path(text)) if self.is_local else text.rstrip("/")

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Location({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def local_path(self) -> Path:
        """The path on local disk; a URL has none."""
        if not self.is_local:
            raise TokenmillError(f"{self.path} is on object storage, not on local disk")
        return Path(self.path)

    @property
    def name(self) -> str:
        return basename(self.path)

    def absolute(self) -> Location:
        return Location(absolute(self.path))

    def native(self) -> str | Path:
        """What code that opens local files directly takes: the absolute `Path`, or the URL."""
        return self.local_path.resolve() if self.is_local else self.path

    def join(self, *parts: str) -> Location:
        return Location(join(self.path, *parts))

    @property
    def parent(self) -> Location:
        return Location(parent(self.path))


# ---- publication of a directory on object storage -------------------------------------------


def work_prefix(target: str | os.PathLike) -> str:
    """The name a curate stage's work directory beside ``target`` starts with; the run's key
    follows it (``.NAME.partial-KEY``, see `tokenmill.curate.resume`)."""
    return f".{basename(target)}.partial-"


def remove_stale_temporaries(target: str | os.PathLike, keep: str | None = None) -> int:
    """Remove the temporaries that killed or older writers of ``target`` left beside it: an
    atomic writer's ``.NAME.tmp-*`` and every stage work directory ``.NAME.partial-*`` but
    ``keep`` (the current run's, which it resumes from); returns how many. The caller holds the
    output's claim (`tokenmill.infra.outputs.claim_output`), so no live writer owns them."""
    name = basename(target)
    stale = glob(parent(target), f".{name}.tmp-*") + glob(parent(target), work_prefix(target) + "*")
    stale = [path for path in stale if keep is None or path.rstrip("/") != str(keep).rstrip("/")]
    for path in stale:
        log.info("%s: removing %s, left by an interrupted run or another config or input", name, basename(path))
        remove(path)
    return len(stale)


def publish_prefix(tmp: str, target: str, marker: str, marker_text: str, *, private: str | None = None) -> None:
    """Publish the files under the temporary prefix ``tmp`` as ``target`` on object storage.

    Order matters, because a reader takes ``target`` as finished when ``target/marker`` exists:
    the old marker goes first, then the old files; the new files are copied into place, and the
    new marker is written last. A run killed at any point leaves no marker over mixed or partial
    files, and the temporary prefix for the next run to remove (or resume from). Files under
    ``tmp/private/`` (a writer's own records) are not copied; they go with the prefix.
    """
    fs, target_inner = filesystem(target)
    _, tmp_inner = filesystem(tmp)
    target_inner, tmp_inner = target_inner.rstrip("/"), tmp_inner.rstrip("/")
    with storage_errors(target, "publish"):
        if fs.exists(f"{target_inner}/{marker}"):
            fs.rm_file(f"{target_inner}/{marker}")
        if fs.exists(target_inner):
            fs.rm(target_inner, recursive=True)
        written = fs.find(tmp_inner)
        skipped = f"{tmp_inner}/{private}/" if private else None
        sources = [
            name for name in written if name != f"{tmp_inner}/{marker}" and not (skipped and name.startswith(skipped))
        ]
        if sources:
            # Server-side copies, issued in one batch.
            fs.copy(sources, [target_inner + name[len(tmp_inner) :] for name in sources])
        fs.pipe_file(f"{target_inner}/{marker}", marker_text.encode("utf-8"))
        if written:  # a stage that kept and rejected nothing wrote no files, so no prefix
            fs.rm(tmp_inner, recursive=True)


# ---- a local cache of remote inputs ---------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("TOKENMILL_CACHE") or Path.home() / ".cache" / "tokenmill")


def cache_dir_for(url: str, kind: str) -> Path:
    """A local directory owned by one URL: ``<cache>/<kind>/<sha256(url)[:16]>``."""
    key = hashlib.sha256(absolute(url).encode("utf-8")).hexdigest()[:16]
    return cache_root() / kind / key


def cached_file(url: str) -> Path:
    """A local copy of the file at `url`, downloaded once and reused while the object stays the
    same (see `Mirror.pull`: atomic, and one download however many processes ask at once)."""
    url = absolute(url)
    mirror = Mirror(parent(url), "files")
    if not mirror.pull([basename(url)]):
        with storage_errors(url, "read"):
            if mirror._fs.isdir(mirror.remote(basename(url))):
                raise TokenmillError(f"{url} is a directory, not a file")
        raise TokenmillError(f"cannot read {url}: not found")
    return mirror.local / basename(url)


def local_input(path: str | os.PathLike) -> Path:
    """A local path for an input that must be a local file: the path itself, or a cached copy."""
    return cached_file(str(path)) if is_url(path) else local_path(path)


def working_copy(path: str | os.PathLike, kind: str) -> Path:
    """Where work on the directory `path` happens on local disk: the directory itself, or for a
    URL its local copy in the cache (``$TOKENMILL_CACHE/<kind>/<hash of the URL>``), kept between
    runs so that a re-run resumes from it. `Mirror` moves files between the two."""
    return cache_dir_for(str(path), kind) if is_url(path) else local_path(path).resolve()


# ---- a local directory standing for a directory URL -----------------------------------------


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _md5_matches(local: Path, info: dict[str, Any]) -> bool:
    """True when the store's etag is the content's MD5 (a single-part S3 upload) and the local
    file has that MD5."""
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag) and _md5(local) == etag


class Mirror:
    """A local directory that stands for a directory URL, for work that must happen on local disk
    (a dedup index, a training run, a recipe's work directory): `pull` brings the remote files a
    command needs, the command works locally, and `push` publishes files back in the order the
    caller gives, so that the object a reader takes as the mark of completion (an index's
    ``index.json``, a checkpoint's ``meta.json`` and ``latest``, a step's state) is written last.

    The local copy lives in the cache (``$TOKENMILL_CACHE/<kind>/<hash of the URL>``); deleting it
    loses nothing that was pushed. Unchanged files are neither downloaded nor uploaded again."""

    def __init__(self, url: str, kind: str, local: Path | None = None) -> None:
        self.url = absolute(url)
        self.local = local or working_copy(self.url, kind)
        self.local.mkdir(parents=True, exist_ok=True)
        self._fs, self._inner = filesystem(self.url)
        self._inner = self._inner.rstrip("/")
        # Which object version each local file was downloaded from or uploaded as; in the cache,
        # beside (not in) the URL's directory there, so that it is never taken for one of its files.
        home = cache_dir_for(self.url, kind)
        self._stamps_path = home.with_name(f"{home.name}.versions.json")
        self._lock_path = home.with_name(f"{home.name}.lock")
        self._stamps: dict[str, Any] | None = None

    def _read_stamps(self) -> dict[str, Any]:
        from tokenmill.infra.atomic import read_json

        if self._stamps is None:
            self._stamps = read_json(self._stamps_path) or {}
        return self._stamps

    def _stamp(self, name: str, info: dict[str, Any]) -> list:
        """The object's version and size beside the local file's size and mtime."""
        stat = self.local_file(name).stat()
        return [_version(info), int(info.get("size") or 0), stat.st_size, stat.st_mtime_ns]

    def _save_stamps(self) -> None:
        """Written once per pull or push; a copy killed before it falls back to MD5 checks."""
        from tokenmill.infra.atomic import atomic_write_text

        self._stamps_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self._stamps_path, json.dumps(self._read_stamps()))

    def _unchanged(self, name: str, info: dict[str, Any]) -> bool:
        """True when the local file holds the object's bytes: it was last downloaded from or
        uploaded as this very version of the object and has not changed since, or (an object
        this copy has no record of) its MD5 is the object's etag."""
        local = self.local_file(name)
        if not local.is_file() or local.stat().st_size != int(info.get("size") or 0):
            return False
        return self._read_stamps().get(name) == self._stamp(name, info) or _md5_matches(local, info)

    def remote(self, name: str) -> str:
        if not name:
            return self._inner
        join_inside(self.url, name, f"{self.url}: file")  # a listed or indexed key stays under the URL
        return f"{self._inner}/{name}"

    def local_file(self, name: str) -> Path:
        """Where the remote file ``name`` (a key from a listing or an index) is kept locally,
        never outside the local copy."""
        return Path(join_inside(self.local, name, f"{self.url}: file"))

    def files(self, under: str = "") -> list[str]:
        """Names (relative to the URL) of the remote files under ``under``, hidden ones included."""
        with storage_errors(self.url, "list"):
            found = self._fs.find(self.remote(under))
        return sorted(name[len(self._inner) :].lstrip("/") for name in found)

    def pull(self, names: list[str]) -> list[str]:
        """Download the named files that are missing or differ locally (each atomically);
        returns the names that exist on the remote side."""
        present = []
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        # One download however many processes (training ranks) pull the same files at once.
        with open(self._lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stamps = None  # another process may have pulled meanwhile
            stamps = self._read_stamps()
            try:
                for name in names:
                    if self._pull_one(name, stamps):
                        present.append(name)
            finally:
                self._save_stamps()
        return present

    def _pull_one(self, name: str, stamps: dict[str, Any]) -> bool:
        """Download one file unless the local copy holds it; False when the URL has no such file."""
        from tokenmill.infra.atomic import atomic_path

        with storage_errors(f"{self.url}/{name}", "read"):
            try:
                info = self._fs.info(self.remote(name))
            except FileNotFoundError:
                return False
            if info.get("type") == "directory":
                return False
            if self._unchanged(name, info):
                return True
            target = self.local_file(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            log.info("downloading %s/%s", self.url, name)
            with atomic_path(target) as tmp:
                self._fs.get_file(self.remote(name), str(tmp))
                got, expected = tmp.stat().st_size, int(info.get("size") or 0)
                if got != expected:
                    raise TokenmillError(f"download of {self.url}/{name} is incomplete ({got} of {expected} bytes)")
            stamps[name] = self._stamp(name, info)
        return True

    def push(self, names: list[str], last: list[str] = ()) -> None:
        """Upload the named local files that differ on the remote side, then the ``last`` ones,
        in their order, each once its predecessors are complete."""
        stamps = self._read_stamps()
        try:
            for name in [*names, *last]:
                source = self.local_file(name)
                with storage_errors(f"{self.url}/{name}", "write"):
                    try:
                        info = self._fs.info(self.remote(name))
                    except FileNotFoundError:
                        info = None
                    if info is not None and name not in last and self._unchanged(name, info):
                        continue
                    self._fs.put_file(str(source), self.remote(name))
                    stamps[name] = self._stamp(name, self._fs.info(self.remote(name)))
        finally:
            self._save_stamps()

    def remove(self, name: str) -> None:
        """Remove a remote file or prefix (nothing there is not an error)."""
        remove(join_inside(self.url, name, f"{self.url}: file"))

    def read(self, name: str) -> bytes | None:
        """The bytes of a remote file, or None when there is none."""
        with storage_errors(f"{self.url}/{name}", "read"):
            try:
                return self._fs.cat_file(self.remote(name))
            except FileNotFoundError:
                return None
