"""A training run directory on a bucket: checkpoints uploaded as they complete (shards first,
meta.json, then latest), and a resume on a machine with an empty cache that continues from the
bucket with the losses of an uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from shard_writing import add_each

from tokenmill.infra import storage
from tokenmill.tokenize.indexed import IndexedDatasetWriter
from tokenmill.train.checkpoint_files import CheckpointError, list_checkpoints
from tokenmill.train.config import TrainConfig
from tokenmill.train.loop import train
from tokenmill.train.metrics import read_metrics
from tokenmill.train.model_config import preset

EOD = 256


@pytest.fixture
def byte_shard(shared_data: Path, tmp_path: Path) -> Path:
    """Shakespeare's paragraphs as byte-level tokens, each closed by EOD."""
    text = (shared_data / "corpus" / "tinyshakespeare.txt").read_bytes()[:200_000]
    prefix = tmp_path / "shard" / "plays"
    writer = IndexedDatasetWriter(prefix, np.uint16)
    paragraphs = [p for p in text.split(b"\n\n") if p.strip()]
    add_each(writer, [np.append(np.frombuffer(paragraph, dtype=np.uint8), EOD) for paragraph in paragraphs])
    writer.finalize()
    Path(f"{prefix}.json").write_text(json.dumps({"vocab_size": EOD + 1, "eod_id": EOD}))
    return prefix


def _names(url: str) -> set[str]:
    """Every object under ``url``, hidden ones (DCP's .metadata) included, relative to it."""
    fs, inner = storage.filesystem(url)
    return {name[len(inner) :].lstrip("/") for name in fs.find(inner)}


@pytest.fixture
def config(tiny_train_config, byte_shard):
    """``config(out, steps, **checkpoint keys)``: checkpoints every 2 steps, the last 2 kept;
    dropout, so that resuming must restore the RNG too."""

    def make(out: str, steps: int, **checkpoint) -> TrainConfig:
        return tiny_train_config(
            str(byte_shard),
            out,
            model=preset("tiny", max_seq_len=32, dropout=0.1),
            schedule={"steps": steps, "global_batch_size": 8, "warmup_steps": 2},
            optimizer={"min_lr": 3e-4},
            checkpoint={"interval": 2, "keep_last": 2, **checkpoint},
        )

    return make


def test_a_run_on_a_bucket_resumes_from_an_empty_cache(bucket, config, tmp_path) -> None:
    full = train(config(str(tmp_path / "full"), 7))

    url = f"{bucket}/runs/tiny"
    first = train(config(url, 3))
    assert first.step == 3
    names = _names(url)
    # keep_last 2: step_2 and step_3 on the bucket, as on disk; nothing temporary left.
    assert {n.split("/")[1] for n in names if n.startswith("checkpoints/step_")} == {"step_2", "step_3"}
    assert {"checkpoints/latest", "metrics.jsonl", "config.yaml", "checkpoints/step_3/meta.json"} <= names
    assert storage.read_text(f"{url}/checkpoints/latest").strip() == "step_3"
    meta = json.loads(storage.read_text(f"{url}/checkpoints/step_3/meta.json"))
    assert meta["step"] == 3 and set(meta["files"]) <= {n.split("/")[-1] for n in names if "step_3" in n}

    # Another machine: no local copy of the run at all.
    shutil.rmtree(storage.cache_dir_for(url, "runs"))
    resumed = train(config(url, 7), resume=True)
    assert resumed.step == 7 and min(resumed.losses) == 4
    for step in range(4, 8):
        assert resumed.losses[step] == full.losses[step], step
    assert storage.read_text(f"{url}/checkpoints/latest").strip() == "step_7"
    # metrics.jsonl on the bucket holds every step once: 1-3 from the first run, 4-7 resumed.
    local_metrics = storage.cache_dir_for(url, "runs") / "metrics.jsonl"
    local_metrics.unlink()
    (tmp_path / "bucket-run").mkdir()
    (tmp_path / "bucket-run" / "metrics.jsonl").write_bytes(storage.read_bytes(f"{url}/metrics.jsonl"))
    rows = read_metrics(tmp_path / "bucket-run")
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(tmp_path / "full")]
    # The cache holds the checkpoints of this machine's part of the run, pruned the same way.
    assert [p.name for p in list_checkpoints(storage.cache_dir_for(url, "runs"))] == ["step_6", "step_7"]
    assert {n.split("/")[1] for n in _names(url) if n.startswith("checkpoints/step_")} == {"step_6", "step_7"}


def test_background_checkpoints_are_uploaded_before_the_run_ends(bucket, config) -> None:
    url = f"{bucket}/runs/async"
    result = train(config(url, 4, async_save=True))
    assert result.step == 4
    assert storage.read_text(f"{url}/checkpoints/latest").strip() == "step_4"
    assert {n.split("/")[1] for n in _names(url) if n.startswith("checkpoints/step_")} == {"step_2", "step_4"}
    meta = json.loads(storage.read_text(f"{url}/checkpoints/step_4/meta.json"))
    for name, entry in meta["files"].items():
        assert storage.size(f"{url}/checkpoints/step_4/{name}") == entry["bytes"]
    # A checkpoint URL is not a --resume path: the run's URL is.
    with pytest.raises(CheckpointError, match="resumed with --out URL --resume"):
        train(config(url, 6), resume=f"{url}/checkpoints/step_4")
