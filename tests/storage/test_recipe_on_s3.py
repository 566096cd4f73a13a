"""A recipe read from a bucket whose sources are on the bucket: the re-run skips every
finished step, and a changed object re-runs its ingest and what follows. A work directory on
the bucket: a run publishes each finished step (output, then state), a rerun from an empty
cache skips them all, and of two runs on the same URL only one takes the lock (a conditional
PUT)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import storage
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.runner import format_plan, run_recipe
from tokenmill.pipelines.workdir import RemoteWorkdir

PLAYS = """
sources:
  - name: plays
    path: {bucket}/raw/plays.txt
    format: text
    separator: '\\n\\n'
"""

RECIPE = (
    "name: bucket"
    + PLAYS
    + """  - name: notes
    path: {bucket}/raw/notes
    format: jsonl
curate:
  - stage: normalize
  - stage: dedup
    name: exact_dedup
    options: {{method: exact}}
"""
)


@pytest.mark.slow
def test_recipe_with_bucket_sources_resumes(bucket, shared_data, s3_dask_client, tmp_path) -> None:
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000]
    storage.write_text(f"{bucket}/raw/plays.txt", plays)
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n{"text": "a note"}\n')
    storage.write_text(f"{bucket}/recipes/bucket.yaml", RECIPE.format(bucket=bucket))
    recipe = load_recipe(f"{bucket}/recipes/bucket.yaml")
    workdir = tmp_path / "work"

    first = run_recipe(recipe, workdir, progress=False, report=False, client=s3_dask_client)
    assert {s.status for s in first.steps} == {"ran"} and len(first.steps) == 6
    second = run_recipe(
        load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, report=False, client=s3_dask_client
    )
    assert {s.status for s in second.steps} == {"skipped"}

    # A changed object on the bucket: its source's steps run again, the other source's do not.
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n{"text": "another note"}\n')
    third = run_recipe(
        load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, report=False, client=s3_dask_client
    )
    ran = sorted(s.name for s in third.steps if s.status == "ran")
    assert ran and all("notes" in name for name in ran), ran
    assert all("plays" in s.name for s in third.steps if s.status == "skipped")

    with pytest.raises(ConfigError, match="recipe not found"):
        load_recipe(f"{bucket}/recipes/missing.yaml")


def test_a_missing_source_on_the_bucket_is_a_recipe_problem(bucket) -> None:
    storage.write_text(f"{bucket}/r.yaml", RECIPE.format(bucket=bucket))
    with pytest.raises(ConfigError, match="path not found"):
        load_recipe(f"{bucket}/r.yaml")


def _objects(url: str) -> set[str]:
    fs, inner = storage.filesystem(url)
    return {name[len(inner) :].lstrip("/") for name in fs.find(inner)}


def _small_recipe(bucket: str):
    """A recipe whose source is on the bucket."""
    storage.write_text(f"{bucket}/raw/plays.txt", "a play\n\nanother")
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n')
    storage.write_text(f"{bucket}/recipes/bucket.yaml", RECIPE.format(bucket=bucket))
    return load_recipe(f"{bucket}/recipes/bucket.yaml")


def test_a_recipe_runs_in_a_bucket_and_resumes_from_an_empty_cache(bucket, shared_data, s3_dask_client) -> None:
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000]
    storage.write_text(f"{bucket}/raw/plays.txt", plays + "\n\n" + plays[:2000])
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n{"text": "a note"}\n')
    storage.write_text(f"{bucket}/recipes/bucket.yaml", RECIPE.format(bucket=bucket))
    workdir = f"{bucket}/work"

    first = run_recipe(load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, client=s3_dask_client)
    assert [s.status for s in first.steps] == ["ran"] * 6
    objects = _objects(workdir)
    states = sorted(n for n in objects if n.startswith(".state/"))
    assert len(states) == 6 and ".state/lock" not in objects
    assert {"recipe.json", "report.md", "report.html"} <= objects
    dedup = next(s for s in first.steps if "exact_dedup" in s.name and "plays" in s.name)
    state = json.loads(storage.read_text(f"{workdir}/.state/{dedup.name}.json"))
    manifest_name = next(n for n in objects if n.endswith("manifest.json") and "exact_dedup" in n and "plays" in n)
    manifest = json.loads(storage.read_text(f"{workdir}/{manifest_name}"))
    assert manifest["counts"] == state["result"]["counts"] and manifest["counts"]["rejected"]

    # Another machine: nothing of the work directory in its cache.
    shutil.rmtree(storage.cache_dir_for(workdir, "workdirs"))
    second = run_recipe(load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, client=s3_dask_client)
    assert [s.status for s in second.steps] == ["skipped"] * 6
    assert [s.summary for s in second.steps] == [s.summary for s in first.steps]

    shutil.rmtree(storage.cache_dir_for(workdir, "workdirs"))
    plan = format_plan(load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir)
    assert plan.count("[up to date]") == 6 and not storage.exists(f"{workdir}/.state/lock")

    # A step whose state never reached the bucket is not finished, whatever the cache holds.
    storage.remove(f"{workdir}/.state/{dedup.name}.json")
    third = run_recipe(load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, client=s3_dask_client)
    assert [s.name for s in third.steps if s.status == "ran"] == [dedup.name]
    assert _objects(workdir) >= objects - {".state/lock"}


def test_of_two_runs_on_one_url_one_takes_the_lock(bucket) -> None:
    url = f"{bucket}/work"
    barrier, outcomes = threading.Barrier(4), []

    def take() -> None:
        remote = RemoteWorkdir(url)
        barrier.wait()
        try:
            remote.acquire()
            outcomes.append(remote)
        except TokenmillError as error:
            outcomes.append(str(error))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    holders = [o for o in outcomes if isinstance(o, RemoteWorkdir)]
    refusals = [o for o in outcomes if isinstance(o, str)]
    assert len(holders) == 1 and len(refusals) == 3
    assert all(f"is using {url}; wait for it or use another --workdir" in r for r in refusals)
    holders[0].release()
    assert not storage.exists(f"{url}/.state/lock")

    # A run of another host holds it: refused, naming the object to delete if that run is gone.
    storage.write_text(f"{url}/.state/lock", json.dumps({"host": "elsewhere", "pid": 1, "started": 0}))
    with pytest.raises(TokenmillError, match=r"host elsewhere, pid 1.*delete s3://.*/work/\.state/lock"):
        run_recipe(_small_recipe(bucket), url, progress=False, report=False)
    # Left by a killed run of this machine (its pid is gone): taken over.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {"host": socket.gethostname(), "pid": int(ended.stdout), "started": 0}
    storage.write_text(f"{url}/.state/lock", json.dumps(dead))
    remote = RemoteWorkdir(url)
    remote.acquire()
    assert json.loads(storage.read_text(f"{url}/.state/lock"))["pid"] != dead["pid"]
    remote.release()


TRAIN_RECIPE = (
    "name: trained"
    + PLAYS
    + """tokenize: {{vocab_size: 300}}
blend:
  - {{source: plays, weight: 1.0}}
train:
  config:
    model: {{preset: tiny, max_seq_len: 32}}
    dataset: {{seq_len: 32}}
    schedule: {{steps: 200, global_batch_size: 4, warmup_steps: 2}}
    optimizer: {{lr: 3.0e-3}}
    parallel: {{precision: fp32}}
    checkpoint: {{interval: 4, keep_last: 3}}
    logging: {{interval: 1, eval_interval: 0, tensorboard: false}}
"""
)


@pytest.mark.slow
def test_training_in_a_bucket_work_directory_resumes_on_another_machine(bucket, shared_data, caplog) -> None:
    """Killed during training once a checkpoint reached the bucket; rerun with an empty cache:
    the finished steps are skipped and training resumes from that checkpoint."""
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:40_000]
    storage.write_text(f"{bucket}/raw/plays.txt", plays)
    storage.write_text(f"{bucket}/trained.yaml", TRAIN_RECIPE.format(bucket=bucket))
    workdir = f"{bucket}/work"
    command = [sys.executable, "-m", "tokenmill.cli", "run", f"{bucket}/trained.yaml", "--workdir", workdir]
    process = subprocess.Popen(
        [*command, "--no-progress", "--workers", "1"],
        # The trainer stops itself after step 9 (checkpoint 8 written): the runner uploads that
        # checkpoint at its next poll, however fast training would have reached its end.
        env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENMILL_FAULT": "SIGSTOP@step=9"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    latest = f"{workdir}/train/run/checkpoints/latest"
    try:
        # Checkpoint 4 may be uploaded first (a poll that fell between steps 4 and 8); 8 is the
        # last the stopped trainer writes, so the runner uploads it in the end.
        deadline = time.time() + 400
        while not (storage.exists(latest) and storage.read_text(latest).strip() == "step_8"):
            assert process.poll() is None, "the run ended before checkpoint 8 was uploaded"
            assert time.time() < deadline, "checkpoint 8 was not uploaded in time"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    uploaded = storage.read_text(latest).strip()
    step = int(uploaded[len("step_") :])
    assert step == 8 and not storage.exists(f"{workdir}/.state/train.json")
    assert f"train/run/checkpoints/{uploaded}/meta.json" in _objects(workdir)

    shutil.rmtree(storage.cache_dir_for(workdir, "workdirs"))
    with caplog.at_level("INFO"):
        result = run_recipe(load_recipe(f"{bucket}/trained.yaml"), workdir, progress=False, report=False)
    assert [s.status for s in result.steps][:-1] == ["skipped"] * (len(result.steps) - 1)
    assert result.steps[-1].status == "ran" and result.steps[-1].summary.startswith("step 200")
    assert "resuming from the latest checkpoint" in caplog.text
    metrics = [json.loads(line) for line in storage.read_text(f"{workdir}/train/run/metrics.jsonl").splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 201))
    assert storage.read_text(f"{workdir}/train/run/checkpoints/latest").strip() == "step_200"
