"""A run killed during curation, and again during training, then started again, ends with the
same outputs as an uninterrupted run: documents, tokenizer, shards, losses, evaluation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from pipeline_outputs import assert_blend_table_is_the_draw, documents, report_rows

pytestmark = pytest.mark.slow

RECIPE = """
name: resume
sources:
  - name: wiki
    path: {corpus}/wikitext2_valid.txt
    format: text
    separator: '^(?= = [^=])'
  - name: plays
    path: {corpus}/tinyshakespeare.txt
    format: text
    separator: '\\n\\n'
curate:
  - stage: normalize
  - stage: langid
    options: {{languages: [en], min_score: 0.3}}
  - stage: dedup
    name: exact_dedup
    options: {{method: exact}}
tokenize: {{vocab_size: 320}}
blend:
  - {{source: wiki, weight: 0.7}}
  - {{source: plays, weight: 0.3}}
train:
  config:
    model: {{preset: tiny, max_seq_len: 32}}
    dataset: {{seq_len: 32, split: "90,10,0"}}
    schedule: {{steps: 16, global_batch_size: 4, warmup_steps: 2}}
    optimizer: {{lr: 3.0e-3}}
    parallel: {{precision: fp32}}
    checkpoint: {{interval: 4, keep_last: 5}}
    logging: {{interval: 1, eval_interval: 8, eval_iters: 1, tensorboard: false}}
eval:
  perplexity: true
"""


def _command(recipe: Path, workdir: Path, *options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokenmill.cli",
        "run",
        str(recipe),
        "--workdir",
        str(workdir),
        "--no-progress",
        *options,
    ]


def _own_cluster(command: list[str]) -> list[str]:
    """A run that is killed takes its own LocalCluster's workers with it: none of its tasks can
    go on writing on the test session's cluster after the kill."""
    return [*command, "--workers", "2"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_to_end(recipe: Path, workdir: Path, *options: str) -> str:
    """Run the recipe to its end; returns the runner's messages (stderr)."""
    done = subprocess.run(_command(recipe, workdir, *options), capture_output=True, text=True, env=_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stderr


def run_and_kill(recipe: Path, workdir: Path, *, when_line: str | None = None, when_path: Path | None = None) -> None:
    """Start a run in its own process group and SIGKILL the whole group (runner, Dask workers,
    trainer) as soon as a step starts (`when_line` printed) or a file appears (`when_path`)."""
    process = subprocess.Popen(
        _own_cluster(_command(recipe, workdir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        deadline = time.time() + 600
        if when_line is not None:
            assert process.stdout is not None
            for line in process.stdout:
                seen.append(line)
                if when_line in line:
                    break
            else:
                pytest.fail("the run ended before the step to kill started:\n" + "".join(seen[-40:]))
        else:
            assert when_path is not None
            while not when_path.exists():
                assert process.poll() is None, "the run ended before it could be killed"
                assert time.time() < deadline
                time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def losses(workdir: Path) -> dict[int, tuple[float, float | None]]:
    from tokenmill.train.metrics import read_metrics

    return {m["step"]: (m["loss"], m.get("val_loss")) for m in read_metrics(workdir / "train" / "run")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared_data) -> tuple[Path, Path]:
    """The recipe and its uninterrupted run, to the end: what a resumed run must equal, and the
    curated and tokenized work directory the kill tests train from."""
    tmp = tmp_path_factory.mktemp("resume")
    recipe = tmp / "resume.yaml"
    recipe.write_text(textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus")))
    run_to_end(recipe, tmp / "reference")
    return recipe, tmp / "reference"


def test_killed_during_curation_and_training_resumes_to_the_same_outputs(tmp_path, reference):
    recipe, reference = reference
    resumed = tmp_path / "resumed"

    # 1. Killed while curation stages run (normalize and langid, in one pass): they have no state
    # and no published output.
    run_and_kill(recipe, resumed, when_line="] curate.plays.normalize: normalize")
    assert (resumed / ".state" / "curate.wiki.langid.json").exists()
    assert not (resumed / ".state" / "curate.plays.normalize.json").exists()
    assert not (resumed / ".state" / "curate.plays.langid.json").exists()
    assert not (resumed / ".state" / "train.json").exists()

    # 2. Killed during training, after its first checkpoint.
    run_and_kill(recipe, resumed, when_path=resumed / "train" / "run" / "checkpoints" / "step_4")
    assert (resumed / ".state" / "tokenize.blend.json").exists()
    assert not (resumed / ".state" / "train.json").exists()

    out = run_to_end(recipe, resumed)
    assert "resuming from the latest checkpoint" in out
    assert "curate.plays.langid: up to date" in out  # finished before the second kill; not redone

    for source in ("wiki", "plays"):
        for stage in ("00-ingest", "01-normalize", "02-langid", "03-exact_dedup"):
            a, b = reference / "curate" / source / stage, resumed / "curate" / source / stage
            assert documents(a) == documents(b), f"{source}/{stage} differs"
            counts = [json.loads((d / "manifest.json").read_text())["counts"] for d in (a, b)]
            assert counts[0] == counts[1]
        assert not list((resumed / "curate" / source).glob(".*tmp*"))  # no leftovers of the kill
        for ext in (".bin", ".idx"):
            name = f"{source}{ext}"
            assert (reference / "shards" / source / name).read_bytes() == (
                resumed / "shards" / source / name
            ).read_bytes()
    assert (reference / "tokenizer" / "tokenizer.json").read_bytes() == (
        resumed / "tokenizer" / "tokenizer.json"
    ).read_bytes()

    ref_losses, res_losses = losses(reference), losses(resumed)
    assert sorted(ref_losses) == list(range(1, 17))
    assert sorted(res_losses) == sorted(ref_losses)
    for step in ref_losses:
        assert res_losses[step][0] == pytest.approx(ref_losses[step][0], rel=1e-6, abs=1e-7), step
        if ref_losses[step][1] is not None:
            assert res_losses[step][1] == pytest.approx(ref_losses[step][1], rel=1e-6), step
    ref_eval = json.loads((reference / "eval" / "results.json").read_text())["results"]
    res_eval = json.loads((resumed / "eval" / "results.json").read_text())["results"]
    assert [r["value"] for r in res_eval] == pytest.approx([r["value"] for r in ref_eval], rel=1e-6)
    assert (resumed / "report.html").exists()
    assert_report_tells_the_run(reference)

    # 3. Training forced again over the same data: it resumes its finished checkpoint, says so
    # and trains nothing.
    trained = losses(resumed)
    out = run_to_end(recipe, resumed, "--force", "train", "--until", "train")
    assert "config and data unchanged: resuming from the latest checkpoint" in out
    last = resumed / "train" / "run" / "checkpoints" / "step_16"
    assert f"nothing to do: the run already reached its last step, 16 ({last})" in out
    assert losses(resumed) == trained

    # 4. A shard rewritten under the same fingerprints (as an upstream step re-run with --from
    # that kept other documents): training starts afresh instead of resuming the old checkpoint.
    shard = resumed / "shards" / "plays" / "plays.bin"
    np.fromfile(shard, dtype=np.uint16)[::-1].tofile(shard)
    out = run_to_end(recipe, resumed, "--force", "train", "--until", "train")
    assert "the training data changed since" in out and "(shards/plays/plays.bin): starting afresh" in out
    assert "resuming from" not in out
    retrained = losses(resumed)
    assert sorted(retrained) == list(range(1, 17)) and retrained[1][0] != trained[1][0]


def assert_report_tells_the_run(workdir: Path) -> None:
    """The report's training layout is the run's, and its realised blend and epochs are those of
    the samples the trainer drew (its own blended dataset, read from the indices it cached)."""
    import yaml

    from tokenmill.train.metrics import read_metrics

    md = (workdir / "report.md").read_text()
    config = yaml.safe_load((workdir / "train" / "run" / "config.yaml").read_text())
    p = config["parallel"]
    training = report_rows(md, "Training")
    assert training["layout"] == [f"tp={p['tp']} pp={p['pp']} dp={p['dp']} zero={p['zero']}"]
    consumed = read_metrics(workdir / "train" / "run")[-1]["consumed_samples"]
    assert consumed == 16 * 4
    assert f"realised shares are those of the {consumed:,} samples training drew (to step 16)" in md
    blend = assert_blend_table_is_the_draw(md, workdir / "blend" / "blend.json", config, consumed, ["wiki", "plays"])
    for source in ("wiki", "plays"):
        assert blend[source][3] != blend[source][2]  # realised, not requested


def test_killed_runner_takes_its_trainer_and_workers_with_it(tmp_path, reference):
    """SIGKILL of `tokenmill run` alone (not its group) while it trains with dp=2: the trainer
    (the launcher) and both its ranks end within seconds, and the work directory can be run again."""
    import psutil

    base_recipe, base = reference
    recipe = tmp_path / "long.yaml"
    text = base_recipe.read_text().replace("steps: 16", "steps: 2000")
    recipe.write_text(text.replace("train:\n", "train:\n  parallel: {dp: 2}\n"))
    # The reference's curated shards, without its training and evaluation: this run's curation
    # and tokenization are up to date, and it trains afresh (its train config is another).
    workdir = tmp_path / "work"
    shutil.copytree(base, workdir, ignore=shutil.ignore_patterns("train", "eval", "train.json", "eval*.json"))
    process = subprocess.Popen(
        _command(recipe, workdir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    metrics = workdir / "train" / "run" / "metrics.jsonl"
    try:
        deadline = time.time() + 600
        while not (metrics.exists() and metrics.stat().st_size > 0):
            assert process.poll() is None, "the run ended before training started"
            assert time.time() < deadline
            time.sleep(0.2)
        trainers = psutil.Process(process.pid).children(recursive=True)
        assert sum("tokenmill.train.worker" in " ".join(p.cmdline()) for p in trainers) == 1  # the launcher
        assert sorted(p.name() for p in trainers if p.name().startswith("tokenmill:")) == ["tokenmill:0", "tokenmill:1"]
        process.kill()
        process.wait(timeout=30)
        gone, alive = psutil.wait_procs(trainers, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
        size = metrics.stat().st_size
        time.sleep(2)
        assert metrics.stat().st_size == size  # nobody writes the run any more
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
