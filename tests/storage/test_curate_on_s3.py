"""Curation with inputs read from a bucket and every stage writing to one: JSONL, Parquet and
text inputs; ingest, normalize, filter, dedup, decontaminate; manifests written last, and an
interrupted publication that never looks finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenmill.curate.documents import read_documents
from tokenmill.curate.ingest import ingest
from tokenmill.curate.registry import recipe_stage
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import read_manifest, resolve_input_files


def _articles(shared_data: Path, limit: int) -> list[str]:
    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text(encoding="utf-8")
    import re

    return [a.strip() for a in re.split(r"\n(?= = [^=].* = \n)", text) if a.strip()][:limit]


def _upload_inputs(bucket: str, shared_data: Path, tmp_path: Path) -> dict[str, list[str]]:
    """A corpus in three formats on the bucket; returns the texts of each."""
    articles = _articles(shared_data, 24)
    jsonl = articles[:8] + [articles[0]]  # an exact duplicate for dedup to find
    lines = [json.dumps({"text": t}) for t in jsonl] + ["{not json"]
    storage.write_text(f"{bucket}/raw/wiki.jsonl", "\n".join(lines) + "\n")
    table = pa.table({"text": articles[8:16]})
    pq.write_table(table, tmp_path / "wiki.parquet")
    storage.upload(tmp_path / "wiki.parquet", f"{bucket}/raw/wiki.parquet")
    for i, text in enumerate(articles[16:24]):
        storage.write_text(f"{bucket}/raw/text/article-{i}.txt", text)
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20000]
    storage.write_text(f"{bucket}/raw/plays.txt", plays)
    return {"jsonl": jsonl, "parquet": articles[8:16], "text": articles[16:24]}


def _kept(stage_dir: str) -> pd.DataFrame:
    return pd.concat([read_documents(f) for f in resolve_input_files(stage_dir)], ignore_index=True)


def _check_manifest(stage_dir: str) -> dict:
    manifest = read_manifest(stage_dir)
    counts = manifest["counts"]
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    assert sum(len(read_documents(f)) for f in resolve_input_files(stage_dir)) == counts["kept"]
    for kind in ("tmp", "partial"):
        assert _temporaries(f"{storage.parent(stage_dir)}/.{storage.basename(stage_dir)}.{kind}-*") == []
    return manifest


def _temporaries(pattern: str) -> list[str]:
    fs, inner = storage.filesystem(pattern)
    return fs.glob(inner)


@pytest.mark.slow
def test_every_stage_reads_and_writes_a_bucket(bucket, shared_data, s3_dask_client, tmp_path) -> None:
    texts = _upload_inputs(bucket, shared_data, tmp_path)
    run = {"client": s3_dask_client, "progress": False}

    out = f"{bucket}/curate/ingest"
    manifest = ingest(
        [f"{bucket}/raw/wiki.jsonl", f"{bucket}/raw/wiki.parquet", f"{bucket}/raw/text"], out, source="wiki", **run
    )
    assert manifest["inputs"][0] == f"{bucket}/raw/wiki.jsonl"
    assert manifest["counts"] == {"in": 26, "kept": 25, "rejected": {"invalid_json": 1}}
    _check_manifest(out)
    kept = _kept(out)
    assert sorted(kept["text"]) == sorted(texts["jsonl"] + texts["parquet"] + texts["text"])
    # Ids name the file inside each input, as for local inputs.
    assert {"wiki:wiki.jsonl:0", "wiki:wiki.parquet:0", "wiki:text/article-0.txt"} <= set(kept["id"])
    rejected = pd.concat([read_documents(f) for f, _ in storage.list_files(f"{out}/rejected")])
    assert rejected["raw"].tolist() == ["{not json"]

    previous = out
    stages = [
        ("normalize", {"detokenize": "wikitext"}),
        ("filter", {}),
        ("dedup", {"method": "exact"}),
    ]
    for name, options in stages:
        kind = recipe_stage(name)
        target = f"{bucket}/curate/{name}"
        kind.execute(kind.recipe_options(options), previous, target, **run)
        manifest = _check_manifest(target)
        assert (
            manifest["upstream"]["counts"]["kept"]
            == manifest["counts"]["in"]
            == read_manifest(previous)["counts"]["kept"]
        )
        assert manifest["counts"]["kept"] > 10, (name, manifest["counts"])
        previous = target
    assert read_manifest(f"{bucket}/curate/dedup")["counts"]["rejected"].get("exact_duplicate", 0) >= 1

    # Decontaminate against an eval task that is itself on the bucket and quotes one article.
    quoted = " ".join(sorted(_kept(previous)["text"])[2].split()[:40])
    storage.write_text(f"{bucket}/eval/quotes.jsonl", json.dumps({"text": quoted}) + "\n")
    kind = recipe_stage("decontaminate")
    target = f"{bucket}/curate/decontaminate"
    kind.execute(kind.recipe_options({"tasks": [f"{bucket}/eval/quotes.jsonl"]}), previous, target, **run)
    manifest = _check_manifest(target)
    assert manifest["counts"]["rejected"] == {"contaminated:quotes": 1}


def test_ingest_reads_a_text_file_from_a_bucket_like_a_local_one(bucket, shared_data, s3_dask_client, tmp_path) -> None:
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_bytes()[:30000]
    (tmp_path / "plays.txt").write_bytes(plays)
    storage.write_bytes(f"{bucket}/plays.txt", plays)
    options = {"separator": "\n\n", "client": s3_dask_client, "progress": False}
    ingest(f"{bucket}/plays.txt", f"{bucket}/out", **options)
    ingest(tmp_path / "plays.txt", tmp_path / "out", **options)
    remote, local = _kept(f"{bucket}/out"), _kept(str(tmp_path / "out"))
    assert len(remote) > 50
    pd.testing.assert_frame_equal(remote, local)
    assert read_manifest(f"{bucket}/out")["counts"] == read_manifest(tmp_path / "out")["counts"]

    from tokenmill.curate.inspect import inspect_stage

    report, local_report = inspect_stage(f"{bucket}/out", samples=3), inspect_stage(tmp_path / "out", samples=3)
    assert report["kept_samples"] == local_report["kept_samples"] and len(report["kept_samples"]) == 3
    assert report["balanced"]


@pytest.mark.slow
def test_interrupted_publication_never_looks_finished(bucket, s3_dask_client, monkeypatch) -> None:
    storage.write_text(f"{bucket}/raw/a.jsonl", "\n".join(json.dumps({"text": f"document {i}"}) for i in range(5)))
    out = f"{bucket}/stage"
    run = {"client": s3_dask_client, "progress": False}
    ingest(f"{bucket}/raw/a.jsonl", out, **run)
    assert read_manifest(out)["counts"]["kept"] == 5

    # Killed after the new files were copied into place, before the manifest was written: the
    # writer's own cleanup does not run (a SIGKILL), so its partial prefix stays too.
    fs, _ = storage.filesystem(out)  # fsspec hands every caller in this process this instance
    real_pipe = fs.pipe_file

    def killed(path, *args, **kwargs):
        if path.endswith("/manifest.json"):
            raise RuntimeError("killed before the manifest")
        return real_pipe(path, *args, **kwargs)

    monkeypatch.setattr(fs, "pipe_file", killed)
    monkeypatch.setattr("tokenmill.curate.stage._discard_remote", lambda prefix: None)
    storage.write_text(f"{bucket}/raw/a.jsonl", "\n".join(json.dumps({"text": f"doc {i}"}) for i in range(7)))
    with pytest.raises(RuntimeError, match="killed"):
        ingest(f"{bucket}/raw/a.jsonl", out, **run)
    monkeypatch.undo()

    assert storage.exists(f"{out}/kept") and not storage.exists(f"{out}/manifest.json")
    with pytest.raises(TokenmillError, match="unfinished stage output"):
        resolve_input_files(out)
    with pytest.raises(TokenmillError, match="manifest.json is missing"):
        read_manifest(out)
    assert len(_temporaries(f"{bucket}/.stage.partial-*")) == 1

    # The re-run takes the partition the killed run recorded, publishes a complete output and
    # removes what the killed run left.
    ingest(f"{bucket}/raw/a.jsonl", out, **run)
    manifest = _check_manifest(out)
    assert manifest["counts"]["kept"] == 7 and manifest["resumed_partitions"] == 1
    assert sorted(_kept(out)["text"]) == [f"doc {i}" for i in range(7)]


N_PARTITIONS = 6


def _filter_command(source: str, output: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", "curate", "filter", "--input", source, "--output", output]


@pytest.mark.slow
def test_a_killed_stage_on_a_bucket_reruns_only_the_partitions_it_had_not_finished(bucket, shared_data, tmp_path):
    """`tokenmill curate filter` writing to a bucket, SIGKILLed (the command and its workers)
    after k of n partitions recorded their completion: the rerun runs the n - k others and
    publishes what an undisturbed run publishes."""
    lines = [line.strip() for line in (shared_data / "corpus" / "wikitext2_valid.txt").read_text().split("\n")]
    lines = [line for line in lines if line and not line.startswith("=")]
    per_part = 1500  # a partition that takes a moment to filter, so the kill lands between them
    for part in range(N_PARTITIONS):
        texts = [lines[(part * per_part + i) % len(lines)] for i in range(per_part)]
        ids = [f"p{part}-{i:05d}" for i in range(per_part)]
        pq.write_table(
            pa.table({"id": ids, "text": texts, "source": ["wiki"] * per_part}), tmp_path / f"part-{part}.parquet"
        )
        storage.upload(tmp_path / f"part-{part}.parquet", f"{bucket}/in/part-{part}.parquet")
    options = ["--workers", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}

    def run(output: str) -> subprocess.CompletedProcess:
        command = _filter_command(f"{bucket}/in", output) + options
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run(f"{bucket}/expected")
    output = f"{bucket}/out"
    process = subprocess.Popen(
        _filter_command(f"{bucket}/in", output) + options, env=env, start_new_session=True, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 300
        while not (records := _temporaries(f"{bucket}/.out.partial-*/.tasks/task-*.json")):
            assert process.poll() is None, process.communicate()[1]
            assert time.time() < deadline, "no partition finished"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finished = len(_temporaries(f"{bucket}/.out.partial-*/.tasks/task-*.json"))
    assert 0 < len(records) <= finished < N_PARTITIONS
    assert not storage.exists(f"{output}/manifest.json")

    rerun = run(output)
    assert f"resumed {finished} of {N_PARTITIONS} partitions" in rerun.stderr
    manifest = _check_manifest(output)
    expected = read_manifest(f"{bucket}/expected")
    assert manifest["resumed_partitions"] == finished
    assert manifest["counts"] == expected["counts"] and manifest["stats"] == expected["stats"]
    for sub in ("kept", "rejected"):
        names = sorted(relative for _, relative in storage.list_files(f"{output}/{sub}"))
        assert names == sorted(relative for _, relative in storage.list_files(f"{bucket}/expected/{sub}"))
    got, want = _kept(output), _kept(f"{bucket}/expected")
    assert sorted(got["id"]) == sorted(want["id"]) and sorted(got["text"]) == sorted(want["text"])
