"""Asynchronous checkpoints (`checkpoint.async_save`): training goes on while a checkpoint is
written, the step directory and `latest` are published only once it is complete, and a run
killed while one is being written resumes from the previous complete one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import tokenmill.train.checkpoint as checkpoint
from tokenmill.train.checkpoint import load_for_inference
from tokenmill.train.checkpoint_files import list_checkpoints
from tokenmill.train.config import config_from_dict
from tokenmill.train.fault_injection import FAULT_ENV, parse_fault
from tokenmill.train.loop import train
from tokenmill.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def config_data(shard: Path, out: Path, **checkpoint_keys) -> dict:
    return {
        "model": {"preset": "tiny", "max_seq_len": 32},
        "out": str(out),
        "dataset": {"path": str(shard), "seq_len": 32},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "schedule": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 4, "warmup_steps": 2},
        "parallel": {"device": "cpu"},
        "checkpoint": {"interval": 2, **checkpoint_keys},
        "logging": {"interval": 1, "tensorboard": False, "progress": False},
    }


def test_async_checkpoints_overlap_training_and_equal_sync_ones(
    shakespeare_shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint is published only after the loop has run the next step (the
    publication waits for it: a synchronous save would time out here), with `latest` still
    naming the previous one meanwhile; losses and saved weights equal the synchronous run's."""
    sync = train(config_from_dict(config_data(shakespeare_shard, tmp_path / "sync")))
    run = tmp_path / "async"
    publish, seen = checkpoint._publish, {}

    def slow_publish(run_dir, step, meta, keep_last):  # noqa: ANN001, ANN202
        latest = run / "checkpoints" / "latest"
        seen[step] = latest.read_text().strip() if latest.is_file() else None
        if step < 6:  # the final save has no next step to wait for
            deadline = time.monotonic() + 120
            while not any(r["step"] == step + 1 for r in read_metrics(run)):
                assert time.monotonic() < deadline, f"step {step + 1} did not run while step {step} was written"
                time.sleep(0.05)
        return publish(run_dir, step, meta, keep_last)

    monkeypatch.setattr(checkpoint, "_publish", slow_publish)
    result = train(config_from_dict(config_data(shakespeare_shard, run, async_save=True)))
    assert seen == {2: None, 4: "step_2", 6: "step_4"}
    assert result.losses == sync.losses
    assert [p.name for p in list_checkpoints(run)] == ["step_2", "step_4", "step_6"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_6"
    assert not list((run / "checkpoints").glob(".tmp_*"))
    a, _, _ = load_for_inference(tmp_path / "sync")
    b, _, _ = load_for_inference(run)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def tokenmill_train(config: Path, *flags: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "tokenmill.cli", "train", str(config), *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_a_run_killed_while_a_checkpoint_is_written_resumes_from_the_previous_one(
    shakespeare_shard: Path, tmp_path: Path
) -> None:
    """SIGKILL while step 4 is written in the background (its files are on disk, not yet
    published): `latest` still names step 2, step 4 is nowhere to be resumed from, and the
    rerun from step 2 reaches step 6 with the losses of a run that was never killed."""
    reference = train(config_from_dict(config_data(shakespeare_shard, tmp_path / "reference")))
    run = tmp_path / "run"
    config = tmp_path / "async.yaml"
    config.write_text(yaml.safe_dump(config_data(shakespeare_shard, run, async_save=True)))

    killed = tokenmill_train(config, fault="SIGKILL@checkpoint=4")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert [p.name for p in list_checkpoints(run)] == ["step_2"]
    assert (run / "checkpoints" / ".step_4.tmp" / ".metadata").is_file()  # written, never published

    resumed = tokenmill_train(config, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = {r["step"]: r["loss"] for r in read_metrics(run)}
    assert list(logged) == list(range(1, 7))
    assert logged == pytest.approx(reference.losses, rel=1e-6)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_6"


@pytest.mark.parametrize(
    "text, message",
    [
        ("SIGKILL@step", "expected SIGNAL@POINT=STEP[,rank=R]"),
        ("SIGNOPE@step=3", "expected SIGNAL@POINT=STEP[,rank=R]"),
        ("SIGKILL@epoch=3", "the point must be one of step, checkpoint"),
    ],
)
def test_a_bad_fault_is_one_clear_line(text: str, message: str) -> None:
    from tokenmill.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^{FAULT_ENV}=.*{message.replace('[', '.').replace(']', '.')}"):
        parse_fault(text)
    assert parse_fault("SIGSTOP@step=3,rank=1").rank == 1
