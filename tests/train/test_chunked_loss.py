"""The chunked head + cross-entropy (parallel.loss_chunk_tokens) equals the plain head then
`F.cross_entropy`: loss and gradients, alone and inside the engine (tied embeddings too)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenmill.errors import ConfigError
from tokenmill.train.chunked_loss import chunked_cross_entropy
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.model import GPT
from tokenmill.train.model_config import preset


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_cross_entropy_equals_the_plain_loss_and_gradients(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 32, 48, generator=g, requires_grad=True)
    weight = torch.randn(1000, 48, generator=g, requires_grad=True)
    labels = torch.randint(0, 1000, (2, 32), generator=g)

    plain = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), labels.flatten())
    want = torch.autograd.grad(plain, (hidden, weight))
    chunked = chunked_cross_entropy(hidden, weight, labels, chunk)
    got = torch.autograd.grad(chunked, (hidden, weight))

    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def engine(tie: bool, chunk: int, state=None, precision: str = "fp32") -> Engine:
    cfg = TrainConfig(
        model=preset("tiny-llama", tie_embeddings=tie),
        parallel={"device": "cpu", "loss_chunk_tokens": chunk, "precision": precision},
    ).validate()
    torch.manual_seed(0)
    model = GPT(cfg.model)
    if state is not None:
        model.load_state_dict(state)
    return Engine(cfg, model)


@pytest.mark.parametrize("tie", [False, True])
def test_the_engine_with_the_chunked_loss_equals_the_plain_one(tie: bool) -> None:
    plain = engine(tie, 0)
    chunked = engine(tie, 24, plain.model_parts[0].state_dict())
    tokens = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(1))

    assert chunked.train_step(tokens, 2) == pytest.approx(plain.train_step(tokens, 2), rel=1e-6)
    for (name, a), b in zip(plain.model_parts[0].named_parameters(), chunked.model_parts[0].parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
    assert chunked.eval_loss(tokens) == pytest.approx(plain.eval_loss(tokens), rel=1e-6)
    keep = torch.zeros(4, 32, dtype=torch.bool)
    keep[:, -3:] = True
    torch.testing.assert_close(chunked.eval_logits(tokens[:, :-1], keep), plain.eval_logits(tokens[:, :-1], keep))


def test_the_chunked_loss_under_bf16_autocast_multiplies_in_bf16_as_the_plain_head() -> None:
    """The loss runs under the step's autocast, so the chunked head's matmul is bf16 like the
    plain head's: the same loss to float rounding, where an fp32 head matmul differs by ~1e-5."""
    plain = engine(True, 0, precision="bf16")
    chunked = engine(True, 16, plain.model_parts[0].state_dict(), precision="bf16")
    tokens = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(2))
    assert chunked.train_step(tokens, 2) == pytest.approx(plain.train_step(tokens, 2), rel=1e-6)


@pytest.mark.parametrize(
    "parallel, layout",
    [({"tp": 2}, "tensor parallel (tp = 2)"), ({"dp": 2, "zero": 3}, "zero = 3 (FSDP2)")],
)
def test_the_chunked_loss_is_refused_where_it_is_not_supported(parallel: dict, layout: str) -> None:
    with pytest.raises(
        ConfigError, match=r"parallel\.loss_chunk_tokens: the chunked loss is not supported with "
    ) as info:
        TrainConfig(model=preset("tiny"), parallel={**parallel, "loss_chunk_tokens": 64}).validate()
    assert layout in str(info.value) and "\n" not in str(info.value)
