"""bench/train_mfu.py --smoke: the GPU throughput bench runs end to end on the CPU."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "train_mfu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("train_mfu", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_smoke_runs_our_engine_and_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    out = tmp_path / "mfu.txt"
    rows = bench.main(["--smoke", "--no-torchtitan", "--peak-tflops", "1", "--repeat", "2", "--out", str(out)])
    assert [(r.shape, r.mode, r.impl) for r in rows] == [("tiny", "bf16", "ours"), ("tiny", "float8", "ours")]
    bf16 = rows[0]
    assert bf16.error is None and bf16.tokens_per_s > 0 and math.isfinite(bf16.loss)
    assert len(bf16.seconds) == 2 and bf16.tokens_per_s == bf16.tokens_per_step / bf16.timing.median
    # The smoke model's head is untied: both conventions count it.
    assert bf16.mfu() == bf16.mfu(titan_convention=True) > 0
    # float8 runs where torchao is installed; without it the row fails in one line and the run goes on.
    f8 = rows[1]
    assert f8.error is None or "install it" in f8.error
    text = out.read_text()
    assert text.startswith("# bench/train_mfu.py on cpu, torch ")
    assert "# command: " in text and "--smoke" in text
    assert "ours tok/s" in text and " tiny bf16 " in text
    assert text.splitlines()[-1] in capsys.readouterr().out  # printed as well, table last


def test_time_budget_skips_the_remaining_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rows = load_bench().main(["--smoke", "--no-torchtitan", "--time-budget", "1e-9"])
    assert rows == []
    assert "skipped tiny bf16, tiny float8" in capsys.readouterr().out


def test_document_masking_rows_and_both_mfu_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    rows = bench.main(["--smoke", "--no-torchtitan", "--modes", "bf16", "--document-masking", "--repeat", "2"])
    assert rows[0].error is None and len(rows[0].seconds) == 2
    assert "; document masking" in capsys.readouterr().out
    tokens = bench.sample_rows(512, 2, 64, __import__("torch").Generator().manual_seed(0), documents=True)
    assert ((tokens == bench.EOD_ID).sum(1) >= 1).all()  # every row holds several documents
    tied = bench.Row("1b", "bf16", "ours", tokens_per_step=1, seconds=[1.0], peak=1.0)
    model = bench.preset("llama-1b")
    tied.flops_per_token, tied.flops_per_token_titan = model.flops_per_token(), model.flops_per_token(tied_head=False)
    assert tied.mfu() - tied.mfu(titan_convention=True) == 6 * model.hidden * model.vocab_size


def test_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_bench().main(["--smoke", "--modes", "fp4"])
    assert "--modes: unknown fp4" in capsys.readouterr().err
