"""A long document is trained on and encoded in pieces cut where no pre-token spans: the same
ids and the same tokenizer as the whole text, in memory bounded by the piece."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tokenmill.cli import main
from tokenmill.tokenize import tokenizer as tokenizer_module
from tokenmill.tokenize.indexed import IndexedDataset
from tokenmill.tokenize.tokenizer import load_tokenizer, splits_safely, text_pieces, train_tokenizer

# Whitespace the pre-tokenizer and Python see differently (\x1c-\x1f are space to Python only),
# runs of spaces, CRLF, tabs, a contraction and digits after a newline: every kind of boundary.
ODD_TEXT = "a  b\r\nc\t d\x1c e \u3000f\u2028g\n\n\nh's\n12 34 \n  x\u00a0y ' z \n"


@pytest.fixture(scope="module")
def long_text(shared_data) -> str:
    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text(encoding="utf-8")
    return text + ODD_TEXT * 50


def test_pieces_give_the_ids_of_the_whole_text(wiki_tokenizer, long_text):
    tokenizer = load_tokenizer(wiki_tokenizer)
    assert splits_safely(tokenizer)
    for text, piece_chars in ((long_text[:30_000] + ODD_TEXT * 20, 1), (long_text[:200_000], 5000)):
        whole = tokenizer.encode(text, add_special_tokens=False).ids
        pieces = text_pieces(text, piece_chars)
        assert "".join(pieces) == text and len(pieces) > len(text) // (piece_chars + 2000)
        encodings = tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
        assert [i for encoding in encodings for i in encoding.ids] == whole, piece_chars
    assert text_pieces("x" * 50, 10) == ["x" * 50]  # no boundary: whole


def test_tokenizers_that_could_split_differently_encode_whole(wiki_tokenizer):
    from tokenizers import normalizers, pre_tokenizers

    for change in (
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
        lambda t: setattr(t, "normalizer", normalizers.NFKC()),
    ):
        tokenizer = load_tokenizer(wiki_tokenizer)
        change(tokenizer)
        assert not splits_safely(tokenizer)


def test_training_on_pieces_learns_the_tokenizer_of_whole_documents(wiki_docs, wiki_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 50)
    pieced = train_tokenizer(wiki_docs, 2000, tmp_path / "pieced.json")
    assert (tmp_path / "pieced.json").read_text() == wiki_tokenizer.read_text()
    assert pieced == tmp_path / "pieced.json"


def test_encode_writes_a_long_documents_whole_ids(wiki_tokenizer, long_text, tmp_path, dask_client):
    text = long_text[: tokenizer_module.PIECE_CHARS + 10_000]
    assert len(text) > tokenizer_module.PIECE_CHARS
    docs = tmp_path / "docs"
    docs.mkdir()
    frame = pd.DataFrame({"id": ["short", "long", "after"], "text": ["a short one", text, "the last"], "source": "t"})
    frame.to_parquet(docs / "part-0.parquet")
    argv = ["tokenize", "encode", "--input", str(docs), "--tokenizer", str(wiki_tokenizer)]
    address = dask_client.scheduler.address
    assert main([*argv, "--output-prefix", str(tmp_path / "shard"), "--scheduler", address, "--no-progress"]) == 0
    tokenizer = load_tokenizer(wiki_tokenizer)
    shard = IndexedDataset(tmp_path / "shard")
    assert len(shard) == 3
    for index, document in enumerate(frame["text"]):
        np.testing.assert_array_equal(shard[index], tokenizer.encode(document, add_special_tokens=False).ids + [0])
