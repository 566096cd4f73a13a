"""Tokenizer training on real text: deterministic, special tokens, any HF tokenizer.json."""

from __future__ import annotations

import json

import pytest

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.tokenizer import eod_id, load_tokenizer, pad_id, tokenizer_hash, train_tokenizer, vocab_size


def test_training_is_deterministic_with_special_tokens(wiki_docs, wiki_tokenizer, tmp_path):
    again = train_tokenizer(wiki_docs, 2000, tmp_path / "again.json")
    assert again.read_bytes() == wiki_tokenizer.read_bytes()
    assert tokenizer_hash(again) == tokenizer_hash(wiki_tokenizer)
    tokenizer = load_tokenizer(wiki_tokenizer)
    assert vocab_size(tokenizer) == 2000
    assert (eod_id(tokenizer), pad_id(tokenizer)) == (0, 1)
    text = "The European lobster , Homarus gammarus , is blue ."
    encoding = tokenizer.encode(text)
    assert tokenizer.decode(encoding.ids) == text  # byte-level: lossless
    assert len(encoding.ids) < len(text) / 2  # merges learned from the corpus
    # Special tokens are whole tokens, never split into bytes.
    assert tokenizer.encode("a<|endoftext|>b").ids[1] == 0


def test_sample_docs_trains_on_a_stable_subset(small_wiki_docs, tmp_path):
    a = train_tokenizer(small_wiki_docs, 400, tmp_path / "a.json", sample_docs=200)
    b = train_tokenizer(small_wiki_docs, 400, tmp_path / "b.json", sample_docs=200)
    full = train_tokenizer(small_wiki_docs, 400, tmp_path / "full.json")
    assert a.read_bytes() == b.read_bytes() != full.read_bytes()
    assert json.loads((tmp_path / "a.json.meta.json").read_text())["documents"] == 200


def test_any_hf_tokenizer_json_is_usable(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "hello": 4, "world": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)  # a model directory works too
    assert (eod_id(loaded), pad_id(loaded)) == (2, 3)
    assert eod_id(loaded, "<s>") == 1
    vocab.pop("</s>")
    bare = Tokenizer(models.WordLevel({k: i for i, k in enumerate(vocab)}, unk_token="<unk>"))
    with pytest.raises(TokenmillError, match="no end-of-document token"):
        eod_id(bare)
    assert pad_id(bare) == 2


def test_bad_inputs(wiki_docs, tmp_path):
    with pytest.raises(TokenmillError, match="too small"):
        train_tokenizer(wiki_docs, 100, tmp_path / "t.json")
    with pytest.raises(TokenmillError, match="input not found"):
        train_tokenizer(tmp_path / "nothing", 1000, tmp_path / "t.json")
    with pytest.raises(TokenmillError, match="tokenizer not found: .*absent.json"):
        load_tokenizer(tmp_path / "absent.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TokenmillError, match="cannot load tokenizer .*broken.json"):
        load_tokenizer(tmp_path / "broken.json")
