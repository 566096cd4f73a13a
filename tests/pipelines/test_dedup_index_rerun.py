"""A recipe whose dedup stage has `index:` (a directory the first run creates) keeps, when that
step runs again (`--from`, `--force`, a changed upstream option), what it kept the first time:
its own documents in the index are not taken for duplicates of themselves, and the index does
not grow. What the step adds to the index does not make it out of date."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench.synthetic import wikitext_articles
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.runner import run_recipe

pytestmark = pytest.mark.slow

RECIPE = """
name: indexed
sources:
  - name: docs
    path: {docs}
    format: jsonl
    id_field: id
curate:
  - stage: normalize
    options: {{fix_unicode: {fix_unicode}}}
  - stage: dedup
    options: {{method: exact, index: {index}}}
"""
DEDUP = "curate.docs.dedup"


def _recipe(tmp_path: Path, fix_unicode: bool):
    path = tmp_path / "indexed.yaml"
    text = RECIPE.format(docs=tmp_path / "docs.jsonl", index=tmp_path / "index", fix_unicode=str(fix_unicode).lower())
    path.write_text(textwrap.dedent(text))
    return load_recipe(path)


def _outcome(work: Path) -> tuple[list[str], dict[str, str]]:
    stage = next((work / "curate" / "docs").glob("*-dedup"))
    kept = pd.read_parquet(stage / "kept")
    rejected = pd.read_parquet(stage / "rejected")
    return sorted(kept["id"]), dict(zip(rejected["id"], rejected["kept_id"]))


def _index(index: Path) -> tuple[int, int, list[int]]:
    """Documents index.json counts, its batches, and the rows of each file it lists."""
    meta = json.loads((index / "index.json").read_text())
    return meta["documents"], len(meta["batches"]), [pq.ParquetFile(index / f).metadata.num_rows for f in meta["files"]]


def test_a_rerun_dedup_step_keeps_what_it_kept_the_first_time(tmp_path, shared_data, dask_client):
    articles = wikitext_articles(shared_data / "corpus" / "wikitext2_valid.txt")[:30]
    # 30 articles and 6 copies of some of them: 30 kept, 6 rejected.
    texts = articles + articles[:6]
    with (tmp_path / "docs.jsonl").open("w") as out:
        for i, text in enumerate(texts):
            out.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    work = tmp_path / "work"
    run = {"progress": False, "report": False, "client": dask_client}

    first = run_recipe(_recipe(tmp_path, True), work, **run)
    assert {s.name: s.status for s in first.steps}[DEDUP] == "ran"
    kept, rejected = _outcome(work)
    assert len(kept) == 30 and len(rejected) == 6
    documents, batches, rows = _index(tmp_path / "index")
    assert documents == sum(rows) == 30 and batches == 1 and all(rows)
    # What the step added to its index does not put it out of date.
    again = run_recipe(_recipe(tmp_path, True), work, **run)
    assert {s.status for s in again.steps} == {"skipped"}

    for how in ({"from_": [DEDUP]}, {"force": [DEDUP]}):
        result = run_recipe(_recipe(tmp_path, True), work, **run, **how)
        assert {s.name: s.status for s in result.steps}[DEDUP] == "ran", how
        assert _outcome(work) == (kept, rejected), how
        assert _index(tmp_path / "index") == (documents, batches, rows), how

    # A changed upstream option: the step's inputs are new files, so this is another run of
    # the step; it replaces the step's batch of the index instead of querying it.
    result = run_recipe(_recipe(tmp_path, False), work, **run)
    ran = {s.name for s in result.steps if s.status == "ran"}
    assert ran == {"curate.docs.normalize", DEDUP}
    assert _outcome(work) == (kept, rejected)
    documents, batches, rows = _index(tmp_path / "index")
    assert documents == sum(rows) == 30 and batches == 1 and all(rows)
    assert len(list((tmp_path / "index" / "hashes").iterdir())) == len(rows)  # the replaced files are gone
