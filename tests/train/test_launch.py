"""`tokenmill train` as a process a user starts, stops and kills: the launcher and the ranks
it supervises (dp=2 on the CPU), run by the installed command from a directory of the user's
own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_ports import listening

from tokenmill.train.metrics import read_metrics

psutil = pytest.importorskip("psutil")

TOKENMILL = str(Path(sys.executable).with_name("tokenmill"))
# Rerunning `tokenmill train` without --resume would not continue the run: the hint says so.
INTERRUPTED = "tokenmill: interrupted; rerun with --resume to continue"


def env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1")


def run(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([TOKENMILL, *args], cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def train_tiny(shard: Path, out: Path | str, steps: int, *flags: str) -> list[str]:
    """The arguments of `tokenmill train tiny` on `shard` into `out` for `steps` steps."""
    return ["train", "tiny", "--data", str(shard), "--out", str(out), "--steps", str(steps), *flags]


def start(shard: Path, out: Path, *flags: str) -> subprocess.Popen:
    """A long run, in its own process group as a shell job is (Ctrl-C goes to the group)."""
    return subprocess.Popen(
        [TOKENMILL, *train_tiny(shard, out, 5000, "--no-progress", *flags)],
        cwd=out.parent,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_rows(proc: subprocess.Popen, out: Path, rows: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    path = out / "metrics.jsonl"
    while not (path.is_file() and path.read_text().count("\n") >= rows):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no metrics in time")
        time.sleep(0.2)


def alive(processes: list) -> list[int]:
    return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.distributed
def test_a_tokenmill_folder_in_the_cwd_does_not_shadow_the_package(shakespeare_shard: Path, tmp_path: Path) -> None:
    """Running from the folder that holds a clone (here: a bogus `tokenmill` package) trains
    on 2 processes: no child puts the working directory on its import path."""
    (tmp_path / "tokenmill").mkdir()
    (tmp_path / "tokenmill" / "__init__.py").write_text("raise ImportError('the cwd shadows the package')\n")
    done = run(*train_tiny(shakespeare_shard, "run", 3, "--dp", "2", "--no-progress"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [3]
    assert "trained to step 3" in done.stderr


# A global batch of 18 at micro-batch 9 on dp=2 gives each rank one micro-batch of 9 rows:
# too few for 2 pipeline stages, and 9 rows do not split in 2.
ODD_BATCH = "model: tiny\ndataset: {seq_len: 64}\nschedule: {steps: 4, global_batch_size: 18, micro_batch_size: 9}\n"


NO_GPU = (
    "parallel.device is 'cuda' but torch sees no GPU on this machine (torch.cuda.is_available() is false); "
    "train on the CPU with --device cpu"
)


@pytest.mark.parametrize(
    "config, flags, message, gpus",
    [
        ("tiny", ["--tp", "3"], "tp: 3 does not divide model.n_heads = 4", None),
        (
            "tiny",
            ["--pp", "5"],
            "pp: 5 pipeline stages (pp=5 x virtual_stages=1) but the model has only 2 layers",
            None,
        ),
        ("tiny", ["--zero", "4", "--dp", "2"], "zero: must be 0, 1, 2 or 3, got 4", None),
        (
            ODD_BATCH,
            ["--pp", "2", "--dp", "2"],
            "micro_batch_size: local batch 9 gives 1 micro-batch(es) for 2 pipeline stages",
            None,
        ),
        # The device is checked before any rank starts (on a machine without a GPU every rank
        # failed in NCCL's errors after seconds; one process, in a traceback).
        ("tiny", ["--device", "cuda"], NO_GPU, 0),
        ("tiny", ["--device", "cuda", "--cp", "2"], NO_GPU, 0),
        (
            "tiny",
            ["--device", "cuda", "--dp", "2"],
            "2 ranks on this machine (tp x pp x dp x cp) need a GPU each, but torch sees 1",
            1,
        ),
        ("tiny", ["--device", "cuda:3"], "parallel.device is 'cuda:3' but torch sees 2 GPU(s) on this machine", 2),
    ],
    ids=["tp3", "pp5", "zero4", "pp-batch", "cuda-no-gpu", "cuda-cp2-no-gpu", "cuda-dp2-one-gpu", "cuda-index"],
)
def test_a_bad_layout_is_one_line_before_any_worker(
    shakespeare_shard: Path,
    tmp_path: Path,
    config: str,
    flags: list[str],
    message: str,
    gpus: int | None,
    monkeypatch,
    capsys,
) -> None:
    from tokenmill.cli import main

    if gpus is not None:  # the machine's GPUs as torch sees them
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if config != "tiny":
        (tmp_path / "odd.yaml").write_text(config)
        config = "odd.yaml"
    monkeypatch.chdir(tmp_path)

    def no_worker(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", no_worker)  # the ranks start this way
    assert main(["train", config, "--data", str(shakespeare_shard), "--out", "run", *flags]) == 1
    err = capsys.readouterr().err
    assert err.count(message) == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "flags", [[], pytest.param(["--dp", "2"], marks=pytest.mark.distributed)], ids=["single", "dp2"]
)
def test_ctrl_c_prints_one_line_and_exits_130(shakespeare_shard: Path, tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "run"
    proc = start(shakespeare_shard, out, *flags)
    wait_for_rows(proc, out, 2)
    workers = psutil.Process(proc.pid).children(recursive=True)  # the ranks and their server
    assert sorted(p.name() for p in workers if p.name().startswith("tokenmill:")) == (
        ["tokenmill:0", "tokenmill:1"] if flags else []
    )
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert len(stderr.strip().splitlines()) == 1, stderr[-3000:]
    (line,) = stderr.strip().splitlines()
    assert line.startswith(INTERRUPTED), stderr[-3000:]
    time.sleep(1.0)
    assert alive(workers) == []


@pytest.mark.distributed
def test_killing_the_launcher_kills_its_workers(shakespeare_shard: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start(shakespeare_shard, out, "--dp", "2", "--zero", "1")
    wait_for_rows(proc, out, 2)
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert len(tree) == 3  # the 2 ranks and the server they are forked from
    proc.kill()  # SIGKILL: the launcher can do nothing about it
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(tree) == [], "workers outlived their launcher"
    size = (out / "metrics.jsonl").stat().st_size
    time.sleep(2)
    assert (out / "metrics.jsonl").stat().st_size == size
    # The run directory is free again: a new run resumes it.
    done = run(*train_tiny(shakespeare_shard, "run", 2, "--no-progress"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.distributed
def test_the_ranks_listen_on_loopback_only(shakespeare_shard: Path, tmp_path: Path) -> None:
    """Rank 0's store (at MASTER_ADDR 127.0.0.1) and gloo's connections between the ranks accept
    no connection from another host: every socket the launcher's processes listen on is bound to
    127.0.0.1, not to every interface."""
    out = tmp_path / "run"
    proc = start(shakespeare_shard, out, "--dp", "2")
    try:
        wait_for_rows(proc, out, 1)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        by_process = {p.name(): listening(p) for p in tree}
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert by_process["tokenmill:0"], by_process  # the store, at least
    addresses = {address for listeners in by_process.values() for address, _ in listeners}
    assert addresses == {"127.0.0.1"}, by_process


@pytest.mark.parametrize(
    "flags", [[], pytest.param(["--dp", "2"], marks=pytest.mark.distributed)], ids=["single", "dp2"]
)
def test_a_second_run_on_the_same_directory_is_refused(
    shakespeare_shard: Path, tmp_path: Path, flags: list[str]
) -> None:
    out = tmp_path / "run"
    first = start(shakespeare_shard, out, *flags)
    try:
        wait_for_rows(first, out, 1)
        writer = (
            first.pid
            if not flags
            else next(  # rank 0 writes
                p.pid for p in psutil.Process(first.pid).children(recursive=True) if p.name() == "tokenmill:0"
            )
        )
        # The first run holds its lock while stopped (SIGSTOP), and trains on no core meanwhile.
        first_run = [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]
        for process in first_run:
            process.suspend()
        for second_flags in ([], ["--dp", "2"]):
            second = run(*train_tiny(shakespeare_shard, "run", 3, *second_flags), cwd=tmp_path, timeout=120)
            assert second.returncode == 1
            assert second.stderr.strip().splitlines() == [
                f"tokenmill: error: run is being written by another `tokenmill train` (pid {writer}); "
                "wait for it to finish or stop it, or pass another --out"
            ], second.stderr[-3000:]
        for process in first_run:
            process.resume()
        assert first.poll() is None  # the first run goes on
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=120)
