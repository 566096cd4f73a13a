"""Real tokenizer -> shard -> `tokenmill train` -> `tokenmill export-hf` -> transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from shard_files import text_documents, write_shard

from tokenmill.train.checkpoint import load_for_inference

RECIPE = "tiny"  # the bundled train-tiny.yaml
transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_bpe_shard_train_export_load_with_tokenizer(shared_data: Path, tmp_path: Path, capsys) -> None:
    from tokenmill.cli import main
    from tokenmill.tokenize.tokenizer import load_tokenizer, train_tokenizer

    docs = [d.decode() for d in text_documents(shared_data / "corpus" / "tinyshakespeare.txt", 200_000)]
    (tmp_path / "docs").mkdir()
    pd.DataFrame({"id": [str(i) for i in range(len(docs))], "text": docs, "source": "shakespeare"}).to_parquet(
        tmp_path / "docs" / "part-0.parquet"
    )
    tok_path = train_tokenizer(tmp_path / "docs", 400, tmp_path / "tokenizer.json")
    tokenizer = load_tokenizer(tok_path)
    prefix = tmp_path / "shard"
    ids = [np.array(tokenizer.encode(d).ids, dtype=np.uint16) for d in docs]
    write_shard(
        prefix,
        ids,
        eod=tokenizer.token_to_id("<|endoftext|>"),
        vocab_size=tokenizer.get_vocab_size(),
        tokenizer=str(tok_path),
    )

    run = tmp_path / "run"
    assert main(["train", RECIPE, "--data", str(prefix), "--out", str(run), "--steps", "30", "--no-progress"]) == 0
    assert main(["export-hf", str(run), str(tmp_path / "hf")]) == 0
    hf_dir = tmp_path / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in hf_dir.iterdir()
    }
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text()[:2000]
    input_ids = hf_tok(text, return_tensors="pt").input_ids[:, :128]
    assert input_ids.tolist()[0] == tokenizer.encode(text).ids[:128]
    ours, _, meta = load_for_inference(run)
    assert meta["tokenizer"] == str(tok_path)
    with torch.no_grad():
        diff = (hf_model(input_ids=input_ids).logits - ours(input_ids)).abs().max().item()
    assert diff < 1e-4
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.token_to_id("<|endoftext|>")
    # The model's vocabulary is the tokenizer's (400) padded to a multiple of 128.
    assert config["vocab_size"] == 512 and meta["model"]["vocab_size"] == 512
    # The evaluation adapters score the padded model, natively and exported, alike.
    from tokenmill.eval.evaluator import evaluate_task, load_task_data
    from tokenmill.eval.models import load_model
    from tokenmill.eval.tasks import get_task

    task = get_task("piqa")
    data = load_task_data(task, shared_data / "eval", limit=4, need_pool=False)
    native, exported = (
        evaluate_task(load_model(path), task, 0, data, batch_size=4, progress=False, bootstrap_iters=0)
        for path in (run, hf_dir)
    )
    for a, b in zip(native.samples, exported.samples, strict=True):
        assert all(np.isfinite(a.loglikelihoods)) and a.loglikelihoods == pytest.approx(b.loglikelihoods, abs=1e-4)
    # The trained model beats a uniform guess on unseen text (it learned something).
    loss = torch.nn.functional.cross_entropy(ours(input_ids)[0, :-1], input_ids[0, 1:]).item()
    assert loss < np.log(tokenizer.get_vocab_size()) - 0.5
