"""The work directory stays consistent when two `tokenmill run` start on it at once (one wins,
the other stops naming the winner's pid) and when its disk fills up (a one-line error, every
earlier output byte for byte intact, and a re-run after freeing space finishes). The full disk
is a real one: a small tmpfs mounted for the test (root only; skipped elsewhere)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

RECIPE = """
name: faults
sources:
  - name: wiki
    path: {corpus}/wikitext2_valid.txt
    format: text
    separator: '^(?= = [^=])'
curate:
  - stage: normalize
tokenize: {{vocab_size: 300}}
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _run_command(recipe: Path, workdir: Path) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", "run", str(recipe), "--workdir", str(workdir), "--no-progress"]


def run(recipe: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [*_run_command(recipe, workdir), "--workers", "1", *extra]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600)


def snapshot(workdir: Path) -> dict[str, str]:
    """Every output file's digest (the run's bookkeeping aside: .state/, the recipe as run, the report)."""
    return {
        str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(workdir.rglob("*"))
        if p.is_file()
        and p.relative_to(workdir).parts[0] != ".state"
        and p.name not in ("recipe.json", "report.md", "report.html")
    }


@pytest.fixture
def recipe(tmp_path: Path, shared_data: Path) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus")))
    return path


def test_two_runs_started_at_once_one_wins_the_other_names_its_pid(recipe, tmp_path):
    work = tmp_path / "work"
    command = [*_run_command(recipe, work), "--workers", "1"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())]
    runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()))
    outputs = [r.communicate(timeout=600) for r in runs]
    codes = [r.returncode for r in runs]
    assert sorted(codes) == [0, 1], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    error = outputs[loser][1]
    assert error.strip() == (
        f"tokenmill: error: another tokenmill run (pid {runs[winner].pid}) is using {work};"
        " wait for it or use another --workdir"
    )
    assert outputs[loser][0] == ""  # it ran no step
    # The winner's outputs are whole: a third run finds every step up to date.
    states = sorted(p.name for p in (work / ".state").glob("*.json"))
    assert states == [
        "curate.wiki.normalize.json",
        "ingest.wiki.json",
        "tokenize.encode.wiki.json",
        "tokenize.tokenizer.json",
    ]
    for stage in ("00-ingest", "01-normalize"):
        counts = json.loads((work / "curate" / "wiki" / stage / "manifest.json").read_text())["counts"]
        assert counts["in"] == counts["kept"] + sum(counts["rejected"].values()) and counts["kept"] > 0
    again = run(recipe, work)
    assert again.returncode == 0, again.stderr
    assert "0 step(s) ran, 4 up to date" in again.stderr


def test_full_disk_is_a_clear_error_and_leaves_the_previous_outputs(recipe, small_disk, fill_disk):
    work = small_disk / "work"
    first = run(recipe, work)
    assert first.returncode == 0, first.stderr
    before = snapshot(work)
    assert any(name.startswith("tokenizer/") for name in before)

    filler = fill_disk(small_disk, leave=64 * 1024)  # room for the bookkeeping, not for a stage's output
    # A changed stage option: normalize and the tokenizer after it must be redone, on a full disk.
    recipe.write_text(
        recipe.read_text().replace("  - stage: normalize\n", "  - stage: normalize\n    options: {whitespace: false}\n")
    )
    full = run(recipe, work)
    assert full.returncode == 1, full.stdout[-2000:] + full.stderr[-2000:]
    # One line: the Dask worker's log of its failed task is silenced, the command reports it.
    assert "Traceback (most recent call last)" not in full.stderr
    assert "Compute Failed" not in full.stderr
    errors = [line for line in full.stderr.splitlines() if line.startswith("tokenmill: error:")]
    assert len(errors) == 1 and "curate.wiki.normalize: no space left on the device" in errors[0], full.stderr
    assert "previous outputs are intact" in errors[0]
    assert snapshot(work) == before  # nothing half-written, nothing lost
    assert not list(work.rglob(".*tmp*"))

    filler.unlink()
    resumed = run(recipe, work)
    assert resumed.returncode == 0, resumed.stderr
    assert "3 step(s) ran, 1 up to date" in resumed.stderr
    after = snapshot(work)
    assert set(after) == set(before)
    assert after["curate/wiki/00-ingest/manifest.json"] == before["curate/wiki/00-ingest/manifest.json"]
