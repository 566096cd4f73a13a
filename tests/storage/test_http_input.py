"""Inputs over HTTP(S): ingest reads a JSONL file and a gzip-compressed one from a real local
web server, byte offsets and all, as it reads local files."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import threading
from pathlib import Path

import pytest

from tokenmill.curate.documents import read_documents
from tokenmill.curate.ingest import ingest
from tokenmill.infra.document_dirs import read_manifest, resolve_input_files


@pytest.fixture
def web_root(tmp_path: Path):
    root = tmp_path / "site"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.slow
def test_ingest_reads_files_over_http(web_root, s3_dask_client, tmp_path: Path) -> None:
    root, base = web_root
    lines = [json.dumps({"text": f"web document number {i}"}) for i in range(40)] + ["not json"]
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n")
    (root / "more.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines[:5]) + "\n").encode()))
    out = tmp_path / "out"
    manifest = ingest([f"{base}/docs.jsonl", f"{base}/more.jsonl.gz"], out, client=s3_dask_client, progress=False)
    assert manifest["counts"] == {"in": 46, "kept": 45, "rejected": {"invalid_json": 1}}
    assert manifest["inputs"] == [f"{base}/docs.jsonl", f"{base}/more.jsonl.gz"]
    kept = read_documents(resolve_input_files(out)[0])
    assert kept["id"].iloc[1] == f"docs.jsonl:{len(lines[0]) + 1}"  # byte offsets, as for a local file
    assert read_manifest(out)["counts"]["kept"] == 45
