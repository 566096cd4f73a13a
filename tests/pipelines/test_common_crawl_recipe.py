"""The bundled `common-crawl` recipe end to end on the shared WARCs, run as a user runs it: from a
directory beside ../shared/data, with a blocklist file there."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.runner import format_plan, run_recipe
from tokenmill.recipes import resolve_recipe

pytestmark = pytest.mark.slow

STEPS = [
    "ingest.cc",
    "curate.cc.extract",
    "curate.cc.langid",
    "curate.cc.url-filter",
    "curate.cc.pii",
    "curate.cc.filter",
    "curate.cc.exact_dedup",
    "tokenize.tokenizer",
    "tokenize.encode.cc",
    "tokenize.blend",
]


def test_common_crawl_recipe_from_warcs_to_tokens(tmp_path, shared_data, dask_client) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(shared_data.resolve(), target_is_directory=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "url-blocklist.txt").write_text("# a personal site of the wget sample\nkyleclo.com\n")
    path, bundled = resolve_recipe("common-crawl")
    assert bundled
    recipe = load_recipe(path, base_dir=project)
    result = run_recipe(recipe, project / "work", progress=False, client=dask_client)
    assert [s.name for s in result.steps] == STEPS and {s.status for s in result.steps} == {"ran"}

    work = project / "work"
    stage_dirs = sorted((work / "curate" / "cc").iterdir())
    ingest = json.loads((stage_dirs[0] / "manifest.json").read_text())
    # Every shared archive's HTML responses and the WET record; the WAT file and the licence
    # are unknown_format, the cut-off archive one truncated_archive.
    assert ingest["counts"] == {"in": 87, "kept": 84, "rejected": {"unknown_format": 2, "truncated_archive": 1}}
    previous_kept = ingest["counts"]["kept"]
    manifests = {}
    for stage_dir in stage_dirs[1:]:
        manifest = json.loads((stage_dir / "manifest.json").read_text())
        counts = manifest["counts"]
        assert counts["in"] == previous_kept == counts["kept"] + sum(counts["rejected"].values()), stage_dir.name
        previous_kept = counts["kept"]
        manifests[stage_dir.name.split("-", 1)[1]] = manifest
    assert list(manifests) == ["extract", "langid", "url-filter", "pii", "filter", "exact_dedup"]
    assert manifests["extract"]["stats"]["extracted"] == 83  # all but the WET record, passed through
    assert manifests["langid"]["counts"]["rejected"]["langid.language"] > 30  # Chinese, Russian, ... pages
    assert manifests["url-filter"]["counts"]["rejected"] == {"url.blocklist:url-blocklist": 2}
    kept = pd.concat(
        pd.read_parquet(f) for f in sorted((work / "curate" / "cc" / "06-exact_dedup" / "kept").glob("*.parquet"))
    )
    assert len(kept) == previous_kept > 10
    assert not kept["url"].str.contains("kyleclo.com").any() and kept["url"].str.startswith("http").all()
    assert not kept["text"].str.contains("<div", regex=False).any() and kept["title"].notna().all()

    meta = json.loads((work / "shards" / "cc" / "cc.json").read_text())
    assert meta["documents"] == previous_kept and meta["tokens"] > 10_000
    assert (work / "shards" / "cc" / "cc.bin").stat().st_size == meta["tokens"] * 2

    # ingest .. filter ran in one pass: ingest wrote no HTML, only filter wrote kept documents,
    # and every stage its rejected ones as ids and reasons.
    fused = ["ingest", "extract", "langid", "url-filter", "pii", "filter"]
    one_pass = " -> ".join(["ingest.cc", *(f"curate.cc.{stage}" for stage in fused[1:])])
    assert format_plan(recipe, work).count(f"one pass: {one_pass}") == len(fused)  # what --dry-run shows
    assert ingest["chain"]["stages"] == fused and all(
        manifests[stage]["chain"]["stages"] == fused for stage in fused[1:]
    )
    assert [d.name for d in stage_dirs if list(d.glob("kept/*"))] == ["05-filter", "06-exact_dedup"]
    rejected = pd.read_parquet(next((work / "curate" / "cc").glob("*-url-filter")) / "rejected")
    assert list(rejected.columns) == ["id", "reason"] and len(rejected) == 2

    # A changed filter reruns from the filter, its stages before it replayed in memory from
    # the WARC files (their directories untouched).
    before = {d.name: (d / "manifest.json").stat().st_mtime_ns for d in stage_dirs}
    recipe.curate[4].options = {"disable": ["c4"]}
    rerun = run_recipe(recipe, project / "work", until=["curate.cc.filter"], progress=False, client=dask_client)
    assert [s.name for s in rerun.steps if s.status == "ran"] == ["curate.cc.filter"]
    after = {d.name: (d / "manifest.json").stat().st_mtime_ns for d in stage_dirs}
    assert {name for name in before if before[name] != after[name]} == {"05-filter"}
    refiltered = json.loads((work / "curate" / "cc" / "05-filter" / "manifest.json").read_text())
    counts = refiltered["counts"]
    assert counts["in"] == manifests["pii"]["counts"]["kept"] == counts["kept"] + sum(counts["rejected"].values())
    assert (
        refiltered["config"]["rules"]["c4"]["enabled"] is False
        and manifests["filter"]["counts"]["rejected"]["c4.min_sentences"]
    )
    assert not [reason for reason in counts["rejected"] if reason.startswith("c4.")]
