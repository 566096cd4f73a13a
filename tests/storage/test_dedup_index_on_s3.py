"""A dedup index on a bucket: a second run against it rejects what the first run indexed, as
with a local index, and the bucket holds only what index.json names once a run is done."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from tokenmill.curate.dedup import DedupConfig, run_dedup
from tokenmill.curate.documents import read_documents, write_documents
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage

pytestmark = pytest.mark.slow


def _texts(shared_data) -> list[str]:
    text = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:60_000]
    return [p.strip() for p in text.split("\n\n") if len(p.strip()) > 80][:30]


def _kept_and_rejected(out: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read(folder: str) -> pd.DataFrame:
        files = [f for f, _ in storage.list_files(f"{out}/{folder}")]
        return pd.concat([read_documents(f) for f in files]) if files else pd.DataFrame(columns=["id", "kept_id"])

    return read("kept"), read("rejected")


def test_a_second_run_rejects_what_the_first_indexed(bucket, shared_data, s3_dask_client) -> None:
    texts = list(dict.fromkeys(_texts(shared_data)))
    assert len(texts) >= 20
    index = f"{bucket}/dedup-index"
    config = DedupConfig(method="exact", normalize="lower", index=index)
    run = {"client": s3_dask_client, "progress": False}

    old = pd.DataFrame({"id": [f"old{i}" for i in range(15)], "text": texts[:15], "source": "old"})
    write_documents(old, f"{bucket}/old/part-0.parquet")
    run_dedup(f"{bucket}/old", f"{bucket}/old_out", config, **run)
    meta = json.loads(storage.read_text(f"{index}/index.json"))
    assert meta["documents"] == 15 and meta["files"] == ["hashes/part-00000.parquet"]
    assert {p for _, p in storage.list_files(index)} == {"index.json", "hashes/part-00000.parquet"}

    # A fresh machine: no local copy of the index.
    shutil.rmtree(storage.cache_dir_for(index, "index"))
    new = pd.DataFrame(
        {
            "id": ["n0", "n1", "n2", "n3"],
            "text": [texts[2].upper(), texts[20], texts[20], texts[7]],
            "source": "new",
        }
    )
    write_documents(new, f"{bucket}/new/part-0.parquet")
    manifest = run_dedup(f"{bucket}/new", f"{bucket}/new_out", config, **run)
    kept, rejected = _kept_and_rejected(f"{bucket}/new_out")
    assert manifest["dedup"]["index_documents"] == 15
    assert dict(zip(rejected["id"], rejected["kept_id"])) == {"n0": "old2", "n2": "n1", "n3": "old7"}
    assert set(kept["id"]) == {"n1"}
    meta = json.loads(storage.read_text(f"{index}/index.json"))
    assert meta["documents"] == 16
    assert meta["files"] == ["hashes/part-00000.parquet", "hashes/part-00001.parquet"]

    # The same index queried from a local copy gives the same decisions as from the bucket.
    local = storage.cache_dir_for(index, "index")
    assert json.loads((local / "index.json").read_text()) == meta

    # A prefix that is not an index is refused, as a local directory is.
    storage.write_text(f"{bucket}/not-an-index/x.txt", "x")
    with pytest.raises(TokenmillError, match="is not a dedup index"):
        run_dedup(
            f"{bucket}/new", f"{bucket}/x_out", DedupConfig(method="exact", index=f"{bucket}/not-an-index"), **run
        )


def test_an_index_naming_files_outside_itself_is_refused(bucket, shared_data, tmp_path, capsys) -> None:
    """index.json is data: a file it names with `..` (or an absolute path) is refused in one line
    before anything is downloaded, and nothing is written outside the index's local copy."""
    import s3fs

    from tokenmill.cli import main

    index = f"{bucket}/dedup-index"
    docs = pd.DataFrame({"id": ["a", "b"], "text": _texts(shared_data)[:2], "source": "s"})
    write_documents(docs, f"{bucket}/docs/part-0.parquet")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    escape = "../../escaped.parquet"
    fs.pipe_file(f"{index[5:]}/{escape}", b"planted")  # the object such a key names, were it fetched
    meta = {"files": [escape], "documents": 1, "params": DedupConfig(method="exact", index=index).index_signature()}
    fs.pipe_file(f"{index[5:]}/index.json", json.dumps(meta).encode())
    local = storage.cache_dir_for(index, "index")
    argv = ["curate", "dedup", "--input", f"{bucket}/docs", "--output", str(tmp_path / "out"), "--method", "exact"]
    assert main([*argv, "--index", index, "--no-progress"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tokenmill:")]
    assert len(lines) == 1 and lines[0].startswith(f"tokenmill: error: {index}: file '{escape}'"), err
    assert f"is not a relative path inside {index}" in lines[0] and "Traceback" not in err
    assert not (local / escape).resolve().exists() and not (local.parent / "escaped.parquet").exists()
