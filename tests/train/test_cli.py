"""`tokenmill train` and `tokenmill export-hf` from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenmill.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "train-tiny.yaml")


def tokenmill(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def main(*args: str) -> int:
    from tokenmill.cli import main as tokenmill_main

    return tokenmill_main(list(args))


def test_train_tiny_recipe_then_resume_then_export(shakespeare_shard: Path, tmp_path: Path, capsys) -> None:
    """The smoke recipe in-process (shortened): checkpoints, metrics, --resume, export-hf."""
    run = tmp_path / "run"
    assert main("train", RECIPE, "--data", str(shakespeare_shard), "--out", str(run),
                "--steps", "12", "--no-progress") == 0
    records = read_metrics(run)
    assert [r["step"] for r in records] == [5, 10, 12] and records[-1]["loss"] < records[0]["loss"] - 0.5
    assert "val_loss" in records[-1] and "trained to step 12" in capsys.readouterr().out
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_12"
    assert list((run / "tensorboard").iterdir())
    # --steps extends the same run from its latest checkpoint.
    assert main("train", RECIPE, "--data", str(shakespeare_shard), "--out", str(run),
                "--steps", "14", "--resume", "--no-progress") == 0
    assert [r["step"] for r in read_metrics(run)] == [5, 10, 12, 14]
    assert main("export-hf", str(run), str(tmp_path / "hf")) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "config.json").is_file()


def test_cli_errors_are_one_line(shakespeare_shard: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\nmicro_batch: 4\n")
    assert main("train", str(bad), "--data", str(shakespeare_shard)) == 1
    assert "unknown key 'micro_batch'; did you mean 'micro_batch_size'?" in capsys.readouterr().err
    assert main("train", RECIPE, "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")) == 1
    assert "not found" in capsys.readouterr().err
    assert main("export-hf", str(tmp_path / "nowhere"), str(tmp_path / "hf")) == 1
    assert "no checkpoint at" in capsys.readouterr().err


@pytest.mark.slow
def test_train_tiny_recipe_subprocess_under_a_minute(shakespeare_shard: Path, tmp_path: Path) -> None:
    """`tokenmill train recipes/train-tiny.yaml --data P --out R` as users type it."""
    start = time.perf_counter()
    done = tokenmill("train", "recipes/train-tiny.yaml", "--data", str(shakespeare_shard), "--out", str(tmp_path / "r"))
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 60, f"took {elapsed:.1f} s"
    assert read_metrics(tmp_path / "r")[-1]["step"] == 40


@pytest.mark.parametrize("flag", ["--tp", "--dp"])
def test_parallel_flags_reach_the_config(flag: str) -> None:
    from tokenmill.train.cli import _train_argv, register
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "c.yaml", flag, "2", "--zero", "1", "--resume"])
    assert _train_argv(args) == ["train", "c.yaml", flag, "2", "--zero", "1", "--resume"]
