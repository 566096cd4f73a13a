"""Document masking of packed rows: each token attends only within its document, and with
positions restarting per document a packed row computes what each document computes alone.
The layouts (tp, pp, dp, cp) are compared with one process in tests/train/test_parallel.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tokenmill.train.model import (
    GPT,
    Attention,
    block_causal_mask,
    document_ids,
    document_positions,
    flex_block_mask,
    rope_cache,
)
from tokenmill.train.model_config import ModelConfig

EOD = 0
# Two rows of packed documents (lengths with their EOD); the last runs on past the row's end.
ROWS = [[5, 9, 3, 7], [1, 12, 4, 7]]


def tiny(flavour: str) -> ModelConfig:
    llama = {"n_kv_heads": 2} if flavour == "llama" else {}
    return ModelConfig(flavour=flavour, vocab_size=64, n_layers=2, hidden=32, n_heads=4, max_seq_len=24, **llama)


def packed_rows() -> tuple[torch.Tensor, list[list[tuple[int, int]]]]:
    """Token rows [2, 24] and each row's documents as (start, end)."""
    g = torch.Generator().manual_seed(0)
    rows, spans = [], []
    for lengths in ROWS:
        row, row_spans, start = [], [], 0
        for i, length in enumerate(lengths):
            doc = torch.randint(1, 64, (length,), generator=g)
            if i < len(lengths) - 1:
                doc[-1] = EOD
            row.append(doc)
            row_spans.append((start, start + length))
            start += length
        rows.append(torch.cat(row))
        spans.append(row_spans)
    return torch.stack(rows), spans


def test_document_ids_and_positions_restart_after_each_eod() -> None:
    tokens = torch.tensor([[7, 0, 5, 6, 0, 0, 9]])
    ids = document_ids(tokens, EOD)
    assert ids.tolist() == [[0, 0, 1, 1, 1, 2, 3]]
    assert document_positions(ids).tolist() == [[0, 1, 0, 1, 2, 0, 0]]


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_packed_row_equals_each_document_alone(flavour: str) -> None:
    torch.manual_seed(0)
    model = GPT(tiny(flavour)).eval()
    tokens, spans = packed_rows()
    ids = document_ids(tokens, EOD)
    packed = model(tokens, ids, document_positions(ids))
    unmasked = model(tokens)
    for row, row_spans in enumerate(spans):
        for start, end in row_spans:
            alone = model(tokens[row : row + 1, start:end])[0]
            torch.testing.assert_close(packed[row, start:end], alone, rtol=1e-5, atol=1e-5)
    # Without the mask a later document sees the earlier ones.
    start, end = spans[0][1]
    assert not torch.allclose(unmasked[0, start:end], model(tokens[:1, start:end])[0], atol=1e-3)


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_packed_gradients_equal_the_sum_over_documents(flavour: str) -> None:
    torch.manual_seed(0)
    model = GPT(tiny(flavour))
    tokens, spans = packed_rows()
    targets = torch.randint(0, 64, tokens.shape, generator=torch.Generator().manual_seed(1))
    ids = document_ids(tokens, EOD)
    loss = torch.nn.functional.cross_entropy(
        model(tokens, ids, document_positions(ids)).flatten(0, 1), targets.flatten(), reduction="sum"
    )
    packed = torch.autograd.grad(loss, list(model.parameters()))
    alone_loss = sum(
        torch.nn.functional.cross_entropy(
            model(tokens[row : row + 1, start:end])[0], targets[row, start:end], reduction="sum"
        )
        for row, row_spans in enumerate(spans)
        for start, end in row_spans
    )
    alone = torch.autograd.grad(alone_loss, list(model.parameters()))
    torch.testing.assert_close(loss, alone_loss, rtol=1e-5, atol=1e-5)
    for a, b in zip(packed, alone, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_flex_attention_block_mask_equals_the_sdpa_mask() -> None:
    """The GPU's path (flex attention and its BlockMask; eager here, forward only: flex has no
    CPU backward) computes what the CPU's boolean SDPA mask does, grouped-query attention
    included."""
    torch.manual_seed(0)
    cfg = tiny("llama")
    attention = Attention(cfg)
    tokens, _ = packed_rows()
    ids = document_ids(tokens, EOD)
    x = torch.randn(*tokens.shape, cfg.hidden)
    rope = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)[:, document_positions(ids)]
    with torch.no_grad():
        flex = attention(x, rope, flex_block_mask(ids))
        sdpa = attention(x, rope, block_causal_mask(ids))
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-6)


def test_training_with_document_masking_takes_the_eod_token_from_the_data(tmp_path: Path, capsys) -> None:
    from shard_files import EOD as DATA_EOD
    from shard_files import write_shard

    from tokenmill.cli import main

    prefix = write_shard(tmp_path / "docs", [b"one short document", b"and another one, a little longer"] * 40)
    config = tmp_path / "docs.yaml"
    config.write_text(
        "model: {preset: tiny, n_layers: 1, hidden: 32, n_heads: 2}\n"
        "schedule: {steps: 2, global_batch_size: 2}\n"
        "dataset: {document_masking: true, seq_len: 64}\n"
        "logging: {progress: false, tensorboard: false}\n"
    )
    out = tmp_path / "run"
    assert main(["train", str(config), "--data", str(prefix), "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["dataset"]["eod_id"] == DATA_EOD
    # Data that names no EOD token: one line before any work, naming the key to set.
    meta = json.loads(Path(f"{prefix}.json").read_text())
    del meta["eod_id"]
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["train", str(config), "--data", str(prefix), "--out", str(tmp_path / "no_eod")]) == 1
    assert capsys.readouterr().err == (
        "tokenmill: error: dataset.document_masking: the data names no EOD token (PREFIX.json eod_id); "
        "set dataset.eod_id\n"
    )
    assert not (tmp_path / "no_eod").exists()
