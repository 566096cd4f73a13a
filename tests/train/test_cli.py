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
    assert capsys.readouterr().err == f"tokenmill: error: {bad}: steps: moved; write schedule.steps\n"
    assert main("train", RECIPE, "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")) == 1
    assert "not found" in capsys.readouterr().err
    assert main("export-hf", str(tmp_path / "nowhere"), str(tmp_path / "hf")) == 1
    assert "no checkpoint at" in capsys.readouterr().err


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


def test_unknown_recipe_name_lists_the_bundled_ones(tmp_path: Path) -> None:
    done = tokenmill("train", "tinny", "--data", "x", cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tokenmill: error:") and "'tinny'" in line and "tiny" in line.split("'tinny'")[1]


@pytest.mark.parametrize("flag", ["--tp", "--dp"])
def test_parallel_flags_reach_the_config(flag: str) -> None:
    import argparse

    from tokenmill.train.cli import _train_argv, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "c.yaml", flag, "2", "--zero", "1", "--resume"])
    assert _train_argv(args) == ["train", "c.yaml", flag, "2", "--zero", "1", "--resume"]
