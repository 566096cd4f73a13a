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
from typing import Any

import pytest

from bench.mix import TRUE_BLEND, build_known_blend, l1_distance
from tests.conftest import REPO_ROOT, SHARED_DATA
from tokenmill.cli import main
from tokenmill.pipelines.mix import apply_blend, features, mixture_job, sample_mixtures, select_model

MIXTURES = 10
STEPS = 60
CHECK_SEEDS = 2  # each check blend's runs: the fewest that measure a spread


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
    return build_known_blend(
        tmp_path_factory.mktemp("mix") / "corpus", chars=150_000, target_chars=20_000, check_seeds=CHECK_SEEDS
    )


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
    # The check blends, each retrained at the check seeds: | blend | mean | sd | per seed | ...
    checks = {
        m.group(1): [float(s) for s in m.group(2).split(", ")]
        for m in re.finditer(
            r"^\| (chosen|uniform|token-proportional|best proxy \([^)]*\)) \| [0-9.]+ \| [0-9.e-]+ \| ([0-9., ]+) \|",
            text,
            re.M,
        )
    }
    assert len(checks) == 4 and all(len(s) == CHECK_SEEDS for s in checks.values()), text
    best_proxy = next(name for name in checks if name.startswith("best proxy"))
    # The best proxy's blend is retrained at the check seeds, not taken at its recorded (luckiest) score.
    recorded = {p["label"]: p["target_bpb"] for p in _results(uninterrupted).values()}[best_proxy[12:-1]]
    assert recorded not in checks[best_proxy], (recorded, checks)
    assert re.search(r"^chosen beats uniform by [0-9.]+ target bits/byte \(noise [0-9.]+\)$", text, re.M), text
    assert re.search(r"^chosen beats token-proportional by ", text, re.M), text
    # The best of a few small proxies lands near the optimum: the choice beats its blend or ties it
    # within the seed noise, never loses to it beyond the noise.
    verdicts = [line for line in text.splitlines() if best_proxy in line and "chosen" in line]
    assert len(verdicts) == 1 and not verdicts[0].startswith(f"{best_proxy} beats"), text
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
    # The uninterrupted run's shards, linked, and the records of half its proxies, as an earlier
    # run would have left them: the killed run trains a few more and is killed while they train.
    shutil.copytree(uninterrupted / "data", workdir / "data", copy_function=os.link)
    (workdir / "proxies").mkdir()
    earlier = sorted(
        (r for r in (uninterrupted / "proxies").glob("*.json") if " seed " not in json.loads(r.read_text())["label"]),
        key=lambda r: json.loads(r.read_text())["label"],
    )[: MIXTURES // 2]
    for record in earlier:
        os.link(record, workdir / "proxies" / record.name)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenmill", *_mix_argv(known["recipe"], workdir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its proxy workers are in its process group
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list((workdir / "proxies").glob("*.json"))) < len(earlier) + 2:
        assert process.poll() is None, "mix finished before it could be killed"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    finished = {p: p.stat().st_mtime_ns for p in (workdir / "proxies").glob("*.json")}
    assert len(earlier) + 2 <= len(finished) < MIXTURES
    # The check runs are found by fingerprint, as a later run reuses any proxy it shares: linked
    # from the uninterrupted run, they are reused only if the resumed run chooses the same blend.
    for record in (uninterrupted / "proxies").glob("*.json"):
        if " seed " in json.loads(record.read_text())["label"]:
            os.link(record, workdir / "proxies" / record.name)

    assert main(_mix_argv(known["recipe"], workdir)) == 0
    err = capsys.readouterr().err
    assert f"proxies: {len(finished)} of {MIXTURES} found done" in err, err
    assert f"proxies: {4 * CHECK_SEEDS} of {4 * CHECK_SEEDS} found done" in err, err
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # not trained again
    # The same proxies, measured the same, and the same choice as a run never stopped.
    ours, theirs = _results(workdir), _results(uninterrupted)
    assert {k: v["target_bpb"] for k, v in ours.items()} == {k: v["target_bpb"] for k, v in theirs.items()}
    assert _chosen(workdir / "mix.md") == _chosen(uninterrupted / "mix.md") != {}


def test_mix_with_a_suite_as_its_target_chooses_by_the_suite_score(
    known: dict[str, Path], uninterrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dask_client: Any
) -> None:
    # The uninterrupted run's shards, linked: only the proxies train (tiny ones), as tasks of the
    # Dask cluster the recipe's `scheduler:` names.
    workdir = tmp_path / "suite"
    shutil.copytree(uninterrupted / "data", workdir / "data", copy_function=os.link)
    suite = f"{{suite: core, tasks: [copa], limit: 6, data_dir: {SHARED_DATA}/eval/icl}}"
    recipe = known["recipe"].with_name("suite.yaml")
    address = dask_client.scheduler.address
    text = known["recipe"].read_text().replace("target: target.jsonl", f"target: {suite}")
    recipe.write_text(f"scheduler: {address}\n" + text.replace(f"check_seeds: {CHECK_SEEDS}", "check_seeds: 1"))
    argv = ["mix", str(recipe), "--workdir", str(workdir), "--mixtures", "4", "--steps", "4"]
    assert main([*argv, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert f"proxies: 4 tasks on the Dask cluster at {address}" in err, err
    assert re.search(r"^chosen: -?[0-9.]+ core score \(sd 0.0000 over 1 seeds\)$", out, re.M), out
    proxies = [p for p in _results(workdir).values() if p["label"].startswith("mixture-")]
    assert len(proxies) == 4 and all(p["target_bpb"] is None and p["suite_tasks"].keys() == {"copa"} for p in proxies)
    # Higher is better: the best proxy is the one with the highest score (the first on a tie).
    best = max(sorted(proxies, key=lambda p: p["label"]), key=lambda p: p["suite_score"])
    report = (workdir / "mix.md").read_text()
    assert f"The best proxy, {best['label']}, recorded {best['suite_score']:.4f} core score" in report, report
    assert f"| best proxy ({best['label']}) |" in report and "| blend | core score (mean) |" in report


def _three_proxy_jobs(known: dict[str, Path], uninterrupted: Path, tmp_path: Path, steps: int) -> tuple[Any, list]:
    """The recipe and three proxy jobs of `steps` steps on the uninterrupted run's shards, linked."""
    from tokenmill.pipelines.proxies import proxy_config, tokenize_recipe
    from tokenmill.pipelines.recipe import load_recipe

    shutil.copytree(uninterrupted / "data", tmp_path / "data", copy_function=os.link)
    recipe = load_recipe(known["recipe"])
    data = tokenize_recipe(recipe, tmp_path / "data", progress=False)
    config = proxy_config(recipe, steps=steps)
    shares = data.token_shares()
    return recipe, [mixture_job(m, data, config, 0, [str(known["target"])]) for m in sample_mixtures(shares, 3, seed=0)]


def test_proxies_on_a_dask_cluster_equal_the_local_ones_and_a_rerun_trains_only_the_unfinished(
    known: dict[str, Path], uninterrupted: Path, tmp_path: Path, dask_client: Any
) -> None:
    from distributed import get_task_stream

    from tokenmill.infra.slurm import SlurmSpec
    from tokenmill.pipelines.proxies import proxy_scheduler, run_proxies

    recipe, jobs = _three_proxy_jobs(known, uninterrupted, tmp_path, steps=4)
    local = run_proxies(jobs, tmp_path / "local", 1)
    # A Dask run stopped after its first proxy finished: that one's record is there.
    first = tmp_path / "dask" / "proxies" / f"{jobs[0].fingerprint}.json"
    first.parent.mkdir(parents=True)
    shutil.copy(tmp_path / "local" / "proxies" / first.name, first)
    kept = first.stat().st_mtime_ns
    address = dask_client.scheduler.address
    with get_task_stream(dask_client) as tasks:
        remote = run_proxies(jobs, tmp_path / "dask", 1, scheduler=address)
    # One task for each proxy without a record; each wrote its record, the same as the local run's.
    assert len({t["key"] for t in tasks.data if str(t["key"]).startswith("proxies-")}) == 2, tasks.data
    assert first.stat().st_mtime_ns == kept
    assert all((tmp_path / "dask" / "proxies" / f"{job.fingerprint}.json").is_file() for job in jobs)
    measured = [
        {fp: (r["target_bpb"], r["source_loss"], r["curve"]) for fp, r in run.items()} for run in (local, remote)
    ]
    assert measured[0] == measured[1] and len(measured[0]) == 3
    # The recipe's `scheduler:` is where the proxies train when no flag says otherwise, unless on Slurm.
    named = recipe.model_copy(update={"scheduler": address})
    assert proxy_scheduler(named, None, None) == address and proxy_scheduler(named, None, SlurmSpec()) is None
    assert proxy_scheduler(recipe, "tcp://elsewhere:8786", None) == "tcp://elsewhere:8786"


@pytest.mark.distributed
def test_a_scheduler_lost_while_proxies_train_is_one_line_keeping_the_finished(
    known: dict[str, Path], uninterrupted: Path, tmp_path: Path
) -> None:
    from curate.dask_processes import cluster

    from tokenmill.errors import SchedulerLostError
    from tokenmill.pipelines.proxies import run_proxies

    _, jobs = _three_proxy_jobs(known, uninterrupted, tmp_path, steps=2)
    processes = cluster(tmp_path / "dask", workers=1)

    def first_finished(job: Any, record: dict[str, Any]) -> None:  # SIGKILL the scheduler then
        os.kill(processes.scheduler.pid, signal.SIGKILL)
        processes.scheduler.wait()

    try:
        with pytest.raises(SchedulerLostError) as lost:
            run_proxies(jobs, tmp_path / "work", 1, on_result=first_finished, scheduler=processes.address)
    finally:
        processes.close()
    recorded = list((tmp_path / "work" / "proxies").glob("*.json"))
    assert str(lost.value) == (
        f"lost the Dask scheduler at {processes.address} during the proxies' training; 1 of 3 proxies finished"
        f" and are recorded in {tmp_path / 'work' / 'proxies'}; restart the scheduler and workers and rerun to resume"
    )
    assert 1 <= len(recorded) <= 2  # the worker may finish the proxy it was training


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
        ("", ["--scheduler", "tcp://127.0.0.1:1", "--slurm"], "on a Dask cluster or a Slurm job array, not both"),
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
