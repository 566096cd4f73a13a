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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the server's access log is not the command's output
        pass


@pytest.fixture
def web_root(tmp_path: Path):
    root = tmp_path / "site"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
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


SECRETS = ("AKIDEXAMPLE", "c0ffee5ignature", "SESSIONT0KEN", "hunter2")


def presigned(base: str, name: str, signed_at: str) -> str:
    """A URL as S3 presigns it (SigV4), with a user:password in its address too."""
    host = base.removeprefix("http://")
    return (
        f"http://reader:hunter2@{host}/{name}?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential=AKIDEXAMPLE%2F{signed_at[:8]}%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={signed_at}"
        f"&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=SESSIONT0KEN"
        f"&X-Amz-Signature=c0ffee5ignature{signed_at}"
    )


def test_a_presigned_url_leaves_no_credential_in_what_is_stored_or_printed(web_root, tmp_path: Path, capsys) -> None:
    """Ingest of a presigned URL: the manifest, the documents' ids and sources and every message
    hold the URL without its credentials, and the same object signed again gets the same ids."""
    from tokenmill.cli import main

    root, base = web_root
    lines = [json.dumps({"text": f"document {i}"}) for i in range(5)]
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n")
    (root / "blank.jsonl").write_text("\n\n")  # rejected as empty_file, with a reason naming the URL
    ids = []
    for signed_at in ("20240101T000000Z", "20240202T000000Z"):
        out = tmp_path / f"out-{signed_at}"
        inputs = [presigned(base, name, signed_at) for name in ("docs.jsonl", "blank.jsonl")]
        argv = ["curate", "ingest", "--input", *inputs, "--output", str(out)]
        assert main([*argv, "--workers", "1", "--no-progress"]) == 0
        manifest = read_manifest(out)
        assert manifest["inputs"] == [f"{base}/docs.jsonl", f"{base}/blank.jsonl"]
        assert manifest["counts"]["rejected"] == {"empty_file": 1}
        kept = read_documents(resolve_input_files(out)[0])
        assert set(kept["source"]) == {"docs.jsonl"} and kept["id"].iloc[1] == f"docs.jsonl:{len(lines[0]) + 1}"
        ids.append(list(kept["id"]))
        stored = b"".join(path.read_bytes() for path in out.rglob("*") if path.is_file())
        printed = capsys.readouterr()
        for secret in SECRETS:
            assert secret.encode() not in stored and secret not in printed.out + printed.err, secret
    assert ids[0] == ids[1]

    missing = presigned(base, "missing.jsonl", "20240303T000000Z")
    assert main(["curate", "ingest", "--input", missing, "--output", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"tokenmill: error: input not found: {base}/missing.jsonl"


SIGNED = presigned("http://127.0.0.1:9", "docs.jsonl", "20240101T000000Z")
SIGNED_REDACTED = "http://127.0.0.1:9/docs.jsonl"  # every query parameter of it is X-Amz-*


def assert_redacted(text: str) -> None:
    assert SIGNED_REDACTED in text, text
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def test_debug_tracebacks_name_urls_without_their_credentials(monkeypatch, capsys) -> None:
    """--debug's traceback behind an error's line, and the traceback of a bug, which the
    interpreter prints: an exception's message, or the one it was raised from, may hold the URL
    as given, credentials and all."""
    import sys

    import tokenmill.curate.cli as curate_cli
    from tokenmill.cli import main
    from tokenmill.errors import TokenmillError

    def denied(args):
        try:
            raise PermissionError(f"403 Forbidden: {SIGNED}")
        except PermissionError as error:
            raise TokenmillError("cannot read the input") from error

    monkeypatch.setattr(curate_cli, "_inspect_command", denied)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # main() installs its own
    monkeypatch.setenv("TOKENMILL_DEBUG", "0")  # --debug sets it, for the processes a command starts
    assert main(["--debug", "inspect", "stage"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "PermissionError: 403 Forbidden" in err
    assert err.strip().splitlines()[-1] == "tokenmill: error: cannot read the input"
    assert_redacted(err)

    def bug(args):
        raise ValueError(f"unexpected answer from {SIGNED}")

    monkeypatch.setattr(curate_cli, "_inspect_command", bug)
    with pytest.raises(ValueError) as raised:
        main(["inspect", "stage"])
    sys.excepthook(raised.type, raised.value, raised.tb)  # what the interpreter does with it
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: unexpected answer from" in err
    assert_redacted(err)


def log_a_failed_read() -> str:
    """What a Dask worker prints when it logs a task that failed reading a signed URL (the
    message and the traceback), as its own handler prints it."""
    import io
    import logging

    printed = io.StringIO()
    handler = logging.StreamHandler(printed)
    logger = logging.getLogger("distributed.worker")
    logger.addHandler(handler)
    # An interrupted command quiets Dask's loggers in its process; a test session runs many.
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        raise OSError(f"cannot read {SIGNED}")
    except OSError:
        logger.exception("Compute Failed, reading %s", SIGNED)
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)
    return printed.getvalue()


def test_dask_workers_and_the_command_log_urls_without_their_credentials(dask_client, monkeypatch) -> None:
    """Every worker of the command's cluster, and the command's process (where a LocalCluster's
    nannies log), whatever the logger."""
    import sys

    from tokenmill.entry import take_debug_flag

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    take_debug_flag([])  # as the command starts
    printed = [*dask_client.run(log_a_failed_read).values(), log_a_failed_read()]
    assert len(printed) == 3  # two workers and this process
    for text in printed:
        assert "Compute Failed, reading" in text and "OSError: cannot read" in text
        assert_redacted(text)
