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
