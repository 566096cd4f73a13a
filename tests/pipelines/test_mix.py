"""`tokenmill mix` finds a known blend (a small version of bench/mix.py), resumes a killed run
without retraining what finished, and refuses bad input in one line before any proxy trains."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.mix import TRUE_BLEND, build_known_blend, l1_distance
from tests.conftest import REPO_ROOT, SHARED_DATA
from tokenmill.cli import main
from tokenmill.pipelines.mix import apply_blend, features, sample_mixtures, select_model
from tokenmill.pipelines.report import number_cell

MIXTURES = 12
STEPS = 100
SEED_NOISE = 0.02  # twice the spread of a proxy's target over seeds (tests/pipelines/test_ablate.py)


def _mix_argv(recipe: Path, workdir: Path) -> list[str]:
    return ["mix", str(recipe), "--workdir", str(workdir), "--mixtures", str(MIXTURES), "--steps", str(STEPS)] + [
        "--workers",
        "2",
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return build_known_blend(tmp_path_factory.mktemp("mix") / "corpus", chars=150_000, target_chars=20_000)


@pytest.fixture(scope="module")
def uninterrupted(known: dict[str, Path]) -> Path:
    workdir = known["recipe"].parent.parent / "uninterrupted"
    assert main(_mix_argv(known["recipe"], workdir)) == 0
    return workdir


def _results(workdir: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (workdir / "proxies").glob("*.json")}


def _chosen(report: Path) -> dict[str, float]:
    """The chosen weights from the report's table (source | chosen | token-proportional | uniform ...)."""
    rows = re.finditer(r"^\| (\w+) \| ([0-9.]+) \| [0-9.]+ \| [0-9.]+ \|", report.read_text(), re.M)
    return {m.group(1): float(m.group(2)) for m in rows}


def test_mix_finds_a_blend_better_than_the_obvious_ones(known: dict[str, Path], uninterrupted: Path) -> None:
    text = (uninterrupted / "mix.md").read_text()
    targets = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r"^\| (chosen|uniform|token-proportional|best proxy \([^)]*\)) \| ([0-9.]+) \|", text, re.M
        )
    }
    assert set(targets) >= {"chosen", "uniform", "token-proportional"} and len(targets) == 4, text
    best_proxy = next(v for k, v in targets.items() if k.startswith("best proxy"))
    assert targets["chosen"] < min(targets["uniform"], targets["token-proportional"]), targets
    # The best of 12 small proxies is partly the luckiest one: at this size the choice beats it or
    # ties it within the seed-to-seed noise (about 0.01 bits/byte); bench/mix.py shows the margin.
    assert targets["chosen"] < best_proxy + SEED_NOISE, targets
    rho = float(re.search(r"over \d+ proxies: (-?[0-9]+\.[0-9]+)", text).group(1))
    assert rho >= 0.5, rho
    chosen = _chosen(uninterrupted / "mix.md")
    assert set(chosen) == set(TRUE_BLEND) and abs(sum(chosen.values()) - 1) < 1e-3
    print(f"rank correlation {rho:.3f}; L1 distance to the true blend {l1_distance(chosen):.3f}; chosen {chosen}")
    # The sources the target holds most of get the most weight; the one it lacks gets least.
    assert chosen["wiki"] > chosen["shakespeare"] > chosen["howto"], chosen
    assert "data:image/svg+xml" in text
    written = known["recipe"].with_name("sources-mixed.yaml").read_text()
    assert "blend:" in written and f"weight: {chosen['wiki']:.4f}".rstrip("0") in written


def test_a_killed_mix_reruns_only_the_unfinished_proxies_and_equals_an_uninterrupted_run(
    known: dict[str, Path], uninterrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenmill", *_mix_argv(known["recipe"], workdir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its proxy workers are in its process group
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list((workdir / "proxies").glob("*.json"))) < 3:
        assert process.poll() is None, "mix finished before it could be killed"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    finished = {p: p.stat().st_mtime_ns for p in (workdir / "proxies").glob("*.json")}
    assert 3 <= len(finished) < MIXTURES

    assert main(_mix_argv(known["recipe"], workdir)) == 0
    err = capsys.readouterr().err
    assert f"proxies: {len(finished)} of {MIXTURES} found done" in err, err
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # not trained again
    # The same proxies, measured the same, and the same choice as a run never stopped.
    ours, theirs = _results(workdir), _results(uninterrupted)
    assert {k: v["target_bpb"] for k, v in ours.items()} == {k: v["target_bpb"] for k, v in theirs.items()}
    assert _chosen(workdir / "mix.md") == _chosen(uninterrupted / "mix.md") != {}


def test_mix_with_a_suite_as_its_target_chooses_by_the_suite_score(
    known: dict[str, Path], uninterrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The uninterrupted run's shards, linked: only the proxies train (tiny ones, in this process).
    workdir = tmp_path / "suite"
    shutil.copytree(uninterrupted / "data", workdir / "data", copy_function=os.link)
    suite = f"{{suite: core, tasks: [copa], limit: 6, data_dir: {SHARED_DATA}/eval/icl}}"
    recipe = known["recipe"].with_name("suite.yaml")
    recipe.write_text(known["recipe"].read_text().replace("target: target.jsonl", f"target: {suite}"))
    argv = ["mix", str(recipe), "--workdir", str(workdir), "--mixtures", "4", "--steps", "4", "--workers", "1"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^chosen: -?[0-9.]+ core score$", out, re.M), out
    proxies = [p for p in _results(workdir).values() if p["label"].startswith("mixture-")]
    assert len(proxies) == 4 and all(p["target_bpb"] is None and p["suite_tasks"].keys() == {"copa"} for p in proxies)
    # Higher is better: the best proxy is the one with the highest score (the first on a tie).
    best = max(sorted(proxies, key=lambda p: p["label"]), key=lambda p: p["suite_score"])
    report = (workdir / "mix.md").read_text()
    assert f"| best proxy ({best['label']}) | {number_cell(best['suite_score'])} |" in report, report
    assert "| blend | core score |" in report


def test_more_mixtures_keep_the_first_ones() -> None:
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    first, more = sample_mixtures(shares, 8, seed=3), sample_mixtures(shares, 12, seed=3)
    assert [m.weights for m in more[:8]] == [m.weights for m in first]
    assert all(abs(sum(m.weights.values()) - 1) < 1e-3 for m in more)
    assert len({tuple(m.weights.values()) for m in more}) == 12


def test_the_regression_that_ranks_the_held_out_proxies_best_is_used() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(3), 24)
    x = features(weights)
    additive = 3 + x @ np.array([0.1, 0.2, 0.05]) + rng.normal(0, 0.01, len(weights))
    assert select_model(weights, additive)[0] == "additive"
    # Two sources that help each other: the pairwise model ranks the held-out proxies better.
    interacting = additive + 0.1 * x[:, 0] * x[:, 1]
    model, correlations = select_model(weights, interacting)
    assert model == "interactions" and correlations["interactions"] > correlations["additive"], correlations
    # With fewer than two proxies per coefficient (9 for 3 sources) it is not tried at all.
    model, correlations = select_model(weights[:17], interacting[:17])
    assert model == "additive" and set(correlations) == {"additive"}


def test_apply_replaces_only_the_blend_block(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: r  # kept\nsources: []\nblend:\n  - {source: a, weight: 1}\n  - {source: b, weight: 1}\n# after\ntrain: {}\n"
    )
    apply_blend(recipe, {"a": 0.75, "b": 0.25})
    assert recipe.read_text() == (
        "name: r  # kept\nsources: []\nblend:\n  - {source: a, weight: 0.7500}\n  - {source: b, weight: 0.2500}\n# after\ntrain: {}\n"
    )


@pytest.mark.parametrize(
    ("recipe_extra", "argv", "message"),
    [
        ("", ["--mixture", "wiki=0.5,shakespeare=0.4"], "the weights sum to 0.9, not 1"),
        ("", ["--target", "missing.txt"], "the target"),
        ("", ["--mixtures", "2"], "too few to fit"),
        ("", ["--steps", "100000"], "is larger than its"),
        ("one", [], "a mixture needs at least two"),
    ],
)
def test_bad_input_is_one_line_before_any_proxy_trains(
    known: dict[str, Path],
    tmp_path: Path,
    recipe_extra: str,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recipe = known["recipe"]
    if recipe_extra == "one":
        recipe = known["recipe"].parent / "one.yaml"
        text = known["recipe"].read_text()
        recipe.write_text(re.sub(r"  - \{name: (shakespeare|pydocs|howto).*\n", "", text))
    code = main(["mix", str(recipe), "--workdir", str(tmp_path / "w"), "--no-progress", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tokenmill: error:")]
    assert code != 0 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "w" / "proxies").exists()
