"""The reports of `tokenmill ablate` (WORKDIR/ablate.md, .html) and `tokenmill mix`
(WORKDIR/mix.md, .html): the verdicts and the chosen blend, with their evidence."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.pipelines.report import Section, write_page
from tokenmill.pipelines.svg import bar_chart, line_chart

if TYPE_CHECKING:  # the results' types; their modules never import this one
    from tokenmill.pipelines.ablate import AblateResult
    from tokenmill.pipelines.mix import MixResult


def _compute(section: Section, compute: dict[str, float]) -> None:
    section.text(
        f"Compute: {compute['proxies']:.0f} proxies, {compute['tokens']:,.0f} tokens trained,"
        f" {compute['proxy_seconds']:.0f} proxy-seconds of training and scoring (this run's wall time"
        f" {compute['wall_seconds']:.0f}s, proxies found done included at their original cost)."
    )


def write_ablate_report(result: AblateResult, workdir: Path) -> Path:
    verdict = Section("verdict", "Verdict")
    for comparison in result.comparisons + result.suite_comparisons:
        verdict.text(comparison.verdict)
    verdict.text(
        f"A difference counts when it exceeds twice its standard error over {result.seeds} seeds per variant"
        " (the noise of the proxies' seeds)."
    )
    variants = Section("variants", "Variants")
    pairs = Section("pairs", "Pairs")
    measures = [("target bits/byte", "bits/byte", result.variants, result.comparisons)]
    if result.suite:
        measures.append((f"{result.suite} score", "score", result.suite_variants, result.suite_comparisons))
    for title, unit, scores, comparisons in measures:
        if not scores:
            continue
        variants.table(
            ["variant", f"{title} (mean)", "sd over seeds", "seeds", "per seed"],
            [[v.name, v.mean, v.sd, len(v.scores), ", ".join(f"{s:.4f}" for s in v.scores)] for v in scores],
        )
        variants.chart(
            bar_chart(
                f"{title[0].upper()}{title[1:]} (mean, +-1 sd over seeds)",
                [v.name for v in scores],
                {unit: [v.mean for v in scores]},
                unit,
                errors={unit: [v.sd for v in scores]},
            ),
            f"{title} by variant",
        )
        pairs.table(
            ["better", "worse", f"difference ({title})", "noise (2 standard errors)", "exceeds noise"],
            [[c.better, c.worse, c.difference, c.noise, "yes" if c.significant else "no"] for c in comparisons],
        )
    curves = Section("curves", "Training loss")
    any_scores = result.variants or result.suite_variants
    curves.chart(
        line_chart(
            "Training loss (mean over seeds)", {v.name: _mean_curve(v.curves) for v in any_scores}, "step", "loss"
        ),
        "training loss by variant",
    )
    _compute(curves, result.compute)
    md, _ = write_page("tokenmill ablate", [verdict, variants, pairs, curves], workdir / "ablate")
    return md


def _mean_curve(curves: list[list[list[float]]]) -> list[tuple[float, float]]:
    by_step: dict[float, list[float]] = {}
    for curve in curves:
        for step, loss in curve:
            by_step.setdefault(step, []).append(loss)
    return [(step, statistics.fmean(losses)) for step, losses in sorted(by_step.items())]


def write_mix_report(result: MixResult, workdir: Path) -> Path:
    sources, data = result.sources, result.data
    assert data is not None
    choice = Section("choice", "Chosen blend")
    shares = data.token_shares()
    uniform = 1 / len(sources)
    choice.table(
        ["source", "chosen", "token-proportional", "uniform", "recipe's blend", "regression coefficient"],
        [[s, result.chosen[s], shares[s], uniform, data.weights[s], result.coefficients[s]] for s in sources],
    )
    choice.chart(
        bar_chart(
            "Weights",
            sources,
            {
                "chosen": [result.chosen[s] for s in sources],
                "token-proportional": [shares[s] for s in sources],
                "uniform": [uniform] * len(sources),
            },
            "weight",
        ),
        "chosen, token-proportional and uniform weights",
    )
    tried = ", ".join(f"{model} {rho:.3f}" for model, rho in result.correlations.items())
    choice.text(
        f"Rank correlation (Spearman) of leave-one-out predictions with the measured targets over"
        f" {len(result.proxies)} proxies: {result.rank_correlation:.3f}, with the {result.model} regression (of"
        f" {tried}). Predicted {result.objective_name} of the chosen blend: {result.predicted:.4f}."
    )
    if result.recipe_out is not None:
        choice.text(f"Written as a recipe: {result.recipe_out}")
    checks = Section("checks", "The check: each blend trained at fresh seeds")
    for verdict in result.verdicts:
        checks.text(verdict.verdict)
    best = result.best_proxy
    checks.text(
        f"The best proxy, {best['name']}, recorded {best[result.objective]:.4f} {result.objective_name} at the"
        f" proxies' seed: the best of {len(result.proxies)} noisy measurements, so luckier than its blend is. Its"
        " blend is retrained here at the same fresh seeds as the others. A difference counts when it exceeds twice"
        " its standard error over the seeds (the seed noise)."
    )
    checks.table(
        [
            "blend",
            f"{result.objective_name} (mean)",
            "sd over seeds",
            "per seed",
            *[f"{s} loss" for s in sources],
            "weights",
        ],
        [
            [
                score.name,
                score.mean,
                score.sd,
                ", ".join(f"{s:.4f}" for s in score.scores),
                *[_mean_loss(result.check_runs[score.name], s) for s in sources],
                _weights_text(result.check_runs[score.name][0]["weights"]),
            ]
            for score in result.checks
        ],
    )
    proxies = Section("proxies", "Proxies")
    proxies.table(
        ["mixture", result.objective_name, *[f"{s} loss" for s in sources], "weights"],
        [
            [
                p["name"],
                p[result.objective],
                *[p["source_loss"].get(s) or "-" for s in sources],
                _weights_text(p["weights"]),
            ]
            for p in result.proxies
        ],
    )
    _compute(proxies, result.compute)
    md, _ = write_page("tokenmill mix", [choice, checks, proxies], workdir / "mix")
    return md


def _mean_loss(runs: list[dict], source: str) -> float | str:
    """The mean of a source's held-out loss over the runs, or "-" where it was not measured."""
    losses = [r["source_loss"].get(source) for r in runs]
    return statistics.fmean(losses) if None not in losses else "-"


def _weights_text(weights: dict[str, float]) -> str:
    return " ".join(f"{s}={w:.2f}" for s, w in weights.items())
