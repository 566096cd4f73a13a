"""A tiny recipe end to end on the real corpora: every step's output, skipping re-runs whose
fingerprints are unchanged, re-running exactly a changed stage and its dependents, the report
(rendered in headless Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.report import SECTIONS
from tokenmill.pipelines.runner import run_recipe

# Four runs of a 12-step recipe on a LocalCluster: about a minute on an idle 2-core machine.
pytestmark = pytest.mark.slow

RECIPE = """
name: tiny
sources:
  - name: wiki
    path: {corpus}/wikitext2_valid.txt
    format: text
    separator: '^(?= = [^=])'
  - name: plays
    path: {corpus}/tinyshakespeare.txt
    format: text
    separator: '\\n\\n'
curate:
  - stage: normalize
  - stage: langid
    options: {{languages: [en], min_score: {min_score}}}
  - stage: filter
    sources: [wiki]
    options: {{disable: [c4, gopher_quality]}}
  - stage: dedup
    name: exact_dedup
    sources: [plays]
    options: {{method: exact}}
  - stage: dedup
    name: fuzzy_dedup
    sources: [plays]
    options: {{method: fuzzy, threshold: 0.7, verify: true}}
  - stage: decontaminate
    sources: [wiki]
    options: {{data_dir: {eval}}}
tokenize: {{vocab_size: 320}}
blend:
  - {{source: wiki, weight: 0.6}}
  - {{source: plays, weight: 0.4}}
"""


def make_recipe(tmp_path: Path, shared_data: Path, min_score: float = 0.3) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus", eval=shared_data / "eval", min_score=min_score))
    )
    return path


def statuses(result) -> dict[str, str]:
    return {s.name: s.status for s in result.steps}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, shared_data, dask_client):
    tmp = tmp_path_factory.mktemp("run")
    recipe = load_recipe(make_recipe(tmp, shared_data))
    result = run_recipe(recipe, tmp / "work", progress=False, client=dask_client)
    return tmp, result


def test_every_step_runs_and_writes_its_outputs(first_run):
    tmp, result = first_run
    work = tmp / "work"
    assert set(statuses(result).values()) == {"ran"}
    assert list(statuses(result)) == [
        "ingest.wiki",
        "curate.wiki.normalize",
        "curate.wiki.langid",
        "curate.wiki.filter",
        "curate.wiki.decontaminate",
        "ingest.plays",
        "curate.plays.normalize",
        "curate.plays.langid",
        "curate.plays.exact_dedup",
        "curate.plays.fuzzy_dedup",
        "tokenize.tokenizer",
        "tokenize.encode.wiki",
        "tokenize.encode.plays",
        "tokenize.blend",
    ]
    # Each curation stage accounts for every document, and the next stage reads what it kept.
    for source, last in (("wiki", "04-decontaminate"), ("plays", "04-fuzzy_dedup")):
        previous_kept = None
        for stage_dir in sorted((work / "curate" / source).iterdir()):
            counts = json.loads((stage_dir / "manifest.json").read_text())["counts"]
            assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
            if previous_kept is not None:
                assert counts["in"] == previous_kept
            previous_kept = counts["kept"]
        assert stage_dir.name == last
        meta = json.loads((work / "shards" / source / f"{source}.json").read_text())
        assert meta["documents"] == previous_kept and meta["tokens"] > 10_000
        assert (work / "shards" / source / f"{source}.bin").stat().st_size == meta["tokens"] * 2  # uint16
    plays = json.loads((work / "curate" / "plays" / "03-exact_dedup" / "manifest.json").read_text())["counts"]
    assert plays["rejected"].get("exact_duplicate", 0) > 0  # repeated stage directions and songs
    decontaminated = json.loads((work / "curate" / "wiki" / "04-decontaminate" / "manifest.json").read_text())
    assert set(decontaminated["eval_tasks"]) >= {"piqa_valid", "winogrande_dev", "boolq_dev"}
    blend = json.loads((work / "blend" / "blend.json").read_text())
    assert [Path(b["prefix"]).name for b in blend] == ["wiki", "plays"]
    assert [b["weight"] for b in blend] == pytest.approx([0.6, 0.4])
    tokenizer = json.loads((work / "tokenizer" / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == 320


def test_report_has_every_section(first_run):
    tmp, result = first_run
    html = result.report_html.read_text()
    md = result.report_md.read_text()
    for key, title in SECTIONS:
        assert f'<section id="{key}">' in html
        assert f"## {title}" in md
    assert "gopher_repetition" in html or "fineweb" in html  # rejection reasons are listed
    assert "exact_duplicate" in md
    assert html.count("<svg") >= 3  # two length histograms and the blend chart
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # self-contained


def test_rerun_skips_everything_when_nothing_changed(first_run, shared_data, dask_client):
    tmp, _ = first_run
    recipe = load_recipe(make_recipe(tmp, shared_data))
    result = run_recipe(recipe, tmp / "work", progress=False, client=dask_client)
    assert set(statuses(result).values()) == {"skipped"}


def test_moved_work_directory_is_still_up_to_date(first_run, shared_data, dask_client):
    """Work-directory files hold paths relative to it: a copied directory runs as the original."""
    from tokenmill.tokenize.blend import load_blend_file

    tmp, _ = first_run
    moved = tmp / "elsewhere" / "work-copy"
    shutil.copytree(tmp / "work", moved)
    tokenizer_state = json.loads((moved / ".state" / "tokenize.tokenizer.json").read_text())
    assert (moved / tokenizer_state["result"]["path"]).is_file()
    assert str(tmp / "work") not in (moved / "blend" / "blend.json").read_text()
    blend = load_blend_file(moved / "blend" / "blend.json")
    assert [Path(entry.prefix).resolve() for entry in blend] == [
        (moved / "shards" / name / name).resolve() for name in ("wiki", "plays")
    ]
    recipe = load_recipe(make_recipe(tmp, shared_data))
    result = run_recipe(recipe, moved, progress=False, client=dask_client)
    assert set(statuses(result).values()) == {"skipped"}


def test_changed_stage_reruns_it_and_its_dependents_only(first_run, shared_data, dask_client):
    tmp, _ = first_run
    work = tmp / "work"
    before = (work / "curate" / "wiki" / "00-ingest" / "manifest.json").stat().st_mtime_ns
    recipe = load_recipe(make_recipe(tmp, shared_data, min_score=0.4))
    result = run_recipe(recipe, work, progress=False, client=dask_client)
    ran = {name for name, status in statuses(result).items() if status == "ran"}
    assert ran == {
        "curate.wiki.langid",
        "curate.wiki.filter",
        "curate.wiki.decontaminate",
        "curate.plays.langid",
        "curate.plays.exact_dedup",
        "curate.plays.fuzzy_dedup",
        "tokenize.tokenizer",
        "tokenize.encode.wiki",
        "tokenize.encode.plays",
        "tokenize.blend",
    }
    assert (work / "curate" / "wiki" / "00-ingest" / "manifest.json").stat().st_mtime_ns == before
    langid = json.loads((work / "curate" / "wiki" / "02-langid" / "manifest.json").read_text())
    assert langid["config"]["min_score"] == 0.4

    # --force re-runs the step and what depends on it, even with unchanged fingerprints.
    result = run_recipe(recipe, work, progress=False, client=dask_client, force=["tokenize.encode.plays"])
    assert {n for n, s in statuses(result).items() if s == "ran"} == {"tokenize.encode.plays", "tokenize.blend"}
    # --until stops early; --from re-runs from a step on.
    result = run_recipe(
        recipe,
        work,
        progress=False,
        client=dask_client,
        from_=["curate.plays.fuzzy_dedup"],
        until=["tokenize.encode.plays"],
    )
    assert {n for n, s in statuses(result).items() if s == "ran"} == {
        "curate.plays.fuzzy_dedup",
        "tokenize.tokenizer",
        "tokenize.encode.plays",
    }


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_report_renders_in_headless_chromium(first_run, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium); the report render test needs it")
    _, result = first_run
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-component-update",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = result.report_html.resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for key, title in SECTIONS:
        assert f'<section id="{key}"><h2>{title}</h2>' in dom.stdout
    assert dom.stdout.count("<svg") >= 3 and dom.stdout.count("<table>") >= 5
    shot = tmp_path / "report.png"
    render = subprocess.run(
        [*flags, "--window-size=1100,2400", f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120
    )
    assert render.returncode == 0, render.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a page with tables and charts, not a blank one


def test_quality_classifier_trained_in_the_run(tmp_path, shared_data, dask_client):
    """MT-NLG's classifier: trained on reference text (Wikipedia) against other text, then used
    by a `classify` stage of the same run."""
    corpus = shared_data / "corpus"
    path = tmp_path / "classify.yaml"
    path.write_text(
        textwrap.dedent(f"""
        sources:
          - {{name: wiki, path: {corpus}/wikitext2_valid.txt, format: text, separator: '^(?= = [^=])'}}
          - {{name: plays, path: {corpus}/tinyshakespeare.txt, format: text, separator: '\\n\\n'}}
        classifiers:
          - {{name: quality, positive: [wiki], negative: [plays], options: {{epoch: 5, holdout: 0.2}}}}
        curate:
          - stage: classify
            sources: [plays]
            options: {{classifier: quality, threshold: 0.5}}
    """)
    )
    result = run_recipe(load_recipe(path), tmp_path / "work", progress=False, client=dask_client)
    assert statuses(result) == {
        "ingest.wiki": "ran",
        "ingest.plays": "ran",
        "classifier.quality": "ran",
        "curate.plays.classify": "ran",
    }
    meta = json.loads((tmp_path / "work" / "classifiers" / "quality" / "model.json").read_text())
    assert meta["holdout_accuracy"] > 0.9  # encyclopaedia against verse is easy to tell apart
    manifest = json.loads((tmp_path / "work" / "curate" / "plays" / "01-classify" / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    assert sum(counts["rejected"].values()) > counts["kept"]  # most verse is not Wikipedia-like
