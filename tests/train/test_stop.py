"""A run asked to stop (SIGUSR1 or SIGTERM, as Slurm sends before a time limit or on
pre-emption) finishes its step, writes a checkpoint there and exits with STOPPED_EXIT; run
again with --resume it reaches the last step with the losses of a run never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenmill.train.metrics import read_metrics
from tokenmill.train.stop import STOP_FILE, STOPPED_EXIT

pytestmark = pytest.mark.slow

TOKENMILL = str(Path(sys.executable).with_name("tokenmill"))
STEPS = 60
# No periodic checkpoint: the only one before the last step is the stop's.
CONFIG = f"""
model: {{preset: tiny, max_seq_len: 64}}
dataset: {{seq_len: 64}}
schedule: {{steps: {STEPS}, global_batch_size: 8, micro_batch_size: 4, warmup_steps: 4}}
optimizer: {{lr: 3.0e-3}}
parallel: {{precision: fp32}}
logging: {{interval: 1, eval_interval: 0, tensorboard: false}}
checkpoint: {{interval: 0}}
"""


def train_argv(tmp: Path, shard: Path, out: Path, *flags: str) -> list[str]:
    config = tmp / "config.yaml"
    if not config.exists():
        config.write_text(CONFIG)
    return [TOKENMILL, "train", str(config), "--data", str(shard), "--out", str(out), "--no-progress", *flags]


def env(**extra: str) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", **extra)


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run)}


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, shakespeare_shard) -> dict[str, dict[int, float]]:
    """The losses of runs never stopped: one process, and dp=2."""
    tmp = tmp_path_factory.mktemp("undisturbed")
    found = {}
    for name, flags in (("single", []), ("dp2", ["--dp", "2"])):
        done = subprocess.run(
            train_argv(tmp, shakespeare_shard, tmp / name, *flags), env=env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found[name] = losses(tmp / name)
        assert sorted(found[name]) == list(range(1, STEPS + 1))
    return found


def signal_after_rows(argv: list[str], out: Path, sig: signal.Signals, rows: int = 2) -> subprocess.CompletedProcess:
    """Start the run, send `sig` to the command once `rows` steps are logged, wait for its end."""
    proc = subprocess.Popen(argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (path.is_file() and path.read_text().count("\n") >= rows):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no metrics in time"
        time.sleep(0.02)
    os.kill(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def assert_stopped_at_a_checkpoint(done: subprocess.CompletedProcess, out: Path, reason: str) -> int:
    """The run stopped with STOPPED_EXIT after some step k < STEPS, saying so once; its latest
    checkpoint is step k and its metrics end there. Returns k."""
    assert done.returncode == STOPPED_EXIT, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "stopped after step" in line]
    assert len(lines) == 1 and f"on request ({reason})" in lines[0], done.stderr[-3000:]
    step = int(lines[0].split("stopped after step ")[1].split()[0])
    assert 1 <= step < STEPS
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step_{step}"
    assert json.loads((out / "checkpoints" / f"step_{step}" / "meta.json").read_text())["step"] == step
    assert sorted(losses(out)) == list(range(1, step + 1))
    assert not (out / STOP_FILE).exists()
    assert "Traceback" not in done.stderr
    return step


def assert_resumes_to_the_undisturbed_losses(argv: list[str], out: Path, step: int, want: dict[int, float]) -> None:
    done = subprocess.run([*argv, "--resume"], env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert printed[0] == step + 1 and printed[-1] == STEPS  # resumed where the stop checkpointed
    assert losses(out) == want  # bit for bit: fp32 on the CPU, one thread


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_a_signal_stops_a_local_run_at_a_checkpoint_and_a_rerun_resumes_it(
    tmp_path, shakespeare_shard, undisturbed, sig
):
    out = tmp_path / "run"
    argv = train_argv(tmp_path, shakespeare_shard, out)
    done = signal_after_rows(argv, out, sig)
    step = assert_stopped_at_a_checkpoint(done, out, sig.name)
    assert_resumes_to_the_undisturbed_losses(argv, out, step, undisturbed["single"])


@pytest.mark.distributed
def test_sigusr1_to_the_launcher_stops_every_rank_after_the_same_step(tmp_path, shakespeare_shard, undisturbed):
    """dp=2 with restarts allowed: the launcher passes the request on (the STOP file), both
    ranks stop after the same step, and the launcher does not restart them."""
    out = tmp_path / "run"
    argv = train_argv(tmp_path, shakespeare_shard, out, "--dp", "2")
    done = signal_after_rows([*argv, "--max-restarts", "1"], out, signal.SIGUSR1)
    step = assert_stopped_at_a_checkpoint(done, out, str(out / STOP_FILE))
    assert not (out / "failures.jsonl").exists()  # not a failure: nothing restarted
    assert_resumes_to_the_undisturbed_losses(argv, out, step, undisturbed["dp2"])


@pytest.mark.distributed
def test_a_request_seen_by_one_rank_stops_every_rank(tmp_path, shakespeare_shard, undisturbed):
    """SIGUSR1 to rank 1 alone, once step 3 is done (after that step's stop check): the ranks
    agree (an all-reduce of the flag at the end of each step) and both stop after step 4,
    with one consistent checkpoint."""
    out = tmp_path / "run"
    argv = train_argv(tmp_path, shakespeare_shard, out, "--dp", "2")
    done = subprocess.run(argv, env=env(TOKENMILL_FAULT="SIGUSR1@step=3,rank=1"), capture_output=True, text=True)
    assert assert_stopped_at_a_checkpoint(done, out, "another rank's request") == 4
    assert_resumes_to_the_undisturbed_losses(argv, out, 4, undisturbed["dp2"])


# One long native call, as the forward of a huge batch is: the interpreter looks at no signal
# inside it (about 10 s on one loaded core).
LONG_CALL = """
import sys
import torch
from tokenmill.entry import interrupted_line, run_reported
from tokenmill.train.stop import prompt_interrupt

big = torch.ones(7000, 7000)

def command():
    with prompt_interrupt(lambda: interrupted_line("rerun with --resume to continue"), grace_s=1.0):
        print("started", flush=True)
        big @ big
    return 0

sys.exit(run_reported(command, "tokenmill train"))
"""


def test_ctrl_c_ends_a_long_native_call_within_the_grace_period() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", LONG_CALL], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    time.sleep(0.5)  # inside the call
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    waited = time.monotonic() - sent
    assert proc.returncode == 130
    assert stderr == "tokenmill: interrupted; rerun with --resume to continue\n"
    assert waited < 1.0 + 4, f"{waited:.1f} s after Ctrl-C"
