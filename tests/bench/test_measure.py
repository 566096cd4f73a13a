"""bench/measure.py: the load check every bench makes first, interleaved rounds, and the median
and spread they report; bench/minhash.py end to end on a few documents, bench/warc_read.py on
the shared WARCs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH.parent))

from bench import measure  # noqa: E402


def test_the_load_check_says_when_the_machine_is_busy(monkeypatch, capsys) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.2, 0.1))
    quiet = measure.check_load()
    assert quiet == "load average 0.3 (1 min) on 2 cores before the run"
    monkeypatch.setattr(os, "getloadavg", lambda: (12.5, 14.0, 16.0))
    busy = measure.check_load("after the run")
    assert busy.startswith("load average 12.5 (1 min) on 2 cores after the run: BUSY (quiet is <= 0.5)")
    assert capsys.readouterr().out.splitlines() == [quiet, busy]


def test_contenders_run_in_turn_and_report_their_median_and_spread() -> None:
    calls: list[str] = []
    clock_values = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0, 6.0, 8.0, 8.0, 12.0, 12.0, 13.0])

    def contender(name: str):
        return lambda: calls.append(name) or name

    timings, results = measure.interleaved(
        {"a": contender("a"), "b": contender("b")}, repeat=3, clock=lambda: next(clock_values)
    )
    assert calls == ["a", "b", "a", "b", "a", "b"]  # round after round, not one side then the other
    assert results == {"a": "a", "b": "b"}
    assert timings["a"].seconds == [1.0, 2.0, 4.0] and timings["b"].seconds == [3.0, 2.0, 1.0]
    assert timings["a"].median == 2.0 and timings["a"].spread == pytest.approx(1.5)  # (4 - 1) / 2
    assert measure.Timing([1.0, 2.0, 3.0, 10.0]).median == 2.5  # the mean of the middle two
    assert str(timings["b"]) == "median 2.000s, spread 100% over 3 runs"
    calls.clear()
    measure.interleaved({"a": contender("a"), "b": contender("b")}, repeat=3, alternate=True)
    assert calls == ["a", "b", "b", "a", "a", "b"]  # every other round reversed


def test_minhash_bench_checks_the_load_and_prints_medians(capsys) -> None:
    pytest.importorskip("datasketch")
    from bench import minhash

    assert minhash.main(["--docs", "10", "--repeats", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("load average ") and " before the run" in out[0]
    assert "medians of 3 interleaved rounds" in "\n".join(out)
    assert out[-1].startswith("load average ") and " after the run" in out[-1]
    assert "signatures equal to datasketch: yes (affine32, legacy)" in out


def test_warc_read_bench_runs_its_readers_interleaved_and_reports_the_ratio_of_medians(shared_data, tmp_path) -> None:
    import subprocess

    pytest.importorskip("fastwarc")
    pytest.importorskip("warcio")
    out = tmp_path / "warc_read.txt"
    command = [sys.executable, str(BENCH / "warc_read.py"), "--repeat", "1", "--rounds", "2", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("load average ") and " before the run" in lines[0]
    assert "1 passes in one process per round, 2 rounds interleaved" in lines[1]
    for reader in ("fastwarc", "warcio"):
        (row,) = [line for line in lines if line.startswith(f"  {reader} ")]
        assert "peak RSS" in row and "over 2 runs)" in row and "median " in row and "spread " in row
    assert lines[-2].startswith("fastwarc / warcio: ") and lines[-2].endswith("(ratio of the medians)")
    assert lines[-1].startswith("load average ") and " after the run" in lines[-1]
