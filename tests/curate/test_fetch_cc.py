"""fetch-cc against a real HTTP server started here, serving the shared WARCs under Common Crawl's
path layout: resume after a dropped connection, nothing partial under a final name, clear errors,
and the fetched crawl ingested."""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tokenmill.curate import fetch
from tokenmill.curate.fetch import fetch_cc
from tokenmill.curate.ingest import ingest
from tokenmill.errors import TokenmillError

SNAPSHOT = "CC-MAIN-2020-34"
SEGMENT = f"crawl-data/{SNAPSHOT}/segments/1596439735792.85"
WARCS = {
    f"{SEGMENT}/warc/CC-MAIN-20200803-00000.warc.gz": "cc-main-2020-34-sample.warc.gz",
    f"{SEGMENT}/warc/CC-MAIN-20200803-00001.warc.gz": "wget-sample-0000.warc.gz",
    f"{SEGMENT}/warc/CC-MAIN-20200803-00002.warc.gz": "wget-sample-0001.warc.gz",
}
WETS = {f"{SEGMENT}/wet/CC-MAIN-20200803-00000.warc.wet.gz": "whirlwind.warc.wet.gz"}
CHUNK = 32 * 1024


class CrawlServer(ThreadingHTTPServer):
    """Serves a directory with HEAD, GET and Range; can drop a file's connection mid-body once."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.drop_once: set[str] = set()  # paths whose next ranged GET after the start is cut short
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Handler(BaseHTTPRequestHandler):
    server: CrawlServer

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def _file(self) -> Path | None:
        path = self.server.root / self.path.lstrip("/")
        return path if path.is_file() else None

    def do_HEAD(self) -> None:
        self.server.requests.append(("HEAD", self.path, None))
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        ranged = self.headers.get("Range")
        self.server.requests.append(("GET", self.path, ranged))
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        start, end = 0, len(data)
        if ranged:
            first, last = ranged.removeprefix("bytes=").split("-")
            start, end = int(first), min(int(last) + 1 if last else len(data), len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:end]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        key = self.path.lstrip("/")
        if key in self.server.drop_once and start > 0:
            self.server.drop_once.discard(key)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the connection dies mid-body
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def crawl(shared_data, tmp_path, monkeypatch):
    """A local Common Crawl: the shared files under crawl-data/, with warc.paths.gz and wet.paths.gz."""
    root = tmp_path / "server"
    warc_dir = shared_data / "web" / "warc"
    for listing, files in (("warc", WARCS), ("wet", WETS)):
        for path, name in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(warc_dir / name, root / path)
        (root / f"crawl-data/{SNAPSHOT}/{listing}.paths.gz").write_bytes(gzip.compress("\n".join(files).encode()))
    monkeypatch.setattr(fetch, "CHUNK_BYTES", CHUNK)  # several ranges per file
    server = CrawlServer(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_dropped_connection_resumes_and_nothing_partial_is_kept(crawl, tmp_path):
    out = tmp_path / "cc"
    first = next(iter(WARCS))
    crawl.drop_once.add(first)
    with pytest.raises(TokenmillError, match=r"downloading .*CC-MAIN-20200803-00000\.warc\.gz \(bytes 32768-"):
        fetch_cc(SNAPSHOT, 2, out, base_url=crawl.url, retries=0, progress=False)
    part = out / (first + ".part")
    assert not (out / first).exists()  # never under its final name while incomplete
    assert part.stat().st_size == CHUNK  # the bytes of the completed range, nothing of the cut one
    assert not list(out.rglob("*.warc.gz"))

    crawl.requests.clear()
    result = fetch_cc(SNAPSHOT, 2, out, base_url=crawl.url, retries=0, progress=False)
    assert (result["downloaded"], result["resumed"], result["skipped"]) == (1, 1, 0)
    ranges = [r for m, p, r in crawl.requests if m == "GET" and p == "/" + first]
    assert ranges[0] == f"bytes={CHUNK}-{2 * CHUNK - 1}"  # resumed where the part file ended
    for path in list(WARCS)[:2]:
        assert (out / path).read_bytes() == (crawl.root / path).read_bytes()
    assert not list(out.rglob("*.part"))

    # A rerun with more segments skips the finished files and fetches only the new one.
    crawl.requests.clear()
    result = fetch_cc(SNAPSHOT, 5, out, base_url=crawl.url, progress=False)
    assert (result["downloaded"], result["resumed"], result["skipped"]) == (1, 0, 2)
    assert len(result["files"]) == 3
    assert {p for m, p, _ in crawl.requests if m == "GET"} == {
        f"/crawl-data/{SNAPSHOT}/warc.paths.gz",
        "/" + list(WARCS)[2],
    }

    manifest = ingest(out, tmp_path / "ingested", workers=1, progress=False)
    assert manifest["counts"] == {"in": 16 + 22 + 15, "kept": 16 + 22 + 15, "rejected": {}}


def test_transient_errors_are_retried_within_a_run(crawl, tmp_path):
    result = fetch_cc(SNAPSHOT, 1, tmp_path / "cc", kind="wet", base_url=crawl.url, progress=False)
    wet = next(iter(WETS))
    assert result["files"] == [str(tmp_path / "cc" / wet)]
    assert (tmp_path / "cc" / wet).read_bytes() == (crawl.root / wet).read_bytes()
    crawl.drop_once.add(next(iter(WARCS)))
    result = fetch_cc(SNAPSHOT, 1, tmp_path / "cc", base_url=crawl.url, retry_wait=0, progress=False)
    assert result["retries"] == 1 and result["downloaded"] == 1
    path = next(iter(WARCS))
    assert (tmp_path / "cc" / path).read_bytes() == (crawl.root / path).read_bytes()


def test_clear_errors(crawl, tmp_path):
    with pytest.raises(TokenmillError, match="snapshot CC-MAIN-1999-01 not found"):
        fetch_cc("CC-MAIN-1999-01", 1, tmp_path / "cc", base_url=crawl.url, progress=False)
    with pytest.raises(TokenmillError, match="not a crawl name"):
        fetch_cc("2020-34", 1, tmp_path / "cc", base_url=crawl.url, progress=False)
    (crawl.root / next(iter(WARCS))).unlink()
    with pytest.raises(TokenmillError, match=r"00000\.warc\.gz not found \(HTTP 404\)"):
        fetch_cc(SNAPSHOT, 1, tmp_path / "cc", base_url=crawl.url, progress=False)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "curate", "fetch-cc", "--snapshot", SNAPSHOT, "--segments", "1"]
        + ["--output", str(tmp_path / "cc"), "--base-url", f"http://127.0.0.1:{port}/", "--retries", "1"]
        + ["--retry-wait", "0", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "failed after 2 attempts" in done.stderr and "Cannot connect" in done.stderr
    assert not (tmp_path / "cc").exists() or not list((tmp_path / "cc").rglob("*.warc.gz"))


@pytest.fixture
def s3_crawl(shared_data, monkeypatch):
    """The same crawl layout in a bucket of a local S3 server (moto), as s3://commoncrawl/."""
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep another endpoint
    client = boto3.client("s3")
    client.create_bucket(Bucket="commoncrawl")
    for path, name in WARCS.items():
        client.put_object(Bucket="commoncrawl", Key=path, Body=(shared_data / "web" / "warc" / name).read_bytes())
    client.put_object(
        Bucket="commoncrawl", Key=f"crawl-data/{SNAPSHOT}/warc.paths.gz", Body=gzip.compress("\n".join(WARCS).encode())
    )
    yield "s3://commoncrawl/"
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def test_fetch_from_s3_resumes_a_partial_file(s3_crawl, shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "CHUNK_BYTES", CHUNK)
    out = tmp_path / "cc"
    first, source = next(iter(WARCS.items()))
    expected = (shared_data / "web" / "warc" / source).read_bytes()
    (out / first).parent.mkdir(parents=True)
    (out / (first + ".part")).write_bytes(expected[:50_000])  # left by an interrupted run
    result = fetch_cc(SNAPSHOT, 2, out, base_url=s3_crawl, retries=0, progress=False)
    assert (result["downloaded"], result["resumed"]) == (1, 1)
    assert (out / first).read_bytes() == expected
    assert not list(out.rglob("*.part"))
    with pytest.raises(TokenmillError, match="snapshot CC-MAIN-2019-01 not found"):
        fetch_cc("CC-MAIN-2019-01", 1, out, base_url=s3_crawl, retries=0, progress=False)


@pytest.mark.parametrize("escape", ["../escaped.warc.gz", "crawl-data/../../escaped.warc.gz", "/{tmp}/escaped.warc.gz"])
def test_a_path_list_naming_a_file_outside_the_output_is_refused(crawl, tmp_path, capsys, escape):
    """The crawl's list is data: a path in it that is absolute or climbs out with `..` is refused
    in one line before anything is downloaded, and nothing is written outside --output."""
    from tokenmill.cli import main

    escape = escape.format(tmp=str(tmp_path).strip("/"))
    (crawl.root / "escaped.warc.gz").write_bytes(b"not from the crawl")  # what a client would fetch
    listing = crawl.root / f"crawl-data/{SNAPSHOT}/warc.paths.gz"
    listing.write_bytes(gzip.compress(f"{next(iter(WARCS))}\n{escape}\n".encode()))
    out = tmp_path / "out" / "cc"
    argv = ["curate", "fetch-cc", "--snapshot", SNAPSHOT, "--segments", "2", "--output", str(out)]
    assert main([*argv, "--base-url", crawl.url, "--retries", "0", "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenmill: error: the path in ") and repr(escape) in lines[0]
    assert "is not a relative path inside" in lines[0]
    assert not (tmp_path / "escaped.warc.gz").exists() and not (tmp_path / "out" / "escaped.warc.gz").exists()
    assert not out.exists()  # refused before the first download
