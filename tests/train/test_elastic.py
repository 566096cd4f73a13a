"""Training that survives failures, from the command line (CPU, fp32, gloo):

- a rank killed with SIGKILL mid-run under `--max-restarts`: all ranks restart from the
  latest checkpoint and reach the last step with the losses of a run never disturbed
  (tp2 x dp2; pp2 x dp2 with asynchronous checkpoints), the failure said and recorded in
  RUN/failures.jsonl;
- without `--max-restarts` a killed rank ends the job with one clear line, nothing left running;
- a rank stopped with SIGSTOP ends the job within `parallel.collective_timeout`, with an
  error naming the waiting rank and its operation, and the stopped rank named and killed.

The faults are injected at a precise step by TOKENMILL_FAULT (tokenmill.train.fault_injection)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tokenmill.train.config import config_from_dict
from tokenmill.train.fault_injection import FAULT_ENV
from tokenmill.train.loop import train
from tokenmill.train.metrics import read_metrics

psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]


def config_data(shard: Path, out: Path, **parallel) -> dict:
    # The vocabulary is fixed: taken from the data it is padded to a multiple of 128 x tp.
    return {
        "model": {"preset": "tiny", "max_seq_len": 32, "vocab_size": 512},
        "out": str(out),
        "dataset": {"path": str(shard), "seq_len": 32},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "schedule": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 2, "warmup_steps": 2},
        "parallel": {"device": "cpu", **parallel},
        "checkpoint": {"interval": 2},
        "logging": {"interval": 1, "tensorboard": False, "progress": False},
    }


@pytest.fixture(scope="module")
def reference_losses(shakespeare_shard: Path, tmp_path_factory) -> dict[int, float]:
    """The undisturbed run, in one process (every layout's losses equal it to fp32 tolerance:
    tests/train/test_parallel_cli.py)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    return train(config_from_dict(config_data(shakespeare_shard, out))).losses


def start(config: Path, *flags: str, fault: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), FAULT_ENV: fault}
    command = [sys.executable, "-m", "tokenmill.cli", "train", str(config), *flags]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[str, str, list[int]]:
    """(stdout, stderr, pids of its processes still alive a moment after it ended)."""
    tree: list = []
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            tree = {p.pid: p for p in [*tree, *psutil.Process(proc.pid).children(recursive=True)]}.values()
            tree = list(tree)
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.5)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    stdout, stderr = proc.communicate(timeout=60)
    time.sleep(1.0)
    alive = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return stdout, stderr, alive


def failures(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "failures.jsonl").read_text().splitlines()]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "layout, checkpoint, fault_step",
    [
        ({"tp": 2, "dp": 2}, {}, 3),
        # Written in the background, the step-4 checkpoint may not be published when rank 1
        # dies after step 5: the restart resumes from whichever is the latest complete one.
        ({"pp": 2, "dp": 2}, {"async_save": True}, 5),
    ],
    ids=["tp2xdp2", "pp2xdp2-async"],
)
def test_a_killed_rank_restarts_the_job_from_the_latest_checkpoint(
    shakespeare_shard: Path,
    tmp_path: Path,
    reference_losses: dict[int, float],
    layout: dict,
    checkpoint: dict,
    fault_step: int,
) -> None:
    run = tmp_path / "run"
    config = tmp_path / "train.yaml"
    data = config_data(shakespeare_shard, run, **layout)
    data["checkpoint"].update(checkpoint)
    config.write_text(yaml.safe_dump(data))
    proc = start(config, "--max-restarts", "1", fault=f"SIGKILL@step={fault_step},rank=1")
    stdout, stderr, alive = finish(proc)
    assert proc.returncode == 0, stderr[-4000:]
    assert (
        "training rank 1 (pid " in stderr and ") was killed by SIGKILL; restarting all ranks (restart 1 of 1)" in stderr
    )
    resumed = re.search(r"restart 1 of 1: resuming from \S*checkpoints/step_(\d+)", stderr)
    assert resumed and 2 <= int(resumed.group(1)) <= fault_step, stderr[-4000:]
    assert "trained to step 6" in stderr and alive == []  # status lines are logged to stderr
    causes = [f for f in failures(run) if f["cause"]]
    assert [(f["attempt"], f["rank"], f["signal"], f["action"]) for f in causes] == [(0, 1, "SIGKILL", "restart")]
    logged = {r["step"]: r["loss"] for r in read_metrics(run)}
    assert list(logged) == list(range(1, 7))  # one row per step across the restart
    assert logged == pytest.approx(reference_losses, rel=1e-5)


@pytest.mark.distributed
@pytest.mark.parametrize("layout", [{"dp": 2}, {"cp": 2}], ids=["dp2", "cp2"])
def test_without_restarts_a_killed_rank_ends_the_job_with_one_line(
    shakespeare_shard: Path, tmp_path: Path, layout: dict
) -> None:
    run = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(config_data(shakespeare_shard, run, **layout)))
    proc = start(config, fault="SIGKILL@step=3,rank=1")
    _, stderr, alive = finish(proc)
    assert proc.returncode == 137
    # The other rank's collective failed because of it: the launcher's line says why, alone (the
    # step lines are on stdout).
    assert stderr == "tokenmill: error: training rank 1 was killed by SIGKILL\n", stderr[-3000:]
    assert alive == []
    causes = [f for f in failures(run) if f["cause"]]
    assert [(f["rank"], f["signal"], f["action"]) for f in causes] == [(1, "SIGKILL", "stop")]
    assert max(r["step"] for r in read_metrics(run)) == 3


@pytest.mark.distributed
def test_a_stopped_rank_ends_the_job_within_the_collective_timeout(shakespeare_shard: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(config_data(shakespeare_shard, run, dp=2, collective_timeout=5)))
    proc = start(config, fault="SIGSTOP@step=3,rank=1")
    stopped_at = None
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if stopped_at is None:
            ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "tokenmill:1"]
            if ranks and ranks[0].status() == psutil.STATUS_STOPPED:
                stopped_at = time.monotonic()
        time.sleep(0.2)
    ended = time.monotonic()
    _, stderr, alive = finish(proc)
    assert stopped_at is not None, stderr[-3000:]
    assert proc.returncode == 124, stderr[-3000:]
    # The waiting rank names itself and the collective it waited in; the launcher names the stopped one.
    assert (
        "tokenmill: ERROR: rank 0: collective all_reduce (torch.distributed.distributed_c10d) in all_reduce_grads "
        "waited " in stderr
    ), stderr[-3000:]
    assert "(parallel.collective_timeout = 5 s); another rank is stopped, hung or gone" in stderr
    assert (
        "tokenmill: ERROR: training rank 1 (pid " in stderr
        and ") is stopped (SIGSTOP or a debugger); killing it" in stderr
    )
    assert "Traceback" not in stderr and alive == []
    assert ended - stopped_at < 5 + 30, f"took {ended - stopped_at:.0f} s after the stop"
    assert [(f["rank"], f["state"]) for f in failures(run) if "state" in f] == [(1, "stopped")]


def test_restart_keys_are_checked_where_they_are_written(tmp_path: Path) -> None:
    from tokenmill.errors import ConfigError

    with pytest.raises(ConfigError, match=r"parallel\.max_restarts: must be >= 0, got -1"):
        config_from_dict({"parallel": {"max_restarts": -1}})
    with pytest.raises(ConfigError, match=r"parallel\.collective_timeout: must be at least 1, got 0"):
        config_from_dict({"parallel": {"collective_timeout": 0}})
    cfg = config_from_dict(
        {"parallel": {"max_restarts": 2, "collective_timeout": 60}, "checkpoint": {"async_save": True}}
    )
    assert (cfg.parallel.max_restarts, cfg.parallel.collective_timeout, cfg.checkpoint.async_save) == (2, 60.0, True)
