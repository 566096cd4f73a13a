"""Exported checkpoints load in transformers and give our logits (within 1e-4, fp32, real text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenmill.train.checkpoint import save_checkpoint
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import SingleProcessEngine
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


def make_checkpoint(cfg, run: Path) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():  # move every weight off its init value, so no mapping hides behind 0 or 1
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    engine = SingleProcessEngine(model, TrainConfig(model=cfg, parallel={"device": "cpu"}))
    save_checkpoint(
        run, 5, engine.state_dict_for_checkpoint(), {"model": cfg.to_dict(), "consumed_samples": 0, "tokenizer": None}
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
