"""A Dask worker killed with SIGKILL in the middle of a stage: the scheduler runs its tasks again
on the other worker (and a replacement joins), the stage finishes, and its output equals an
undisturbed run's: no partition lost, none written twice."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from dask_processes import (
    assert_same_stage,
    cluster,
    read_sorted,
    tokenmill,
    write_partitions,
    write_web_like_corpus,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture
def dask_processes(tmp_path):
    processes = cluster(tmp_path / "dask", workers=2)
    yield processes
    processes.close()


def executing_on(client, address: str) -> list[str]:
    """Keys of the tasks the worker at `address` is running right now."""

    def keys(dask_worker) -> list[str]:
        return [str(ts.key) for ts in dask_worker.state.executing]

    try:
        return client.run(keys, workers=[address])[address]
    except Exception:
        return []


def run_killing_a_worker(processes, argv: list[str], ready: Callable[[list[str]], bool]) -> list[str]:
    """Run `tokenmill ARGV --scheduler ...` in a thread; SIGKILL the first worker as soon as
    `ready(keys it is executing)` holds, then add a replacement worker. Returns the keys the
    killed worker was running."""
    from distributed import Client

    victim = processes.workers[0]
    address = processes.worker_address(0)
    errors: list[BaseException] = []

    def stage() -> None:
        try:
            tokenmill(*argv, "--scheduler", processes.address)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=stage)
    thread.start()
    killed_during: list[str] = []
    with Client(processes.address, timeout="30s") as client:
        deadline = time.time() + 300
        while thread.is_alive() and time.time() < deadline:
            keys = executing_on(client, address)
            if ready(keys):
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                killed_during = keys
                break
            time.sleep(0.02)
    processes.add_worker()
    thread.join(timeout=600)
    assert not thread.is_alive(), "the stage did not finish after the worker was killed"
    assert not errors, errors
    assert killed_during, "the worker was not killed in the middle of the stage"
    return killed_during


def contamination_task(source: Path, path: Path, every: int = 50) -> Path:
    """An eval task file whose texts are every `every`-th document of partition 0: the
    decontaminate stage then rejects some documents of every partition that repeats them."""
    texts = pd.read_parquet(source / "part-0.parquet")["text"].tolist()[::every]
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts if len(text.split()) >= 13))
    return path


@pytest.mark.parametrize("stage", ["filter", "langid", "decontaminate"])
def test_document_stage_survives_a_killed_worker(tmp_path, shared_data, dask_processes, stage):
    source = write_partitions(shared_data, tmp_path / "in", n=6, docs=1500)
    options = {
        "filter": [],
        "langid": ["--languages", "en"],
        "decontaminate": ["--task", str(contamination_task(source, tmp_path / "task.jsonl"))],
    }[stage]
    expected, output = tmp_path / "expected", tmp_path / "out"
    tokenmill("curate", stage, "--input", str(source), "--output", str(expected), "--workers", "2", *options)
    killed = run_killing_a_worker(
        dask_processes,
        ["curate", stage, "--input", str(source), "--output", str(output), *options],
        lambda keys: any(key.startswith(f"{stage}-") for key in keys),
    )
    assert any(key.startswith(f"{stage}-") for key in killed)
    manifest = assert_same_stage(output, expected)
    assert manifest["counts"]["in"] == 6 * 1500
    assert manifest["counts"]["kept"] > 0 and sum(manifest["counts"]["rejected"].values()) > 0
    assert read_sorted(output / "kept")["id"].is_unique


@pytest.mark.parametrize(
    ("method", "options", "first", "shuffled", "reason"),
    [
        ("fuzzy", ["--threshold", "0.7", "--verify"], "signatures", "candidates", "near_duplicate"),
        ("exact", ["--method", "exact"], "hashes", "decisions", "exact_duplicate"),
    ],
    ids=["fuzzy", "exact"],
)
def test_dedup_survives_a_worker_killed_during_its_shuffle(
    tmp_path, shared_data, dask_processes, method, options, first, shuffled, reason
):
    raw = write_web_like_corpus(shared_data, tmp_path / "raw")
    docs = tmp_path / "docs"
    tokenmill("curate", "ingest", "--input", str(raw), "--output", str(docs), "--workers", "2")
    expected, output = tmp_path / "expected", tmp_path / "out"
    tokenmill("curate", "dedup", "--input", str(docs), "--output", str(expected), "--workers", "2", *options)
    work = tmp_path / ".out.work"

    def in_shuffle_phase(keys: list[str]) -> bool:
        # The per-file phase is written; the shuffle (band keys for fuzzy, text hashes for
        # exact) holds its pieces in the workers' memory.
        return (work / f"{first}.done").exists() and not (work / f"{shuffled}.done").exists() and bool(keys)

    run_killing_a_worker(
        dask_processes,
        ["curate", "dedup", "--input", str(docs), "--output", str(output), *options],
        in_shuffle_phase,
    )
    manifest = assert_same_stage(output, expected)
    assert manifest["counts"]["rejected"].get(reason, 0) > 0
    assert read_sorted(output / "kept")["id"].is_unique


def test_encode_survives_a_killed_worker(tmp_path, shared_data, dask_processes):
    source = write_partitions(shared_data, tmp_path / "in", n=3, docs=6000)
    tokenizer = tmp_path / "tokenizer.json"
    tokenmill(
        "tokenize", "train-tokenizer", "--input", str(source), "--vocab-size", "1000", "--output", str(tokenizer), quiet=False
    )  # fmt: skip
    expected, output = tmp_path / "expected", tmp_path / "out"
    common = ["tokenize", "encode", "--input", str(source), "--tokenizer", str(tokenizer)]
    tokenmill(*common, "--output-prefix", str(expected), "--workers", "2")
    killed = run_killing_a_worker(
        dask_processes,
        [*common, "--output-prefix", str(output)],
        lambda keys: any(key.startswith("encode-part-") for key in keys),
    )
    assert any(key.startswith("encode-part-") for key in killed)
    for suffix in (".bin", ".idx"):
        assert Path(f"{output}{suffix}").read_bytes() == Path(f"{expected}{suffix}").read_bytes()
    got, want = (json.loads(Path(f"{p}.json").read_text()) for p in (output, expected))
    assert got["counts"] == want["counts"] and got["counts"]["in"] == 3 * 6000
    assert not Path(f"{output}.parts").exists()
