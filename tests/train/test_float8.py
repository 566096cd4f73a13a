"""parallel.float8: torchao's Float8Linear swapped in from outside the model."""

from __future__ import annotations

import pytest
import torch

from tokenmill.errors import ConfigError
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset
from tokenmill.train.parallel.float8 import apply_float8, keep_for_float8


def small_llama(vocab: int = 512) -> GPT:
    # hidden 64, ffn 160: every block Linear is a multiple of 16; the head is left alone.
    return GPT(preset("tiny-llama", vocab_size=vocab), init_seed=0)


def test_filter_skips_head_embeddings_and_odd_sizes() -> None:
    assert keep_for_float8(torch.nn.Linear(64, 160), "layers.0.feed_forward.w1")
    assert not keep_for_float8(torch.nn.Linear(64, 512), "output")
    assert not keep_for_float8(torch.nn.Linear(64, 100), "layers.0.feed_forward.w1")
    assert not keep_for_float8(torch.nn.Embedding(512, 64), "tok_embeddings")


def test_missing_torchao_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torchao", None)
    monkeypatch.setitem(__import__("sys").modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match="install it"):
        apply_float8(small_llama())


def test_float8_with_tensor_parallel_is_refused() -> None:
    cfg = TrainConfig(model=preset("tiny-llama"), out="x", dataset={"path": "p"}, parallel={"tp": 2, "float8": True})
    with pytest.raises(ConfigError, match="float8"):
        cfg.validate()


def test_conversion_applies_and_the_model_trains() -> None:
    pytest.importorskip("torchao.float8", reason="float8 needs torchao (optional), not installed here")
    from torchao.float8.float8_linear import Float8Linear

    model = small_llama()
    converted = apply_float8(model)
    # 2 layers x (wq, wk, wv, wo, w1, w2, w3); not the head, not the embedding.
    assert converted == 14
    assert isinstance(model.layers["0"].attention.wq, Float8Linear)
    assert isinstance(model.layers["1"].feed_forward.w2, Float8Linear)
    assert type(model.output) is torch.nn.Linear
    # Parameter names are unchanged, so checkpoints and optimizer groups are those of the plain model.
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in small_llama().named_parameters()]

    # Through the engine, as `tokenmill train --float8` runs it: losses are finite and fall.
    cfg = TrainConfig(
        model=preset("tiny-llama", vocab_size=512),
        out="unused",
        dataset={"path": "unused", "seq_len": 32},
        schedule={"steps": 8, "global_batch_size": 4, "micro_batch_size": 4},
        parallel={"device": "cpu", "float8": True},
    ).validate()
    torch.manual_seed(0)
    engine = Engine(cfg, GPT(cfg.model, init_seed=0))
    assert isinstance(engine.model_parts[0].layers["0"].feed_forward.w1, Float8Linear)
    tokens = torch.randint(0, 512, (4, 33))
    losses = []
    for _ in range(8):
        losses.append(engine.train_step(tokens, 4))
        engine.clip_grad_norm(1.0)
        engine.optimizer_step(3e-3)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5
