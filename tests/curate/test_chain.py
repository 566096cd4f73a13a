"""`tokenmill curate chain`: per-document stages in one pass over the shared WARCs write what the
same stages write run one by one (kept documents, each stage's counts, stats and rejections
with their reasons), resume per partition after an interruption, and write rejected documents
whole, as ids or not at all."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pandas.testing import assert_frame_equal

from tokenmill.cli import main
from tokenmill.curate.filter import FilterStage
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.runner import run_recipe
from tokenmill.recipes import resolve_recipe

# The common-crawl recipe's per-document stages, after ingest.
STAGES = ["extract", "langid", "url-filter", "pii", "filter"]
OPTIONS = {"langid": ["--languages", "en"], "url-filter": ["--blocklist", "BLOCKLIST"]}


class FilterFailingOnItsThirdBatch(FilterStage):
    """The filter with its default options, failing once on its third batch (a class of this
    module: Dask pickles it by name)."""

    batches = 0

    def process(self, docs: pd.DataFrame):
        type(self).batches += 1
        if type(self).batches == 3:
            raise RuntimeError("worker lost")
        return super().process(docs)


def read_sorted(directory: Path) -> pd.DataFrame:
    frame = pd.concat([pd.read_parquet(path) for path in sorted(directory.glob("*.parquet"))], ignore_index=True)
    return frame.sort_values("id", ignore_index=True)


def manifest(stage_dir: Path) -> dict:
    return json.loads((stage_dir / "manifest.json").read_text())


def chain(dask_client, input: Path | str, output: Path, stages: list[str], *options: str) -> int:
    argv = ["curate", "chain", "--stages", ",".join(stages), "--input", str(input), "--output", str(output)]
    return main([*argv, *options, "--scheduler", dask_client.scheduler.address, "--no-progress"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data, dask_client, curate_cli) -> dict[str, Path]:
    """The WARCs through ingest and the recipe's stages in one pass, rejected documents whole and
    every stage's kept documents written (`fused/`), then the same stages one by one from the
    pass's ingested documents (`one_by_one/NN-STAGE`)."""
    root = tmp_path_factory.mktemp("chain")
    # A project beside ../shared/data with the common-crawl recipe's blocklist, for the recipe too.
    (root / "shared").mkdir()
    (root / "shared" / "data").symlink_to(shared_data.resolve(), target_is_directory=True)
    (root / "project").mkdir()
    blocklist = root / "project" / "url-blocklist.txt"
    blocklist.write_text("kyleclo.com\n")
    fused_options = ["--rejected", "whole", "--keep-intermediate", "--option", "langid.languages=[en]"]
    fused_options += ["--option", f"url-filter.blocklist=[{blocklist}]", "--option", "ingest.source=cc"]
    assert chain(dask_client, shared_data / "web" / "warc", root / "fused", ["ingest", *STAGES], *fused_options) == 0
    previous = root / "fused" / "01-ingest"
    for position, stage in enumerate(STAGES, start=2):
        output = root / "one_by_one" / f"{position:02d}-{stage}"
        flags = [str(blocklist) if flag == "BLOCKLIST" else flag for flag in OPTIONS.get(stage, [])]
        assert curate_cli(stage, previous, output, *flags) == 0
        previous = output
    return {"root": root, "one_by_one": root / "one_by_one", "fused": root / "fused", "blocklist": blocklist}


@pytest.mark.slow
def test_a_chain_writes_what_its_stages_write_one_by_one(runs) -> None:
    fused = {path.name.split("-", 1)[1]: path for path in sorted(runs["fused"].iterdir())}
    assert list(fused) == ["ingest", *STAGES]
    assert manifest(fused["ingest"])["counts"] == {
        "in": 87,
        "kept": 84,
        "rejected": {"truncated_archive": 1, "unknown_format": 2},
    }
    alone = {path.name.split("-", 1)[1]: path for path in sorted(runs["one_by_one"].iterdir())}
    for stage in STAGES:
        got, want = manifest(fused[stage]), manifest(alone[stage])
        counts = got["counts"]
        assert counts == want["counts"] and counts["in"] == counts["kept"] + sum(counts["rejected"].values()), stage
        # The extractor processes a worker started depend on how batches reach it, nothing else.
        assert {k: v for k, v in got["stats"].items() if k != "extractor_processes"} == {
            k: v for k, v in want["stats"].items() if k != "extractor_processes"
        }, stage
        assert got["config"] == want["config"] and got["upstream"] == want["upstream"], stage
        assert got["chain"] == {"stages": ["ingest", *STAGES], "kept_written": True, "rejected": "whole"}
        assert_frame_equal(read_sorted(fused[stage] / "kept"), read_sorted(alone[stage] / "kept"))
        if counts["rejected"] or want["counts"]["rejected"]:
            assert_frame_equal(read_sorted(fused[stage] / "rejected"), read_sorted(alone[stage] / "rejected"))
    assert sum(manifest(fused["langid"])["counts"]["rejected"].values()) > 30  # a real test: stages reject
    assert manifest(fused["url-filter"])["counts"]["rejected"] == {"url.blocklist:url-blocklist": 2}


@pytest.mark.slow
def test_rejected_documents_as_ids_or_counts_only(runs, dask_client, capsys) -> None:
    """From the extracted documents: rejected/ holds each rejected document's id and reason
    (`ids`, the default), the same ids and reasons the whole documents carry, or nothing (`none`)."""
    extracted = runs["fused"] / "02-extract"
    stages = STAGES[1:]
    blocklist = runs["blocklist"]
    options = ["--option", "langid.languages=[en]", "--option", f"url-filter.blocklist=[{blocklist}]"]
    assert chain(dask_client, extracted, runs["root"] / "ids", stages, *options) == 0
    assert chain(dask_client, extracted, runs["root"] / "none", stages, "--rejected", "none", *options) == 0
    for position, stage in enumerate(stages, start=1):
        ids = runs["root"] / "ids" / f"{position:02d}-{stage}"
        nothing = runs["root"] / "none" / f"{position:02d}-{stage}"
        assert manifest(ids)["counts"] == manifest(nothing)["counts"]
        assert manifest(ids)["chain"]["rejected"] == "ids"
        assert not list((nothing / "rejected").glob("*.parquet"))
        if manifest(ids)["counts"]["rejected"]:
            rejected = read_sorted(ids / "rejected")
            assert list(rejected.columns) == ["id", "reason"]
            # One small file per partition: ids sorted, no Arrow schema or statistics in its footer.
            for path in (ids / "rejected").glob("*.parquet"):
                assert re.fullmatch(r"part-\d{5}\.parquet", path.name), path.name
                ids_file = pq.ParquetFile(path)
                assert b"ARROW:schema" not in (ids_file.metadata.metadata or {})
                assert not ids_file.metadata.row_group(0).column(0).is_stats_set
                assert list(pd.read_parquet(path)["id"]) == sorted(pd.read_parquet(path)["id"])
            whole = read_sorted(runs["fused"] / f"{position + 2:02d}-{stage}" / "rejected")
            assert_frame_equal(rejected, whole[["id", "reason"]])
    assert_frame_equal(read_sorted(runs["root"] / "ids" / "04-filter" / "kept"), read_sorted(nothing / "kept"))
    # Only the end of the chain writes kept documents; a stage inside it says so when read.
    inside = runs["root"] / "ids" / "03-pii"
    assert manifest(inside)["chain"]["kept_written"] is False and not list((inside / "kept").glob("*"))
    assert main(["curate", "normalize", "--input", str(inside), "--output", str(runs["root"] / "x")]) == 1
    assert "--keep-intermediate" in capsys.readouterr().err


@pytest.mark.slow
def test_the_common_crawl_recipe_curates_what_its_stages_write_one_by_one(runs, dask_client) -> None:
    """The bundled recipe runs ingest .. filter in one pass from the WARC files (ingest writes no
    HTML, each stage its rejected documents as ids) and keeps and rejects what the same stages
    run one by one keep and reject, for the same reasons."""
    path, _ = resolve_recipe("common-crawl")
    recipe = load_recipe(path, base_dir=runs["root"] / "project")
    work = runs["root"] / "project" / "work"
    result = run_recipe(recipe, work, until=["curate.cc.filter"], progress=False, client=dask_client)
    assert [s.name for s in result.steps if s.status == "ran"] == ["ingest.cc", *(f"curate.cc.{s}" for s in STAGES)]
    recipe_dirs = sorted((work / "curate" / "cc").iterdir())
    alone = [runs["fused"] / "01-ingest", *sorted(runs["one_by_one"].iterdir())]
    assert [d.name.split("-", 1)[1] for d in recipe_dirs] == ["ingest", *STAGES]
    for got_dir, want_dir in zip(recipe_dirs, alone):
        got, want = manifest(got_dir), manifest(want_dir)
        assert got["counts"] == want["counts"] and got["config"] == want["config"], got_dir.name
        assert got["chain"] == {
            "stages": ["ingest", *STAGES],
            "kept_written": got_dir == recipe_dirs[-1],
            "rejected": "ids",
        }
        if got["counts"]["rejected"]:
            assert_frame_equal(read_sorted(got_dir / "rejected"), read_sorted(want_dir / "rejected")[["id", "reason"]])
    assert not (recipe_dirs[0] / "kept").exists() or not list((recipe_dirs[0] / "kept").iterdir())
    assert_frame_equal(read_sorted(recipe_dirs[-1] / "kept"), read_sorted(alone[-1] / "kept"))


@pytest.mark.slow
def test_an_interrupted_chain_resumes_its_finished_partitions(runs) -> None:
    """A pass led by ingest over the WARC files (a partition per archive, as in the common-crawl
    recipe) whose last stage fails on a partition after others finished (a worker's error, in
    one thread here): the rerun keeps the finished partitions' files in every stage, ingest's
    included, runs the others, and publishes what an undisturbed pass publishes."""
    from distributed import Client

    from tokenmill.curate.chain import parse_stages, run_stages
    from tokenmill.curate.registry import all_stages

    warcs = runs["root"] / "shared" / "data" / "web" / "warc"
    stages = ["ingest", "langid", "pii", "filter"]
    outputs = [runs["root"] / "resumed" / f"{n:02d}-{stage}" for n, stage in enumerate(stages, start=1)]
    expected = [runs["root"] / "undisturbed" / path.name for path in outputs]
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        *leading, _ = parse_stages(",".join(stages), ["langid.languages=[en]"])
        run_stages([*leading, (all_stages()["filter"], FilterStage())], warcs, expected, client=client)
        failing = [*leading, (all_stages()["filter"], FilterFailingOnItsThirdBatch())]
        with pytest.raises(RuntimeError, match="worker lost"):
            run_stages(failing, warcs, outputs, client=client)
        # Partitions already running when the failure ended the command finish in these worker
        # threads (a real command's process would have exited): count them once they are done.
        deadline = time.monotonic() + 120
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        partials = [next(path.parent.glob(f".{path.name}.partial-*")) for path in outputs]
        finished = {path.name for path in (partials[-1] / ".tasks").glob("task-*.json")}
        n_partitions = manifest(expected[0])["partitions"]
        assert 2 <= len(finished) < n_partitions and all(
            {p.name for p in (d / ".tasks").glob("*")} >= finished for d in partials
        )
        before = {
            (link, sub, path.name): path.stat().st_ino
            for link, partial in enumerate(partials)
            for sub in ("kept", "rejected")
            for path in (partial / sub).glob("part-*.parquet")
        }
        manifests = run_stages(failing, warcs, outputs, client=client)  # its third batch is past
    assert [m["resumed_partitions"] for m in manifests] == [len(finished)] * len(stages)
    for output, want in zip(outputs, expected):
        assert manifest(output)["counts"] == manifest(want)["counts"]
        for sub in ("kept", "rejected"):
            if list((want / sub).glob("*.parquet")):
                assert_frame_equal(read_sorted(output / sub), read_sorted(want / sub))
    # The finished partitions' parts are the very files the interrupted pass wrote, in every stage.
    finished_parts = {key: inode for key, inode in before.items() if f"task-{key[2][5:10]}.json" in finished}
    assert finished_parts
    for (link, sub, name), inode in finished_parts.items():
        assert (outputs[link] / sub / name).stat().st_ino == inode


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stages", "extract,dedup"], "stage `dedup` cannot follow another in a chain"),
        (["--stages", "extract,filtr"], "--stages: unknown stage filtr"),
        (["--stages", "extract", "--option", "extract.extractr=lean"], "options of `extract`: extractr"),
        (["--stages", "extract", "--option", "filter.disable=[c4]"], "`filter` is not one of --stages"),
    ],
)
def test_a_wrong_chain_is_one_line_before_any_work(tmp_path, capsys, argv, message) -> None:
    output = tmp_path / "out"
    assert main(["curate", "chain", *argv, "--input", str(tmp_path), "--output", str(output)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("tokenmill: error:") and message in error and "\n" not in error
    assert not output.exists()
