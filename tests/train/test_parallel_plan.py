"""The layout planner: its formulas and where it puts MT-NLG's published layout."""

from __future__ import annotations

import pytest

from tokenmill.cli import main
from tokenmill.errors import TokenmillError
from tokenmill.train.layout_planner import Hardware, Shape, bubble_fraction, model_state_bytes, parse_bytes, plan


def test_zero_formulas_match_the_paper() -> None:
    psi, nd, k = 7.5e9, 64, 12  # the ZeRO paper's Figure 1 example
    totals = [sum(model_state_bytes(psi, nd, z, k)) / 1e9 for z in range(4)]
    assert totals == pytest.approx([120, 31.4, 16.6, 1.88], rel=0.01)


def test_bubble_fraction() -> None:
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 12, virtual_stages=2) == pytest.approx(3 / 27)
    assert bubble_fraction(1, 8) == 0


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("40GB") == 40 * 10**9
    with pytest.raises(TokenmillError):
        parse_bytes("lots")


def test_mtnlg_layout_ranks_among_the_best() -> None:
    shape = Shape.from_params(530e9, 2048)
    assert (shape.n_layers, shape.hidden, shape.n_heads) == (105, 20480, 128)
    results = plan(shape, Hardware(gpus=4480, gpu_memory=80 * 2**30), 1920)
    ranks = [i for i, e in enumerate(results, 1) if (e.layout.tp, e.layout.pp) == (8, 35)]
    assert ranks and ranks[0] <= 3
    # Every reported layout fits and uses every GPU.
    for e in results:
        assert e.layout.tp * e.layout.pp * e.layout.dp == 4480
        assert e.total <= 80 * 2**30 * 0.9


def test_plan_command(capsys) -> None:
    assert (
        main(
            [
                "plan",
                "--params",
                "530e9",
                "--gpus",
                "4480",
                "--gpu-memory",
                "80GiB",
                "--seq-len",
                "2048",
                "--global-batch",
                "1920",
                "--top",
                "5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "105 layers x hidden 20480" in out and "feasible layouts" in out


def test_context_parallel_divides_activations_and_ranks_for_long_sequences() -> None:
    from tokenmill.train.layout_planner import Layout, estimate

    shape = Shape(8e9, 32, 4096, 32, 128256, 131072)
    hw = Hardware(gpus=64, gpu_memory=80 * 2**30)
    one, four = (estimate(shape, hw, Layout(8, 1, 8 // cp, 3, 1, cp), 16) for cp in (1, 4))
    assert four.act_full == pytest.approx(one.act_full / 4)
    # ZeRO-3 shards over dp x cp, the same 8 ranks in both layouts.
    assert four.weights == pytest.approx(one.weights)
    results = plan(shape, hw, 16, context_parallel=(1, 2, 4, 8, 16))
    assert results and results[0].layout.cp > 1  # a 128k sequence does not fit without it
    assert all(e.layout.tp * e.layout.pp * e.layout.dp * e.layout.cp == 64 for e in results)
    # A sequence that does not split into 2 x cp chunks is never proposed.
    assert all(
        e.layout.cp in (1, 2) for e in plan(Shape(8e9, 32, 4096, 32, 128256, 4100), hw, 16, context_parallel=(1, 2, 4))
    )
