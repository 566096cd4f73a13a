"""fetch-cc: download the first files of a Common Crawl snapshot, resumably.

A snapshot lists its files in `crawl-data/<snapshot>/<kind>.paths.gz` (one path per line, in
the crawl's order). The first N are downloaded under `--output` with the same layout, so the
output directory mirrors the crawl and `tokenmill curate ingest --input OUTPUT` reads it.

Each file is fetched in ranges into `NAME.part` and renamed to `NAME` only once it holds exactly
the length the server announced, so a file under its final name is always complete. A rerun
skips finished files, continues a `.part` file from where it stopped (a Range request), and
retries transient errors (dropped connections, timeouts, 5xx) with backoff.

Any fsspec URL is a base: `https://` (fsspec's HTTP filesystem, on aiohttp, which sends the
Range requests), `s3://commoncrawl/` (with s3fs installed), or a local directory.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenmill.curate.registry import Stage, option
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://data.commoncrawl.org/"
KINDS = ("warc", "wet")
SNAPSHOT = re.compile(r"^CC-MAIN-\d{4}-\d{2}$")
# Bytes per range request: bounds memory and the work a dropped connection loses.
CHUNK_BYTES = 8 * 1024 * 1024
PART_SUFFIX = ".part"


@dataclass
class FetchOptions:
    """Which files of which crawl, and where to put them."""

    snapshot: str = option(cli={"required": True}, help="crawl name, e.g. CC-MAIN-2024-22")
    segments: int = option(cli={"required": True}, help="download the first N files of the crawl's list")
    output: str = option(cli={"required": True}, help="directory to download into (the crawl's path layout is kept)")
    kind: str = option("warc", cli={"choices": KINDS}, help="warc (HTML responses) or wet (extracted text)")
    base_url: str = option(
        DEFAULT_BASE_URL, help=f"where the crawl is served: https://..., s3://commoncrawl/ (default {DEFAULT_BASE_URL})"
    )
    retries: int = option(5, help="attempts after a transient error (dropped connection, timeout, 5xx) per file")
    retry_wait: float = option(1.0, help="seconds before the first retry; doubles each time (default 1)")
    progress: bool = option(True, flag="--no-progress", help="hide the progress bar")


def _filesystem(base_url: str) -> tuple[Any, str]:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(base_url)
    except (ImportError, ValueError) as error:
        raise TokenmillError(f"cannot open --base-url {base_url}: {error}") from None
    return fs, base_url.rstrip("/") if "://" in base_url else root.rstrip("/")


def _classify(error: BaseException) -> str:
    """'missing', 'fatal' or 'transient'."""
    import asyncio  # a tenth of a second of CPU that `tokenmill --help` need not pay

    if isinstance(error, FileNotFoundError):
        return "missing"
    status = getattr(error, "status", None) or getattr(error, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return "fatal"
    if "Credentials" in type(error).__name__ or isinstance(error, PermissionError):
        return "fatal"  # botocore's NoCredentialsError: waiting does not bring credentials
    if isinstance(error, (OSError, asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return "transient"
    module = type(error).__module__ or ""
    # aiohttp's and fsspec's own error types (a reset, a payload cut short, a timeout).
    if module.startswith(("aiohttp", "fsspec", "botocore", "s3fs")):
        return "transient"
    return "fatal"


class _Fetcher:
    def __init__(self, options: FetchOptions) -> None:
        self.options = options
        self.fs, self.base = _filesystem(options.base_url)
        self.retries = 0

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def attempt(self, what: str, fn: Any, *args: Any) -> Any:
        """fn(*args), retried on transient errors; a one-line TokenmillError when it gives up."""
        wait = self.options.retry_wait
        for attempt in range(self.options.retries + 1):
            try:
                return fn(*args)
            except Exception as error:
                kind = _classify(error)
                if kind == "missing":
                    raise
                detail = f"{type(error).__name__}: {error}".strip().rstrip(":")
                if kind == "fatal" or attempt == self.options.retries:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise TokenmillError(f"{what} failed{tries}: {detail}") from None
                self.retries += 1
                log.warning("%s: %s; retrying in %.1fs", what, detail, wait)
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")

    def size(self, path: str) -> int:
        info = self.attempt(f"asking the size of {self.url(path)}", self.fs.info, self.url(path))
        size = info.get("size")
        if size is None:
            raise TokenmillError(f"{self.url(path)} has no Content-Length; it cannot be downloaded safely")
        return int(size)

    @property
    def listing(self) -> str:
        """The crawl's list of paths, relative to the base URL."""
        return f"crawl-data/{self.options.snapshot}/{self.options.kind}.paths.gz"

    def paths(self) -> list[str]:
        snapshot = self.options.snapshot
        listing = self.listing
        try:
            data = self.attempt(f"reading {self.url(listing)}", self.fs.cat_file, self.url(listing))
        except FileNotFoundError:
            raise TokenmillError(
                f"snapshot {snapshot} not found: {self.url(listing)} does not exist (names are listed at"
                " https://commoncrawl.org/overview)"
            ) from None
        try:
            lines = gzip.decompress(data).decode("utf-8").splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as error:
            raise TokenmillError(f"{self.url(listing)} is not a gzipped list of paths: {error}") from None
        return [line.strip() for line in lines if line.strip()]

    def download(self, path: str, target: Path, size: int, bar: Any) -> str:
        """'skipped', 'resumed' or 'downloaded'."""
        if target.exists():
            if target.stat().st_size == size:
                bar.update(size)
                return "skipped"
            raise TokenmillError(
                f"{target} exists with {target.stat().st_size} bytes but {self.url(path)} has {size}; remove it"
            )
        part = target.with_name(target.name + PART_SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.exists() else 0
        if offset > size:
            log.warning("%s is longer than the remote file; starting it again", part)
            part.unlink()
            offset = 0
        status = "resumed" if offset else "downloaded"
        bar.update(offset)
        url = self.url(path)
        with open(part, "ab") as out:
            while offset < size:
                end = min(offset + CHUNK_BYTES, size)
                try:
                    data = self.attempt(f"downloading {url} (bytes {offset}-{end - 1})", self._range, url, offset, end)
                except FileNotFoundError:
                    raise TokenmillError(f"{url} not found (HTTP 404), though the crawl's list names it") from None
                if len(data) == size and offset > 0:
                    data = data[offset:]  # a server that ignores Range sends the whole file
                elif len(data) > end - offset:
                    raise TokenmillError(f"{url}: asked for {end - offset} bytes at {offset}, got {len(data)}")
                out.write(data)
                out.flush()
                offset += len(data)
                bar.update(len(data))
            out.flush()
            os.fsync(out.fileno())
        if part.stat().st_size != size:
            raise TokenmillError(f"{url}: downloaded {part.stat().st_size} bytes, the server announced {size}")
        os.replace(part, target)
        return status

    def _range(self, url: str, start: int, end: int) -> bytes:
        data = self.fs.cat_file(url, start=start, end=end)
        if not data:
            raise ConnectionError(f"no bytes at offset {start}")  # transient: try again
        return data


def fetch_cc(
    snapshot: str,
    segments: int,
    output: str | Path,
    *,
    kind: str = "warc",
    base_url: str = DEFAULT_BASE_URL,
    retries: int = 5,
    retry_wait: float = 1.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Download the first `segments` files of a crawl under `output`; returns what was done."""
    from tokenmill.progress import progress_bar

    if not SNAPSHOT.match(snapshot):
        raise TokenmillError(f"--snapshot {snapshot!r} is not a crawl name like CC-MAIN-2024-22")
    if kind not in KINDS:
        raise TokenmillError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if segments < 1:
        raise TokenmillError(f"--segments must be at least 1, got {segments}")
    if retries < 0 or retry_wait < 0:
        raise TokenmillError("--retries and --retry-wait must be >= 0")
    options = FetchOptions(snapshot, segments, str(output), kind, base_url, retries, retry_wait, progress)
    fetcher = _Fetcher(options)
    started = time.time()
    paths = fetcher.paths()
    if not paths:
        raise TokenmillError(f"the {kind} list of {snapshot} is empty")
    chosen = paths[:segments]
    if len(chosen) < segments:
        log.warning("%s lists only %d %s files", snapshot, len(chosen), kind)
    root = Path(output)
    # The list is data: none of its paths may place a file outside --output.
    where = f"the path in {fetcher.url(fetcher.listing)}"
    targets = [Path(storage.join_inside(root, path, where)) for path in chosen]
    sizes = []
    for path in chosen:
        try:
            sizes.append(fetcher.size(path))
        except FileNotFoundError:
            raise TokenmillError(
                f"{fetcher.url(path)} not found (HTTP 404), though the crawl's list names it"
            ) from None
    done: dict[str, int] = {"downloaded": 0, "resumed": 0, "skipped": 0}
    with progress_bar(total=sum(sizes), desc=f"fetch {snapshot}", unit="B", unit_scale=True, enabled=progress) as bar:
        for path, target, size in zip(chosen, targets, sizes):
            done[fetcher.download(path, target, size, bar)] += 1
    return {
        "snapshot": snapshot,
        "kind": kind,
        "base_url": base_url,
        "output": str(root),
        "files": [str(target) for target in targets],
        "bytes": sum(sizes),
        **done,
        "retries": fetcher.retries,
        "seconds": round(time.time() - started, 3),
    }


def _run(options: FetchOptions) -> dict[str, Any]:
    return fetch_cc(**asdict(options))


def _report(result: dict[str, Any], args: Any) -> None:
    log.info(
        f"fetch-cc: {len(result['files'])} {result['kind']} files of {result['snapshot']} ({result['bytes']} bytes):"
        f" {result['downloaded']} downloaded, {result['resumed']} resumed, {result['skipped']} already there,"
        f" {result['retries']} retries in {result['seconds']:.1f}s -> {result['output']}"
    )


STAGES = (
    Stage(
        "fetch-cc",
        FetchOptions,
        run=_run,
        io="none",
        in_recipes=False,
        report=_report,
        help="download the first N WARC or WET files of a Common Crawl snapshot (resumable)",
        description="Download the first --segments files listed in crawl-data/SNAPSHOT/KIND.paths.gz under --output,"
        " keeping the crawl's paths. A file appears under its name only when complete; a rerun skips finished files"
        " and resumes partial ones. Read the result with `tokenmill curate ingest --input OUTPUT`.",
    ),
)
