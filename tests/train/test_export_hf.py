"""Exported checkpoints load in transformers and give our logits (within 1e-4, fp32, real text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenmill.train.checkpoint import save_checkpoint
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.export_hf import export_hf
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset

transformers = pytest.importorskip("transformers")

CASES = {
    "gpt2": preset("tiny", max_seq_len=256),
    "gpt2-tied": preset("tiny", max_seq_len=256, tie_embeddings=True),
    "llama-gqa": preset("tiny-llama", max_seq_len=256, n_kv_heads=2, rope_theta=500000.0),
    "llama-tied-mha": preset("tiny-llama", max_seq_len=256, n_kv_heads=4, tie_embeddings=True, norm_eps=1e-6),
}


def make_checkpoint(cfg, run: Path, tokenizer: str | None = None) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():  # move every weight off its init value, so no mapping hides behind 0 or 1
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    engine = Engine(TrainConfig(model=cfg, parallel={"device": "cpu"}), model)
    save_checkpoint(
        run,
        5,
        engine.state_dict_for_checkpoint(),
        {"model": cfg.to_dict(), "consumed_samples": 0, "tokenizer": tokenizer},
    )
    return model.eval()


@pytest.mark.parametrize("case", list(CASES))
def test_export_logits_match_transformers(case: str, tmp_path: Path, wikitext_text: str) -> None:
    cfg = CASES[case]
    ours = make_checkpoint(cfg, tmp_path / "run")
    out = export_hf(tmp_path / "run", tmp_path / "hf")  # a run directory: its latest checkpoint
    assert (out / "model.safetensors").is_file()
    config = json.loads((out / "config.json").read_text())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    expected = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[cfg.flavour]
    assert type(hf).__name__ == expected and config["architectures"] == [expected]
    # Real text as byte tokens, the full context length.
    tokens = torch.tensor([list(wikitext_text.encode()[: 2 * cfg.max_seq_len])]).view(2, cfg.max_seq_len)
    with torch.no_grad():
        theirs = hf(input_ids=tokens).logits
        mine = ours(tokens)
    max_diff = (theirs - mine).abs().max().item()
    print(f"{case}: max |logit difference| {max_diff:.2e}")
    assert max_diff < 1e-4, f"{case}: max |logit difference| {max_diff}"


def test_exported_tokenizer_pads_with_its_pad_token(tmp_path: Path, wikitext_text: str) -> None:
    """A tokenmill tokenizer has `<|pad|>`: the export names it as the pad token, so that
    transformers pads a batch (it refuses to without one) with that token's id."""
    import pandas as pd

    from tokenmill.tokenize.special import EOD_TOKEN, PAD_TOKEN
    from tokenmill.tokenize.tokenizer import load_tokenizer, train_tokenizer

    paragraphs = [p for p in wikitext_text.split("\n") if p.strip()]
    (tmp_path / "docs").mkdir()
    pd.DataFrame({"id": [str(i) for i in range(len(paragraphs))], "text": paragraphs, "source": "wiki"}).to_parquet(
        tmp_path / "docs" / "part-0.parquet"
    )
    tok_path = train_tokenizer(tmp_path / "docs", 300, tmp_path / "tokenizer.json")
    ours = load_tokenizer(tok_path)
    make_checkpoint(CASES["gpt2"], tmp_path / "run", tokenizer=str(tok_path))
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(out)
    pad, eod = ours.token_to_id(PAD_TOKEN), ours.token_to_id(EOD_TOKEN)
    assert (hf.pad_token, hf.pad_token_id, hf.eos_token, hf.eos_token_id) == (PAD_TOKEN, pad, EOD_TOKEN, eod)
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == pad
    batch = hf(["a short one", "a longer text than the short one"], padding=True)["input_ids"]
    short = ours.encode("a short one").ids
    assert batch[0] == short + [pad] * (len(batch[1]) - len(short))
