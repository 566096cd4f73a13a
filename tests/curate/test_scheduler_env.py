"""Without `--scheduler`, a stage runs on the cluster named by Dask's own DASK_SCHEDULER_ADDRESS."""

from __future__ import annotations

import json

import distributed
import pandas as pd

from tokenmill.cli import main
from tokenmill.curate.documents import write_documents


def test_dask_scheduler_address_sends_a_stage_to_that_cluster(tmp_path, dask_client, monkeypatch):
    texts = ["Caf\u00c3\u00a9 au lait is served hot.", "Plain ASCII text stays as it is.", ""]
    frame = pd.DataFrame({"id": ["a", "b", "c"], "text": texts, "source": "test"})
    write_documents(frame, tmp_path / "in" / "part-0.parquet")

    def no_local_cluster(*args, **kwargs):
        raise AssertionError("started a LocalCluster although DASK_SCHEDULER_ADDRESS names a scheduler")

    monkeypatch.setattr(distributed, "LocalCluster", no_local_cluster)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_client.scheduler.address)
    argv = ["curate", "normalize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    assert main([*argv, "--no-progress"]) == 0
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]
    assert counts["in"] == 3 and counts["kept"] + sum(counts["rejected"].values()) == 3
    kept = pd.read_parquet(tmp_path / "out" / "kept")
    assert "Café au lait is served hot." in set(kept["text"])


def test_relative_paths_reach_workers_in_another_directory(tmp_path, dask_client, monkeypatch, shared_data):
    """The session cluster's workers run in the test's starting directory, not in tmp_path: a
    stage given relative paths (its input and a file option) must hand them on absolute."""
    task = [json.loads(line) for line in (shared_data / "eval" / "piqa_valid.jsonl").open()][:20]
    (tmp_path / "piqa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in task))
    quoted = f"Some advice on chores. {task[0]['goal']} {task[0]['sol1']} That is all there is to it."
    texts = [quoted, "An unrelated paragraph about the weather in spring, which was mild and wet this year."]
    frame = pd.DataFrame({"id": ["a", "b"], "text": texts, "source": "test"})
    write_documents(frame, tmp_path / "in" / "part-0.parquet")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_client.scheduler.address)
    argv = ["curate", "decontaminate", "--input", "in", "--output", "out", "--task", "piqa.jsonl"]
    assert main([*argv, "--no-progress"]) == 0
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]
    assert counts["in"] == 2 and counts["kept"] == 1
    assert [reason.startswith("contaminated:") for reason in counts["rejected"]] == [True]


def test_ingest_of_relative_files_and_directories_on_a_cluster(tmp_path, dask_client, monkeypatch):
    """Ingest reads raw files on the workers too: relative inputs, a file and a directory, are
    read there, not found missing or corrupt."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("A first plain text document.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "A document in JSON lines."}) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_client.scheduler.address)
    argv = ["curate", "ingest", "--input", "notes", "b.jsonl", "--output", "out", "--no-progress"]
    assert main(argv) == 0
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]
    assert counts == {"in": 2, "kept": 2, "rejected": {}}
    kept = pd.read_parquet(tmp_path / "out" / "kept")
    assert sorted(kept["text"]) == ["A document in JSON lines.", "A first plain text document.\n"]
