"""One FLOPs count for the model config (MFU), the pipeline split and the planner."""

from __future__ import annotations

import pytest

from tokenmill.train import layout_planner as plan
from tokenmill.train.flops import flops_per_token, head_flops, layer_flops
from tokenmill.train.model_config import PRESETS
from tokenmill.train.parallel.pipeline import split_layers, stage_costs


def test_gpt_count_is_narayanans_closed_form() -> None:
    # 72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)) per token, for GPT-3 175B and MT-NLG 530B
    for name in ("gpt3-175b", "mtnlg-530b"):
        m = PRESETS[name]
        L, h, V, s = m.n_layers, m.hidden, m.vocab_size, 2048
        closed = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
        assert m.flops_per_token(s) == pytest.approx(closed, rel=1e-12)
        assert m.flops_per_token(s) == flops_per_token(L, h, 4 * h, V, s)


def test_llama_counts_three_mlp_matrices_and_grouped_kv() -> None:
    m = PRESETS["llama-8b"]
    kv = m.n_kv_heads * m.head_dim
    assert kv < m.hidden  # grouped-query attention
    weights = m.n_layers * (2 * m.hidden**2 + 2 * m.hidden * kv + 3 * m.hidden * m.ffn_hidden)
    weights += m.hidden * m.vocab_size
    assert m.flops_per_token(4096) == 6 * weights + 12 * m.n_layers * m.hidden * 4096


def test_pipeline_balance_and_planner_use_the_same_count() -> None:
    m = PRESETS["gpt2-125m"]
    layer, head = stage_costs(m)
    assert m.n_layers * layer + head + 12 * m.n_layers * m.hidden * 512 == m.flops_per_token(512)
    # the head costs 5.5 layers here: the last of 3 stages gets one layer
    assert head / layer == pytest.approx(5.458, abs=1e-3)
    assert [len(s) for s in split_layers(m, 3)] == [5, 6, 1]
    # the planner's total FLOPs per iteration is the model count times the tokens
    shape = plan.Shape.from_params(530e9, 2048)
    hw = plan.Hardware(gpus=4480, gpu_memory=80 * 2**30)
    est = plan.estimate(shape, hw, plan.Layout(8, 35, 16, 1, 1), 1920)
    per_token = flops_per_token(shape.n_layers, shape.hidden, 4 * shape.hidden, shape.vocab_size, 2048)
    expected = 1920 * 2048 * per_token / est.iter_time / 4480 / 1e12
    assert est.tflops_per_gpu == pytest.approx(expected, rel=1e-12)
    assert 100 < est.tflops_per_gpu < 140  # MT-NLG reported 113-126 TFLOP/s per GPU
    assert layer_flops(64, 256) == 6 * 12 * 64 * 64 and head_flops(64, 100) == 6 * 6400


@pytest.mark.parametrize("tie", [True, False])
def test_the_count_without_a_tied_head_is_torchtitans(tie: bool) -> None:
    # torchtitan's get_num_flop_per_token for its llama3: 6 x (parameters - the embedding's)
    # + 12 x layers x heads x head_dim x seq_len; with a tied head the embedding's parameters
    # are the head's, so its count leaves the head out.
    import torch

    from tokenmill.train.model import GPT
    from tokenmill.train.model_config import preset

    cfg = preset("tiny-llama", tie_embeddings=tie)
    with torch.device("meta"):
        model = GPT(cfg)
    parameters = sum(p.numel() for p in model.parameters())  # a shared weight once
    norms = sum(p.numel() for n, p in model.named_parameters() if n.endswith("norm.weight"))
    seq = 128
    titan = 6 * (parameters - model.tok_embeddings.weight.numel()) + 12 * cfg.n_layers * cfg.hidden * seq
    # torchtitan counts the norms' weights too (6 FLOPs each, no matmul): ours does not.
    assert cfg.flops_per_token(seq, tied_head=False) == titan - 6 * norms
    head = head_flops(cfg.hidden, cfg.vocab_size)
    assert cfg.flops_per_token(seq) - cfg.flops_per_token(seq, tied_head=False) == (head if tie else 0)
