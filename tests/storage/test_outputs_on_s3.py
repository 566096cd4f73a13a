"""Output ownership on object storage: a prefix that holds someone else's objects is refused,
and the lock beside an output is an object created by a conditional write."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tokenmill.curate.ingest import ingest
from tokenmill.curate.stage import STAGE_OUTPUT
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.outputs import claim_output


def test_a_remote_output_is_locked_by_a_conditional_write(bucket, tmp_path, s3_dask_client):
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(json.dumps({"text": f"document {i} with some words"}) for i in range(4)) + "\n")

    # A prefix holding a user's objects and no manifest: refused, the objects left.
    storage.write_text(f"{bucket}/userdir/notes.txt", "mine")
    with pytest.raises(TokenmillError, match=r"userdir exists and is not a stage directory \(it has no manifest"):
        ingest(raw, f"{bucket}/userdir", client=s3_dask_client, progress=False)
    assert storage.read_text(f"{bucket}/userdir/notes.txt") == "mine"

    out, lock = f"{bucket}/out", f"{bucket}/.out.lock"
    with claim_output(out, STAGE_OUTPUT, flag="--output"):
        holder = json.loads(storage.read_text(lock))
        assert holder["host"] == socket.gethostname() and "started" in holder
        # Held (here by the same process; another one is refused alike): refused, naming the holder.
        with pytest.raises(TokenmillError) as refused:
            ingest(raw, out, client=s3_dask_client, progress=False)
        assert str(refused.value).startswith(f"another tokenmill process (host {holder['host']}, pid {holder['pid']}")
        assert str(refused.value).endswith(f"(if that process is gone, delete {lock})")
        assert not storage.exists(f"{out}/manifest.json")
    assert not storage.exists(lock)  # released
    assert ingest(raw, out, client=s3_dask_client, progress=False)["counts"]["kept"] == 4
    assert not storage.exists(lock)

    # Left by a writer of another host: refused until deleted.
    storage.write_text(lock, json.dumps({"host": "elsewhere", "pid": 1, "started": 0}))
    with pytest.raises(TokenmillError, match=r"host elsewhere, pid 1, .*delete s3://.*/\.out\.lock\)$"):
        with claim_output(out, STAGE_OUTPUT, flag="--output"):
            pass
    # Left by a killed writer of this host (its pid has ended): taken over.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    storage.write_text(lock, json.dumps({"host": socket.gethostname(), "pid": int(ended.stdout), "started": 0}))
    with claim_output(out, STAGE_OUTPUT, flag="--output"):
        assert json.loads(storage.read_text(lock))["pid"] != int(ended.stdout)
    assert not storage.exists(lock)
