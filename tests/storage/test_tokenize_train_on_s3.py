"""Tokenization and training with the data on a bucket: a tokenizer trained from and written to
it, shards encoded onto it (resuming the finished partitions after an interruption), and a
short training run reading the shards through the local cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tokenmill.curate.documents import write_documents
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.tokenize.encode import encode_documents, read_shard_metadata
from tokenmill.tokenize.indexed import IndexedDataset
from tokenmill.tokenize.loader import resolve_blend
from tokenmill.tokenize.tokenizer import train_tokenizer

pytestmark = pytest.mark.slow


def _documents(shared_data: Path, bucket: str) -> str:
    """Shakespeare's paragraphs as three Parquet files on the bucket."""
    import re

    text = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    for part in range(3):
        chunk = paragraphs[part::3]
        frame = pd.DataFrame({"id": [f"p{part}-{i}" for i in range(len(chunk))], "text": chunk, "source": "plays"})
        write_documents(frame, f"{bucket}/docs/part-{part}.parquet")
    return f"{bucket}/docs"


def test_encode_onto_a_bucket_and_train_from_its_cache(
    bucket, shared_data, s3_dask_client, tmp_path, capsys, tiny_train_config
) -> None:
    docs = _documents(shared_data, bucket)
    tokenizer_url = train_tokenizer(docs, 300, f"{bucket}/tok/tokenizer.json")
    assert tokenizer_url == f"{bucket}/tok/tokenizer.json"
    assert json.loads(storage.read_text(f"{tokenizer_url}.meta.json"))["vocab_size"] == 300

    prefix = f"{bucket}/shards/plays"
    meta = encode_documents(docs, tokenizer_url, prefix, client=s3_dask_client, progress=False, rows_per_partition=100)
    assert meta["prefix"] == prefix and meta["tokenizer"]["path"] == tokenizer_url
    assert {p for _, p in storage.list_files(f"{bucket}/shards")} == {"plays.bin", "plays.idx", "plays.json"}
    assert read_shard_metadata(prefix)["tokens"] == meta["tokens"] > 10_000

    # The same documents encoded from local files give the same shard, byte for byte.
    local_docs = tmp_path / "docs"
    for name, relative in storage.list_files(docs):
        (local_docs / relative).parent.mkdir(parents=True, exist_ok=True)
        (local_docs / relative).write_bytes(storage.read_bytes(name))
    (tmp_path / "tokenizer.json").write_bytes(storage.read_bytes(tokenizer_url))
    encode_documents(
        local_docs,
        tmp_path / "tokenizer.json",
        tmp_path / "plays",
        client=s3_dask_client,
        progress=False,
        rows_per_partition=100,
    )
    assert (tmp_path / "plays.bin").read_bytes() == storage.read_bytes(f"{prefix}.bin")
    assert (tmp_path / "plays.idx").read_bytes() == storage.read_bytes(f"{prefix}.idx")

    # Training reads the shards from the local cache: downloaded once, then reused.
    local_prefix = resolve_blend(prefix)
    assert local_prefix.startswith(str(storage.cache_root()))
    cached = Path(f"{local_prefix}.bin")
    mtime = cached.stat().st_mtime_ns
    assert resolve_blend(prefix) == local_prefix and cached.stat().st_mtime_ns == mtime
    dataset = IndexedDataset(local_prefix)
    assert len(dataset) == meta["documents"]
    from tokenmill.cli import main

    assert main(["tokenize", "inspect", prefix, "--docs", "1"]) == 0
    assert f"{prefix}: {meta['documents']} documents, {meta['tokens']} tokens" in capsys.readouterr().out

    from tokenmill.train.loop import train

    cfg = tiny_train_config(prefix, str(tmp_path / "run"), schedule={"steps": 3})
    result = train(cfg)
    losses = [row["loss"] for row in result.metrics if "loss" in row] if hasattr(result, "metrics") else []
    assert (tmp_path / "run" / "checkpoints").is_dir()
    assert all(np.isfinite(losses))

    # A blend file on the bucket whose prefixes are relative to it.
    storage.write_text(f"{bucket}/shards/blend.yaml", "- {prefix: plays, weight: 1.0}\n")
    entries = resolve_blend(f"{bucket}/shards/blend.yaml")
    assert [e.prefix for e in entries] == [local_prefix]


def test_interrupted_encode_resumes_and_never_looks_finished(bucket, shared_data, s3_dask_client, monkeypatch) -> None:
    docs = _documents(shared_data, bucket)
    tokenizer_url = train_tokenizer(docs, 300, f"{bucket}/tok/tokenizer.json")
    prefix = f"{bucket}/shards/plays"

    # Killed while uploading: the .bin is there, the .json (the completion marker) is not.
    import tokenmill.tokenize.encode as encode_module

    real_write_text = storage.write_text

    def killed(path, text):
        if str(path).endswith("plays.json"):
            raise RuntimeError("killed before the metadata")
        return real_write_text(path, text)

    monkeypatch.setattr(encode_module.storage, "write_text", killed)
    with pytest.raises(RuntimeError, match="killed"):
        encode_documents(docs, tokenizer_url, prefix, client=s3_dask_client, progress=False, rows_per_partition=100)
    monkeypatch.undo()
    assert storage.exists(f"{prefix}.bin") and not storage.exists(f"{prefix}.json")
    with pytest.raises(TokenmillError, match="incomplete"):
        resolve_blend(prefix)
    with pytest.raises(TokenmillError, match="shard metadata not found"):
        read_shard_metadata(prefix)

    # The finished partitions were kept in the local staging directory: the re-run reuses them.
    meta = encode_documents(docs, tokenizer_url, prefix, client=s3_dask_client, progress=False, rows_per_partition=100)
    assert meta["partitions"]["resumed"] == meta["partitions"]["total"] > 1
    assert read_shard_metadata(prefix)["tokens"] == meta["tokens"]
