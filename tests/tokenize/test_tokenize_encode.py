"""Encoding real documents into shards on Dask: token counts, metadata, rejects, resume, int32."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import xxhash

from tokenmill.curate.documents import write_documents
from tokenmill.errors import TokenmillError
from tokenmill.tokenize.encode import encode_documents, read_shard_metadata, verify_shard
from tokenmill.tokenize.indexed import IndexedDataset, IndexedDatasetWriter
from tokenmill.tokenize.tokenizer import load_tokenizer, tokenizer_hash, train_tokenizer


def _texts(docs_dir):
    return [t for f in sorted(docs_dir.glob("*.parquet")) for t in pq.read_table(f).column("text").to_pylist()]


def test_wikitext_tokens_equal_encode_batch_plus_eod(wiki_docs, wiki_tokenizer, wiki_shard):
    texts = _texts(wiki_docs)
    tokenizer = load_tokenizer(wiki_tokenizer)
    expected = tokenizer.encode_batch(texts, add_special_tokens=False)
    shard = IndexedDataset(wiki_shard)
    meta = read_shard_metadata(wiki_shard)
    assert len(shard) == len(texts) == meta["documents"] > 1000
    assert shard.num_tokens == meta["tokens"] == sum(len(e.ids) + 1 for e in expected)
    assert shard.dtype == np.uint16 and meta["dtype"] == "uint16"
    for i in (0, 1, len(texts) // 2, len(texts) - 1):
        np.testing.assert_array_equal(shard[i], expected[i].ids + [0])  # document order kept, EOD last
    assert meta["tokenizer"]["hash"] == tokenizer_hash(wiki_tokenizer)
    assert (meta["vocab_size"], meta["eod_id"]) == (2000, 0)
    assert meta["counts"] == {"in": len(texts), "kept": len(texts), "rejected": {}}
    assert [f["rows"] for f in meta["input"]["files"]] == [
        pq.ParquetFile(f).metadata.num_rows for f in sorted(wiki_docs.glob("*.parquet"))
    ]
    assert not wiki_shard.with_name("wiki.parts").exists()  # the work directory is cleaned up
    # What `inspect --verify` checks against: the xxh64 of the published files.
    assert meta["checksums"] == {
        "algorithm": "xxh64",
        "bin": xxhash.xxh64(wiki_shard.with_suffix(".bin").read_bytes()).hexdigest(),
        "idx": xxhash.xxh64(wiki_shard.with_suffix(".idx").read_bytes()).hexdigest(),
    }


def test_rejects_are_counted_with_reasons(wiki_tokenizer, dask_client, tmp_path):
    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "text": ["Hello world .", "", None, "The end ."], "source": "t"})
    write_documents(frame, tmp_path / "docs" / "x.parquet")
    meta = encode_documents(tmp_path / "docs", wiki_tokenizer, tmp_path / "out", client=dask_client, progress=False)
    assert meta["counts"] == {"in": 4, "kept": 2, "rejected": {"empty": 1, "missing_text": 1}}
    shard = IndexedDataset(tmp_path / "out")
    assert len(shard) == 2 and shard[0][-1] == 0 and shard[1][-1] == 0


def _damage_data_pages(path):
    """Overwrite the start of the data pages but keep the footer: the file plans fine and fails
    when a worker reads it, as a truncated download or a bad disk block would."""
    raw = bytearray(path.read_bytes())
    raw[8:300] = b"\x55" * 292
    path.write_bytes(bytes(raw))


def test_interrupted_encode_resumes_from_written_parts(small_wiki_docs, wiki_tokenizer, dask_client, tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(small_wiki_docs, docs)
    extra = pd.DataFrame(
        {"id": [f"x{i}" for i in range(40)], "text": [f"Extra document {i} ." for i in range(40)], "source": "t"}
    )
    write_documents(extra, docs / "docs-999.parquet")
    reference = encode_documents(
        docs, wiki_tokenizer, tmp_path / "fresh", client=dask_client, progress=False, rows_per_partition=40
    )
    total = reference["partitions"]["total"]
    assert total >= 5

    _damage_data_pages(docs / "docs-999.parquet")
    prefix = tmp_path / "wiki"
    with pytest.raises(TokenmillError, match="cannot read Parquet file .*docs-999.parquet"):
        encode_documents(docs, wiki_tokenizer, prefix, client=dask_client, progress=False, rows_per_partition=40)
    parts = tmp_path / "wiki.parts"
    assert len(list(parts.glob("part-*.json"))) == total - 1  # every other partition was kept
    assert not prefix.with_suffix(".idx").exists()  # and no half-made shard was published

    write_documents(extra, docs / "docs-999.parquet")  # the input is repaired
    meta = encode_documents(docs, wiki_tokenizer, prefix, client=dask_client, progress=False, rows_per_partition=40)
    assert meta["partitions"] == {"total": total, "resumed": total - 1}
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"wiki{ext}").read_bytes() == (tmp_path / f"fresh{ext}").read_bytes()
    assert not parts.exists()


class Killed(BaseException):
    """A kill right after the new .bin/.idx were renamed into place."""


def test_a_reencode_removes_the_old_metadata_before_the_new_files_appear(
    small_wiki_docs, wiki_tokenizer, dask_client, tmp_path, monkeypatch
):
    """A crash between the rename of the new .bin/.idx and the write of the new PREFIX.json
    must not leave the old PREFIX.json (other counts, other checksums) beside the new files."""
    prefix = tmp_path / "wiki"
    frame = pd.DataFrame({"id": ["a", "b"], "text": ["An old shard .", "Of two documents ."], "source": "t"})
    write_documents(frame, tmp_path / "old" / "x.parquet")
    old = encode_documents(tmp_path / "old", wiki_tokenizer, prefix, client=dask_client, progress=False)
    assert old["documents"] == 2
    seen = {}
    finalize = IndexedDatasetWriter.finalize

    def finalize_then_die(writer):
        if writer.prefix != prefix:  # a part shard (when the workers are threads of this process)
            return finalize(writer)
        seen["json when the new files appear"] = prefix.with_suffix(".json").exists()
        finalize(writer)
        raise Killed

    monkeypatch.setattr(IndexedDatasetWriter, "finalize", finalize_then_die)
    with pytest.raises(Killed):
        encode_documents(small_wiki_docs, wiki_tokenizer, prefix, client=dask_client, progress=False)
    assert seen == {"json when the new files appear": False}
    assert len(IndexedDataset(prefix)) == 300  # the new pair is in place, with no metadata beside it
    with pytest.raises(TokenmillError, match="shard metadata not found"):
        read_shard_metadata(prefix)
    monkeypatch.undo()
    # The rerun resumes its parts and publishes metadata that describes the files.
    meta = encode_documents(small_wiki_docs, wiki_tokenizer, prefix, client=dask_client, progress=False)
    assert meta["documents"] == 300 and meta["partitions"]["resumed"] == meta["partitions"]["total"]
    assert verify_shard(prefix) == {k: meta["checksums"][k] for k in ("idx", "bin")}


def test_parts_of_another_tokenizer_are_not_reused(small_wiki_docs, wiki_tokenizer, dask_client, tmp_path):
    from tokenmill.infra.document_dirs import resolve_input_files
    from tokenmill.tokenize.encode import EncodeSettings, encode_partition, plan_partitions, work_dir_for

    other = tmp_path / "other.json"
    train_tokenizer(small_wiki_docs, 400, other)
    prefix = tmp_path / "a"
    parts_dir = work_dir_for(prefix)
    parts_dir.mkdir()
    # Parts left behind by an interrupted run that used another tokenizer.
    stale = EncodeSettings(str(other), tokenizer_hash(other), 0, "uint16", str(parts_dir))
    for partition in plan_partitions(resolve_input_files(small_wiki_docs)):
        assert encode_partition(partition, stale)["resumed"] is False
        assert encode_partition(partition, stale)["resumed"] is True  # same settings: reused
    meta = encode_documents(small_wiki_docs, wiki_tokenizer, prefix, client=dask_client, progress=False)
    assert meta["partitions"]["resumed"] == 0
    assert meta["tokenizer"]["hash"] == tokenizer_hash(wiki_tokenizer)
    texts = _texts(small_wiki_docs)
    tokenizer = load_tokenizer(wiki_tokenizer)
    assert meta["tokens"] == sum(len(e.ids) + 1 for e in tokenizer.encode_batch(texts, add_special_tokens=False))


def test_large_vocabulary_writes_int32(dask_client, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(70000)]
    vocab = {"<|endoftext|>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "big.json"))
    frame = pd.DataFrame({"id": ["a", "b"], "text": ["w69999 w0 w65535", "w12 nope"], "source": "t"})
    write_documents(frame, tmp_path / "docs" / "x.parquet")
    meta = encode_documents(
        tmp_path / "docs", tmp_path / "big.json", tmp_path / "out", client=dask_client, progress=False
    )
    shard = IndexedDataset(tmp_path / "out")
    assert meta["dtype"] == "int32" and shard.dtype == np.int32 and meta["vocab_size"] == 70002
    assert shard[0].tolist() == [70001, 2, 65537, 0] and shard[1].tolist() == [14, 1, 0]


def test_bad_inputs_are_clear_errors(wiki_docs, wiki_tokenizer, tmp_path):
    with pytest.raises(TokenmillError, match="input not found"):
        encode_documents(tmp_path / "none", wiki_tokenizer, tmp_path / "o", progress=False)
    with pytest.raises(TokenmillError, match="tokenizer not found"):
        encode_documents(wiki_docs, tmp_path / "none.json", tmp_path / "o", progress=False)
    write_documents(pd.DataFrame({"id": ["a"], "body": ["x"], "source": ["s"]}), tmp_path / "bad" / "x.parquet")
    with pytest.raises(TokenmillError, match="x.parquet lacks the document column.*text"):
        encode_documents(tmp_path / "bad", wiki_tokenizer, tmp_path / "o", progress=False)
    with pytest.raises(TokenmillError, match="should not carry an extension"):
        encode_documents(wiki_docs, wiki_tokenizer, tmp_path / "o.bin", progress=False)
    with pytest.raises(TokenmillError, match="shard metadata not found"):
        read_shard_metadata(tmp_path / "o")
