"""`tokenmill train` and `tokenmill export-hf` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenmill.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "tiny"  # the bundled train-tiny.yaml, by name
TOKENMILL = str(Path(sys.executable).with_name("tokenmill"))


def tokenmill(*args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """The installed `tokenmill` command, as a user types it, from ``cwd``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([TOKENMILL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def main(*args: str) -> int:
    from tokenmill.cli import main as tokenmill_main

    return tokenmill_main(list(args))


def test_train_tiny_recipe_then_resume_then_export(
    shakespeare_shard: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The smoke recipe in-process (shortened): checkpoints, metrics, --resume, export-hf."""
    monkeypatch.chdir(tmp_path)  # a bundled name works from any directory
    run = tmp_path / "run"
    assert (
        main("train", RECIPE, "--data", str(shakespeare_shard), "--out", str(run), "--steps", "12", "--no-progress")
        == 0
    )
    records = read_metrics(run)
    assert [r["step"] for r in records] == [5, 10, 12] and records[-1]["loss"] < records[0]["loss"] - 0.5
    assert "val_loss" in records[-1] and "trained to step 12" in capsys.readouterr().err
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_12"
    assert list((run / "tensorboard").iterdir())
    # --steps extends the same run from its latest checkpoint.
    assert (
        main(
            "train",
            RECIPE,
            "--data",
            str(shakespeare_shard),
            "--out",
            str(run),
            "--steps",
            "14",
            "--resume",
            "--no-progress",
        )
        == 0
    )
    assert [r["step"] for r in read_metrics(run)] == [5, 10, 12, 14]
    assert main("export-hf", str(run), str(tmp_path / "hf")) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "config.json").is_file()
    # The vocabulary is the shard's (257 byte tokens + EOD), padded to a multiple of 128.
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 384


def test_cli_errors_are_one_line(shakespeare_shard: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\nschedule: {micro_batch: 4}\n")
    assert main("train", str(bad), "--data", str(shakespeare_shard)) == 1
    assert (
        "schedule.micro_batch: unknown key `micro_batch` (did you mean `micro_batch_size`?)" in capsys.readouterr().err
    )
    # A key of the old flat config names its place in the sections, also when a flag sets it.
    bad.write_text("model: tiny\nsteps: 4\n")
    assert main("train", str(bad), "--data", str(shakespeare_shard), "--steps", "2") == 1
    assert capsys.readouterr().err == f"tokenmill: error: {bad}:2: steps: moved; write schedule.steps\n"
    assert main("train", RECIPE, "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")) == 1
    assert "not found" in capsys.readouterr().err
    assert main("export-hf", str(tmp_path / "nowhere"), str(tmp_path / "hf")) == 1
    assert "no checkpoint at" in capsys.readouterr().err


def test_torchrun_restarts_over_a_store_shared_by_attempts_are_refused_before_training(
    shakespeare_shard: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    # A rank as torchrun --max-restarts 1 starts it by default: the agent's store, kept for every attempt.
    torchrun = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "1"}
    for name, value in {**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    argv = ["train", RECIPE, "--data", str(shakespeare_shard), "--out", str(tmp_path / "run"), "--dp", "2"]
    assert main(*argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokenmill: error: torchrun --max-restarts shares one store between attempts")
    assert err.endswith("start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment\n")
    assert not (tmp_path / "run").exists()


def test_a_shard_with_swapped_lengths_is_refused_before_training(
    shakespeare_shard: Path, tmp_path: Path, capsys
) -> None:
    """Two documents' lengths swapped (same total, so the .bin size still matches) used to train
    to the end on wrong boundaries: the launcher now refuses the shard in one line."""
    import shutil

    import numpy as np

    prefix = tmp_path / "shakespeare"
    for ext in (".bin", ".idx", ".json"):
        shutil.copyfile(f"{shakespeare_shard}{ext}", f"{prefix}{ext}")
    raw = bytearray(Path(f"{prefix}.idx").read_bytes())
    lengths = np.frombuffer(bytes(raw), dtype="<i4", count=12, offset=34)
    i = int(np.flatnonzero(lengths[1:] != lengths[0])[0]) + 1  # the first document of another length
    at_0, at_i = 34, 34 + i * 4
    raw[at_0 : at_0 + 4], raw[at_i : at_i + 4] = raw[at_i : at_i + 4], raw[at_0 : at_0 + 4]
    Path(f"{prefix}.idx").write_bytes(bytes(raw))
    run = tmp_path / "run"
    assert main("train", RECIPE, "--data", str(prefix), "--out", str(run), "--steps", "2", "--no-progress") == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tokenmill: error: corrupt index {prefix}.idx: sequence 1 starts")
    assert not (run / "checkpoints").exists()


def test_a_sample_longer_than_the_data_is_refused_before_training(
    shakespeare_shard: Path, tmp_path: Path, capsys
) -> None:
    """A seq_len beyond the train split's tokens used to start without a word and spend its
    first step (minutes, deaf to Ctrl-C inside one huge forward) on the corpus repeated."""
    from tokenmill.tokenize.indexed import IndexedDataset

    config = tmp_path / "long.yaml"
    config.write_text("model: {preset: tiny, max_seq_len: 1000000}\ndataset: {seq_len: 1000000}\n")
    run = tmp_path / "run"
    assert main("train", str(config), "--data", str(shakespeare_shard), "--out", str(run), "--device", "cpu") == 1
    shard = IndexedDataset(shakespeare_shard)
    train_documents = len(shard) * 969 // 1000  # the default split, 969,30,1
    tokens = int(shard.sequence_lengths[:train_documents].sum())
    assert capsys.readouterr().err == (
        f"tokenmill: error: dataset.seq_len is 1000000 but the train split of {shakespeare_shard} holds {tokens} "
        "tokens (split '969,30,1'), fewer than one sample of seq_len + 1; lower dataset.seq_len (and "
        "model.max_seq_len) or train on more data\n"
    )
    assert not run.exists()


@pytest.mark.slow
def test_train_tiny_recipe_subprocess_under_a_minute(shakespeare_shard: Path, tmp_path: Path) -> None:
    """`tokenmill train tiny --data P --out R` as users type it, from a directory of their own;
    the file path of the recipe works too."""
    start = time.perf_counter()
    done = tokenmill("train", "tiny", "--data", str(shakespeare_shard), "--out", "r", cwd=tmp_path)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 60, f"took {elapsed:.1f} s"
    assert read_metrics(tmp_path / "r")[-1]["step"] == 40
    by_path = tokenmill(
        "train",
        str(ROOT / "recipes" / "train-tiny.yaml"),
        "--data",
        str(shakespeare_shard),
        "--out",
        "r2",
        "--steps",
        "2",
        cwd=tmp_path,
    )
    assert by_path.returncode == 0, by_path.stderr
    assert read_metrics(tmp_path / "r2")[-1]["step"] == 2


def test_unknown_recipe_name_lists_the_bundled_ones(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main("train", "tinny", "--data", "x") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("tokenmill: error:") and "'tinny'" in line and "tiny" in line.split("'tinny'")[1]


def test_bad_flag_values_are_named_by_the_flag_not_the_bundled_file(shakespeare_shard: Path, tmp_path: Path, capsys):
    data = ["--data", str(shakespeare_shard), "--out", str(tmp_path / "r")]
    assert main("train", RECIPE, *data, "--steps", "0") == 1
    assert capsys.readouterr().err == "tokenmill: error: --steps: must be at least 1, got 0\n"
    assert main("train", RECIPE, *data, "--zero", "5") == 1
    assert capsys.readouterr().err == "tokenmill: error: --zero: must be 0, 1, 2 or 3, got 5\n"
    assert main("train", RECIPE, *data, "--tp", "0", "--pp", "0") == 1
    assert capsys.readouterr().err == (
        "tokenmill: error: 2 problems in the options:\n  - --tp: must be at least 1, got 0\n"
        "  - --pp: must be at least 1, got 0\n"
    )
    # A problem of the file's own keys (here made by --dp) names the config as the user gave it.
    assert main("train", RECIPE, *data, "--dp", "3") == 1
    assert capsys.readouterr().err == (
        "tokenmill: error: bundled config 'tiny': schedule.global_batch_size: 16 is not divisible by "
        "micro_batch_size x dp = 8 x 3\n"
    )
    own = tmp_path / "own.yaml"
    own.write_text("model: tiny\nschedule: {global_batch_size: 0}\n")
    assert main("train", str(own), *data, "--steps", "-2") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tokenmill: error: {own}: 2 problems in the training config:\n")
    assert "  - --steps: must be at least 1, got -2\n" in err
    assert "  - schedule.global_batch_size (line 2): must be at least 1, got 0\n" in err
    assert not (tmp_path / "r").exists()


def test_resume_says_where_it_starts_and_when_there_is_nothing_to_do(
    shakespeare_shard: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import signal

    run = tmp_path / "run"
    argv = ["train", RECIPE, "--data", str(shakespeare_shard), "--out", str(run), "--no-progress"]
    assert main(*argv, "--steps", "4") == 0
    capsys.readouterr()
    step_4 = run / "checkpoints" / "step_4"
    before = read_metrics(run)

    # Without --resume a run directory that holds checkpoints is left as it is.
    assert main(*argv, "--steps", "4") == 1
    assert capsys.readouterr().err == (
        f"tokenmill: error: {run} already holds a run's checkpoints (latest {step_4}); rerun with --resume "
        "to continue it, or pass another --out to start a new run\n"
    )
    # Resumed with nothing left to train: one line, exit status 0, nothing written.
    assert main(*argv, "--steps", "4", "--resume") == 0
    assert capsys.readouterr().err == f"nothing to do: the run already reached its last step, 4 ({step_4})\n"
    assert main(*argv, "--steps", "2", "--resume") == 0
    assert capsys.readouterr().err == (
        f"tokenmill: WARNING: nothing to do: the checkpoint {step_4} is at step 4, past the 2 steps asked for "
        "(--steps, schedule.steps); ask for more than 4 steps to train further\n"
    )
    assert read_metrics(run) == before and (run / "checkpoints" / "latest").read_text().strip() == "step_4"

    # Ctrl-C (SIGINT after step 5): the hint names --resume and the checkpoint it continues from.
    monkeypatch.setenv("TOKENMILL_FAULT", "SIGINT@step=5")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        assert main(*argv, "--steps", "6", "--resume") == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"resuming from step 4 ({step_4})",
        f"tokenmill: interrupted; rerun with --resume to continue from the latest checkpoint ({step_4})",
    ]
    monkeypatch.delenv("TOKENMILL_FAULT")
    assert main(*argv, "--steps", "6", "--resume") == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"resuming from step 4 ({step_4})" and err[-1].startswith("trained to step 6: loss ")
    assert [r["step"] for r in read_metrics(run)] == [4, 5, 6]


def test_single_process_training_takes_the_free_cores(shakespeare_shard: Path, tmp_path: Path, monkeypatch) -> None:
    """`tokenmill train` on one device sets torch's threads as eval does: the cores free now
    (one on a busy machine, where torch's thread per core spins several times slower), and
    leaves OMP_NUM_THREADS, when set, to torch."""
    import torch

    from tokenmill.infra import cpu

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpu, "_cgroup_quota", lambda: None)
    data = ["--data", str(shakespeare_shard), "--steps", "1", "--no-progress"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # torch's default here: one per core
        monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))  # both cores busy
        assert main("train", RECIPE, *data, "--out", str(tmp_path / "busy")) == 0
        assert torch.get_num_threads() == 1
        monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # idle: both cores
        assert cpu.torch_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(2)
        assert main("train", RECIPE, *data, "--out", str(tmp_path / "omp")) == 0
        assert torch.get_num_threads() == 2  # as torch had it
    finally:
        torch.set_num_threads(before)
