"""`tokenmill ablate` tells clean data from planted noise, and identical variants apart from
neither; bad input is one line before any proxy trains."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA
from tokenmill.cli import main

CORPUS = SHARED_DATA / "corpus"
# Each proxy: 80 steps of the tiny model on 8 x 64 tokens (a second or two on one core), scored
# on held-out text and on 8 examples of two of CORE's tasks.
PROXIES = (
    "proxies:\n  config: tiny\n  steps: 80\n  batch_size: 8\n  seq_len: 64\n  seeds: 3\n"
    f"  target: [target.jsonl, {{suite: core, tasks: [copa, piqa], limit: 8, data_dir: {SHARED_DATA}/eval/icl}}]\n"
)


def _articles(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [a.strip() for a in re.split(r"\n(?= = [^=])", text) if len(a.strip()) > 200]


def _write(path: Path, docs: list[str]) -> None:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wikipedia articles, the same with 30% of them replaced by their words shuffled, and a
    held-out target of other articles."""
    root = tmp_path_factory.mktemp("ablate")
    clean = _articles(CORPUS / "wikitext2_valid.txt")[:40]
    rng = random.Random(0)
    noisy = []
    for i, doc in enumerate(clean):
        if i % 10 < 3:
            words = doc.split()
            rng.shuffle(words)
            doc = " ".join(words)
        noisy.append(doc)
    _write(root / "clean.jsonl", clean)
    _write(root / "noisy.jsonl", noisy)
    _write(root / "target.jsonl", _articles(CORPUS / "wikitext2_test.txt")[:4])
    (root / "wiki.yaml").write_text(
        "name: wiki\nsources:\n  - {name: wiki, path: clean.jsonl, format: jsonl}\ntokenize: {vocab_size: 512}\n"
        + PROXIES
    )
    return root


def test_planted_noise_loses_with_a_verdict_and_identical_variants_do_not_differ(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = corpus / "work"
    argv = ["ablate", str(corpus / "wiki.yaml"), "--workdir", str(workdir), "--workers", "2", "--no-progress"]
    variants = ["--variant", "clean:", "--variant", "noisy: sources.wiki.path=noisy.jsonl", "--variant", "same:"]
    assert main(argv + variants) == 0
    out = capsys.readouterr().out
    assert re.search(r"^clean beats noisy by [0-9.]+ bits/byte", out, re.M), out
    assert re.search(r"^no difference between clean and same \(0.0000 bits/byte", out, re.M), out
    # The suite's score of each variant and its verdicts; identical variants score alike on it too.
    assert re.search(r"^noisy: core -?[0-9.]+ \(sd [0-9.]+ over 3 seeds\)$", out, re.M), out
    assert re.search(r"^no difference between clean and same \(0.0000 core score", out, re.M), out
    report = (workdir / "ablate.md").read_text()
    assert "clean beats noisy" in report and "no difference between clean and same" in report
    assert "| core score (mean) |" in report and "difference (core score)" in report
    html = (workdir / "ablate.html").read_text()
    assert 'class="error-bar"' in html and "training loss by variant" in html
    # The identical variant's curation was linked from the first one's, not run again.
    assert (workdir / "variants" / "same" / ".state" / "tokenize.encode.wiki.json").is_file()
    proxies = list((workdir / "proxies").glob("*.json"))
    assert len(proxies) == 6  # clean and same share their 3 proxies; noisy has 3

    # A second run finds every proxy done and says the same.
    assert main(argv + variants) == 0
    assert "clean beats noisy" in capsys.readouterr().out
    assert sorted((workdir / "proxies").glob("*.json")) == sorted(proxies)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--variant", "a:"], "compare at least two variants"),
        (["--variant", "a:", "--variant", "b: sources.nosuch.path=x"], "no sources item named 'nosuch'"),
        (["--variant", "a:", "--variant", "b: curate.filter.options.x=1"], "the recipe has no section 'curate'"),
        (["--variant", "a:", "--variant", "b: sources.wiki"], "'sources.wiki' is not key=value"),
        (["--variant", "a:", "--variant", "b:", "--target", "missing.txt"], "the target"),
        (["--variant", "a:", "--variant", "b:", "--steps", "100000"], "the proxy budget (51,200,000 tokens"),
    ],
)
def test_bad_input_is_one_line_before_any_proxy_trains(
    corpus: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["ablate", str(corpus / "wiki.yaml"), "--workdir", str(tmp_path / "w"), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert code != 0
    lines = [line for line in err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "w" / "proxies").exists()


def test_proxies_on_slurm_are_one_job_array_and_a_task_without_a_result_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenmill.errors import TokenmillError
    from tokenmill.infra.slurm import SlurmSpec
    from tokenmill.pipelines.proxies import ProxyJob, Shard, job_from_spec, run_proxies

    # Stand-ins for Slurm's clients: the array is accepted, then leaves the queue at once
    # without having trained anything (as tasks that failed would).
    commands, calls = tmp_path / "bin", tmp_path / "calls"
    commands.mkdir()
    for name, reply in (("sbatch", "echo 4242"), ("squeue", ""), ("scancel", "")):
        (commands / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{reply}\n')
        (commands / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{commands}{os.pathsep}{os.environ['PATH']}")
    target = tmp_path / "target.txt"
    target.write_text("held-out text")
    shard = Shard("wiki", str(tmp_path / "wiki"), "0" * 16, 1000)
    jobs = [ProxyJob(f"seed {s}", [shard], [1.0], s, {}, "tokenizer.json", [str(target)]) for s in (0, 1)]
    workdir = tmp_path / "work"
    with pytest.raises(TokenmillError) as error:
        run_proxies(jobs, workdir, 1, slurm=SlurmSpec(partition="cpu"))
    assert str(error.value).startswith(
        "proxies: 2 of 2 tasks of Slurm job array 4242 ended without a result (tasks 0, 1)"
    )
    script = (workdir / "slurm" / "proxies.sbatch").read_text()
    lines = script.splitlines()
    assert "#SBATCH --array=0-1" in lines and "#SBATCH --partition=cpu" in lines
    assert not any("--signal" in line for line in lines)  # a proxy has no checkpoint to stop at
    jobs_file = workdir / "slurm" / "proxies.json"
    assert lines[-1] == f'exec $PYTHON -m tokenmill.pipelines.proxies {jobs_file} "$SLURM_ARRAY_TASK_ID"'
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    listed = json.loads(jobs_file.read_text())
    assert [job_from_spec(spec).fingerprint for spec in listed["jobs"]] == [job.fingerprint for job in jobs]
    submitted = calls.read_text().splitlines()
    assert submitted[0].startswith("sbatch --parsable") and submitted[-1] == "scancel 4242"


def test_slurm_options_of_the_proxies_are_checked_before_any_work(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ablate", str(corpus / "wiki.yaml"), "--variant", "a:", "--variant", "b:", "--workdir", str(tmp_path / "w")]
    for extra, message in (
        (["--partition", "cpu"], "--partition needs --slurm"),
        (["--slurm", "--nodes", "2"], "each task of the array trains one proxy on one node"),
    ):
        assert main([*argv, "--no-progress", *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith("tokenmill: error: ") and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "w").exists()
