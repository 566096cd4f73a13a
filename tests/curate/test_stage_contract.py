"""The stage contract: atomic outputs, the accounting invariant, worker-count independence."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import pytest

from tokenmill.curate.documents import read_documents, write_documents
from tokenmill.curate.stage import Batch, StageOptions, reject, run_stage


@dataclass
class FailOnMarker(StageOptions):
    name = "fail_on_marker"

    def process(self, docs: pd.DataFrame) -> Batch:
        if docs["text"].str.contains("BOOM").any():
            raise ValueError("marker found")
        short = docs["text"].str.len() < 10
        return Batch(len(docs), docs[~short], reject(docs[short], "too_short"))


@dataclass
class LosesDocuments(StageOptions):
    name = "loses"

    def process(self, docs: pd.DataFrame) -> Batch:
        return Batch(len(docs), docs.iloc[1:], docs.iloc[:0].assign(reason=[]))


def make_input(tmp_path, texts_per_file):
    for index, texts in enumerate(texts_per_file):
        frame = pd.DataFrame({"id": [f"d{index}-{i}" for i in range(len(texts))], "text": texts, "source": "t"})
        write_documents(frame, tmp_path / "in" / f"f{index}.parquet")
    return tmp_path / "in"


def test_crashed_stage_leaves_no_output_and_keeps_the_previous_one(tmp_path, dask_client):
    good = make_input(tmp_path, [["short", "a long enough text"], ["another long text"]])
    first = run_stage(FailOnMarker(), good, tmp_path / "out", client=dask_client, progress=False)
    assert first["counts"] == {"in": 3, "kept": 2, "rejected": {"too_short": 1}}
    write_documents(pd.DataFrame({"id": ["x"], "text": ["BOOM here"], "source": ["t"]}), good / "f9.parquet")
    with pytest.raises(ValueError, match="marker found"):
        run_stage(FailOnMarker(), good, tmp_path / "out", client=dask_client, progress=False)
    # The previous output stays; the partitions that finished wait in a hidden partial
    # directory for a rerun to resume.
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".out.partial-"))
    assert left == ["in", "out"], left
    assert (tmp_path / "out" / "manifest.json").exists()
    assert first == json.loads((tmp_path / "out" / "manifest.json").read_text())


def test_a_stage_that_loses_documents_is_caught(tmp_path, dask_client):
    source = make_input(tmp_path, [["one", "two"]])
    with pytest.raises(RuntimeError, match="lost documents"):
        run_stage(LosesDocuments(), source, tmp_path / "out", client=dask_client, progress=False)
    assert not (tmp_path / "out").exists()


def test_runs_on_an_existing_cluster_given_by_its_address(tmp_path, dask_client):
    source = make_input(tmp_path, [["short", "a long enough text"]])
    address = dask_client.scheduler.address
    manifest = run_stage(FailOnMarker(), source, tmp_path / "out", scheduler=address, progress=False)
    assert manifest["counts"] == {"in": 2, "kept": 1, "rejected": {"too_short": 1}}
    assert manifest["timings"]["workers"] == 2


def test_unreachable_scheduler_is_a_clear_error(tmp_path, monkeypatch):
    from tokenmill.errors import TokenmillError

    monkeypatch.setattr("tokenmill.infra.cluster.SCHEDULER_CONNECT_TIMEOUT", "1s")  # nothing listens there

    source = make_input(tmp_path, [["a long enough text"]])
    with pytest.raises(TokenmillError, match="cannot reach the Dask scheduler"):
        run_stage(FailOnMarker(), source, tmp_path / "out", scheduler="tcp://127.0.0.1:1", progress=False)


def test_an_empty_partition_keeps_its_string_column_types(tmp_path):
    # Extra string columns (a web archive's url, date) of a partition that a stage emptied are
    # strings on disk, as in the partitions that hold rows, so the directory reads as one table.
    full = pd.DataFrame({"id": ["a"], "text": ["x"], "source": ["s"], "url": ["https://example.org/"]})
    write_documents(full, tmp_path / "parts" / "part-1.parquet")
    empty = read_documents(tmp_path / "parts" / "part-1.parquet").iloc[:0]
    write_documents(empty, tmp_path / "parts" / "part-0.parquet")  # read first: its schema leads
    combined = pd.read_parquet(tmp_path / "parts")
    assert combined["url"].tolist() == ["https://example.org/"]
