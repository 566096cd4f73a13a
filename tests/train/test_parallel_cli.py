"""From the command line: `tokenmill train tiny ... --tp 2 --pp 2 --dp 2 --zero 3` with sequence
parallelism logs the same losses and gradient norms as the single-process run (8 processes,
CPU, gloo).

The vocabulary is fixed here: taken from the data it is padded to a multiple of 128 x tp, so
runs with different tp would train different models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def fixed_vocab_recipe(directory: Path, sequence_parallel: bool = False) -> Path:
    config = yaml.safe_load((ROOT / "tokenmill" / "recipes" / "train-tiny.yaml").read_text())
    config["model"]["vocab_size"] = 512
    config["parallel"]["sequence_parallel"] = sequence_parallel
    path = directory / f"tiny-512{'-sp' if sequence_parallel else ''}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(shard: Path, out: Path, *flags: str, sequence_parallel: bool = False) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "tokenmill.cli",
        "train",
        str(fixed_vocab_recipe(out.parent, sequence_parallel)),
        "--data",
        str(shard),
        "--out",
        str(out),
        "--steps",
        "10",
        "--no-progress",
        *flags,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.distributed
def test_cli_3d_parallel_logs_single_process_losses_and_grad_norms(shakespeare_shard: Path, tmp_path: Path) -> None:
    single = train(shakespeare_shard, tmp_path / "single")
    layout = ("--tp", "2", "--pp", "2", "--dp", "2", "--zero", "3")
    parallel = train(shakespeare_shard, tmp_path / "3d", *layout, sequence_parallel=True)
    want = [(r["step"], r["loss"], r["grad_norm"]) for r in single if "loss" in r]
    got = [(r["step"], r["loss"], r["grad_norm"]) for r in parallel if "loss" in r]
    assert [s for s, _, _ in got] == [s for s, _, _ in want] and want
    for (_, loss, norm), (_, single_loss, single_norm) in zip(got, want):
        assert loss == pytest.approx(single_loss, rel=1e-5)
        # metrics.jsonl's norm (the one clipping used), to float32 rounding
        assert norm == pytest.approx(single_norm, rel=1e-5)


def test_cli_uneven_context_parallel_split_is_one_line_before_any_worker(
    shakespeare_shard: Path, tmp_path: Path, capsys
) -> None:
    from tokenmill.cli import main

    code = main(["train", "tiny", "--data", str(shakespeare_shard), "--out", str(tmp_path / "run"), "--cp", "3"])
    err = capsys.readouterr().err
    assert code == 1
    assert (
        err
        == "tokenmill: error: --cp: seq_len 128 does not split into 2 x cp = 6 equal chunks (load-balanced causal split)\n"
    )
    assert not (tmp_path / "run").exists()  # nothing started
