"""A tokenmill checkpoint is evaluated natively with the numbers of its `export-hf` copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenmill.eval.evaluator import evaluate_task, load_task_data
from tokenmill.eval.models import HFModel, NativeModel, load_model
from tokenmill.eval.tasks import get_task
from tokenmill.train import checkpoint

from .conftest import close_ll


@pytest.fixture(scope="module")
def native_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer

    from tokenmill.train.config import TrainConfig
    from tokenmill.train.engine import Engine
    from tokenmill.train.model import GPT
    from tokenmill.train.model_config import preset

    tokenizer = tiny_model_dir / "tokenizer.json"
    cfg = preset("tiny", vocab_size=Tokenizer.from_file(str(tokenizer)).get_vocab_size(), max_seq_len=128)
    torch.manual_seed(1)
    model = GPT(cfg)
    with torch.no_grad():  # spread the logits so that choices differ clearly
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    run = tmp_path_factory.mktemp("native") / "run"
    engine = Engine(TrainConfig(model=cfg, parallel={"device": "cpu"}), model)
    checkpoint.save_checkpoint(
        run,
        3,
        engine.state_dict_for_checkpoint(),
        {"model": cfg.to_dict(), "consumed_samples": 0, "tokenizer": str(tokenizer)},
    )
    return run


def test_native_equals_exported_transformers_model(native_run: Path, eval_dir: Path, tmp_path: Path) -> None:
    from tokenmill.train.export_hf import export_hf

    native = load_model(native_run)
    assert isinstance(native, NativeModel) and native.max_length == 128
    exported = load_model(export_hf(native_run, tmp_path / "hf"))
    assert isinstance(exported, HFModel) and exported.prefix_token_id == native.prefix_token_id
    for name, shots in (("piqa", 1), ("lambada_openai", 0), ("winogrande", 2)):
        task = get_task(name)
        data = load_task_data(task, eval_dir, limit=6, need_pool=shots > 0)
        a = evaluate_task(native, task, shots, data, batch_size=4, progress=False, bootstrap_iters=0)
        b = evaluate_task(exported, task, shots, data, batch_size=4, progress=False, bootstrap_iters=0)
        for sa, sb in zip(a.samples, b.samples, strict=True):
            assert sa.requests == sb.requests
            assert sa.loglikelihoods == close_ll(sb.loglikelihoods)
            assert sa.is_greedy == sb.is_greedy
            # acc and acc_norm exactly; LAMBADA's per-document perplexity is its loglikelihood.
            assert {k: v for k, v in sa.scores.items() if k != "perplexity"} == {
                k: v for k, v in sb.scores.items() if k != "perplexity"
            }
        assert [r["value"] for r in a.rows] == pytest.approx([r["value"] for r in b.rows], rel=1e-5)


def test_native_suite_and_bpb_equal_exported_model(native_run: Path, shared_data: Path, tmp_path: Path) -> None:
    """The ICL prompts (preamble encoded with special tokens, EOS dropped) and the rolling windows
    after the EOD read a tokenmill checkpoint as they read its export."""
    from tokenmill.eval.bpb import bits_per_byte
    from tokenmill.eval.suites import load_suite, load_suite_data, score_suite
    from tokenmill.train.export_hf import export_hf

    native = load_model(native_run)
    exported = load_model(export_hf(native_run, tmp_path / "hf"))
    assert native.eos_token_id == exported.eos_token_id == native.prefix_token_id
    assert native.needs_prefix_space() and exported.needs_prefix_space()
    data = load_suite_data(load_suite("core"), shared_data / "eval" / "icl")
    a = score_suite(native, data, limit=3, batch_size=8, progress=False)
    b = score_suite(exported, data, limit=3, batch_size=8, progress=False)
    for ta, tb in zip(a.tasks, b.tasks, strict=True):
        assert [(p.context_tokens, p.continuation_tokens) for p in ta.prompts] == [
            (p.context_tokens, p.continuation_tokens) for p in tb.prompts
        ]
        assert ta.correct == tb.correct, ta.task.label
    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text(encoding="utf-8")[:2000]
    got, want = bits_per_byte(native, [text], progress=False), bits_per_byte(exported, [text], progress=False)
    assert got["bits_per_byte"] == close_ll(want["bits_per_byte"])
