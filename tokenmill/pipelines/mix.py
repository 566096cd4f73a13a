"""`tokenmill mix`: the blend of a recipe's sources that best predicts a held-out target, found
with proxy models as RegMix finds it (Liu et al., 2024).

1. N mixtures are sampled over the sources' simplex, around their token proportions: mixture i
   is Dirichlet(c * k * token shares) with its own spread c, from a generator seeded by
   (seed, i), so a later run with more mixtures keeps the first N and their proxies.
2. A proxy trains on each mixture for the same budget; its target is the held-out text's bits
   per byte, or, with a suite as the only target, the suite's score (the regression fits its
   negative, so that lower is better in both).
3. A regression from weights to target is fitted on the features -log(w_i + eps), one of two:
   `additive`, scikit-learn's non-negative least squares (`LinearRegression(positive=True)`):
   "the target's loss falls as each source's share grows, with diminishing returns", k + 1
   parameters that fit from tens of proxies where a boosted tree ensemble (RegMix's LightGBM)
   has too few points to learn from, with its minimum inside the simplex, not at a corner as a
   linear model's would be; and `interactions`, a ridge regression on those features and their
   pairwise products (sources that help each other: one kind of English helps another), its
   penalty chosen by cross-validation (`RidgeCV`), tried with two proxies or more per
   coefficient (28 for 4 sources).
4. Each model's quality is the rank correlation (Spearman) of its leave-one-out predictions with
   the measured targets, over the proxy runs; the better one is used (the additive one on a
   tie), so a run of few proxies keeps the simple model and a run of many may get the richer one.
5. The simplex is searched with it: many random mixtures are predicted and the best ones
   averaged (RegMix averages its top 100). The chosen weights are written as a recipe.
6. The check: the chosen blend, the uniform one, the token-proportional one and the best
   proxy's blend each train again at `proxies.check_seeds` fresh seeds (not the proxies' own),
   at the same budget. The best proxy's recorded score is the lowest of N noisy measurements,
   lucky by selection; retrained at the same fresh seeds as the others, its blend is compared
   fairly. The choice "beats" another blend only when the difference of their means exceeds
   the seed noise, as `tokenmill ablate` decides (`proxies.compare`).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill.errors import ConfigError
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.infra.slurm import SlurmSpec
from tokenmill.pipelines.proxies import (
    Comparison,
    ProxyJob,
    TokenizedData,
    VariantScore,
    check_budget,
    check_targets,
    compare,
    compute_spent,
    default_workers,
    proxy_config,
    run_proxies,
    tokenize_recipe,
)
from tokenmill.pipelines.recipe import Recipe

log = logging.getLogger(__name__)

# A weight below this is no share at all: the proxy does not read the source.
MIN_WEIGHT = 0.01
# The smoothing of -log(w + EPS): a source left out costs a finite amount.
EPS = 0.02
# The regressions of step 3, simplest first, and the ridge penalties RidgeCV tries.
MODELS = ("additive", "interactions")
RIDGE_ALPHAS = 20
# Random mixtures predicted in the search, and how many of the best are averaged.
SEARCH_SAMPLES = 100_000
SEARCH_TOP = 100
# Spreads of the sampling Dirichlet, as multiples of the number of sources: small ones give
# mixtures near a corner (one source dominates), large ones mixtures near the token shares.
SPREADS = (0.1, 0.3, 1.0, 3.0)


@dataclass
class Mixture:
    name: str
    weights: dict[str, float]


@dataclass
class MixResult:
    sources: list[str]
    proxies: list[dict[str, Any]]  # one per sampled mixture (and --mixture), in order
    rank_correlation: float
    chosen: dict[str, float]
    predicted: float
    checks: list[VariantScore]  # chosen, uniform, token-proportional, best proxy's blend: over the check seeds
    check_runs: dict[str, list[dict[str, Any]]]  # each check blend's records, one per seed
    verdicts: list[Comparison]  # the chosen blend against each other check blend
    best_proxy: dict[str, Any]  # the proxy with the best recorded target (at the proxies' seed)
    coefficients: dict[str, float]
    objective: str = "target_bpb"  # the records' key of the score fitted
    objective_name: str = "target bits/byte"
    model: str = "additive"  # the regression used (MODELS)
    correlations: dict[str, float] = field(default_factory=dict)  # each model's leave-one-out rank correlation
    recipe_out: Path | None = None
    compute: dict[str, float] = field(default_factory=dict)
    data: TokenizedData | None = None  # the shards the proxies read


def parse_mixture(text: str, sources: list[str]) -> dict[str, float]:
    """`wiki=0.6,code=0.4`: every source named once, weights that sum to 1."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in sources:
            raise ConfigError(f"--mixture {text}: {part!r} is not SOURCE=WEIGHT for a source of {', '.join(sources)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ConfigError(f"--mixture {text}: {value!r} is not a number") from None
        if weights[name] < 0:
            raise ConfigError(f"--mixture {text}: a weight is negative")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-3:
        raise ConfigError(f"--mixture {text}: the weights sum to {total:g}, not 1")
    return {s: weights.get(s, 0.0) for s in sources}


def sample_mixtures(shares: dict[str, float], count: int, seed: int) -> list[Mixture]:
    """`count` mixtures around the token shares; mixture i depends only on (seed, i)."""
    import numpy as np

    names = list(shares)
    alpha = np.array([max(shares[n], 1e-3) for n in names]) * len(names)
    out = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        spread = SPREADS[i % len(SPREADS)]
        w = _clean(rng.dirichlet(alpha * spread))
        out.append(Mixture(f"mixture-{i:03d}", dict(zip(names, w))))
    return out


def _clean(weights: Any) -> list[float]:
    """Weights under MIN_WEIGHT set to 0, the rest scaled to sum to 1 (rounded to 4 places)."""
    w = [float(x) if x >= MIN_WEIGHT else 0.0 for x in weights]
    if not any(w):
        w[max(range(len(w)), key=lambda i: weights[i])] = 1.0
    total = sum(w)
    return [round(float(x) / total, 4) for x in w]


def features(weights: Any) -> Any:
    """The regression's inputs: -log(w + EPS) per source (rows: mixtures)."""
    import numpy as np

    return -np.log(np.asarray(weights, dtype=float) + EPS)


def fit(weights: Any, targets: Any, model: str = "additive") -> Any:
    """The regression `model` (MODELS) fitted to the features of `weights`."""
    from sklearn.linear_model import LinearRegression, RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures

    if model == "additive":
        regression = LinearRegression(positive=True)
    else:
        import numpy as np

        regression = make_pipeline(
            PolynomialFeatures(2, include_bias=False), RidgeCV(alphas=np.logspace(-4, 2, RIDGE_ALPHAS))
        )
    return regression.fit(features(weights), targets)


def loo_rank_correlation(weights: Any, targets: Any, model: str = "additive") -> float:
    """Spearman's rank correlation between each proxy's measured target and the prediction of a
    model fitted to the other proxies (leave-one-out cross-validation)."""
    import numpy as np
    from scipy.stats import spearmanr

    weights, targets = np.asarray(weights), np.asarray(targets)
    predicted = [
        fit(np.delete(weights, i, axis=0), np.delete(targets, i), model).predict(features(weights[i : i + 1]))[0]
        for i in range(len(targets))
    ]
    rho = spearmanr(predicted, targets).statistic
    return float(rho) if math.isfinite(rho) else 0.0


def select_model(weights: Any, targets: Any) -> tuple[str, dict[str, float]]:
    """The model of MODELS whose leave-one-out predictions rank the proxies best (the first on a
    tie), and the rank correlation of each model tried. The interactions model is tried only
    with two proxies or more per coefficient: with fewer, a ranking of a handful of held-out
    proxies picks it by chance as often as not."""
    n, k = len(targets), len(weights[0])
    tried = [m for m in MODELS if m == "additive" or n >= 2 * (k + k * (k + 1) // 2)]
    correlations = {model: loo_rank_correlation(weights, targets, model) for model in tried}
    return max(tried, key=lambda m: (correlations[m], -MODELS.index(m))), correlations


def linear_coefficients(model: Any, k: int) -> list[float]:
    """Each source's coefficient of -log(w + EPS) (the interactions model's first-order ones)."""
    return [float(c) for c in (model.coef_ if hasattr(model, "coef_") else model[-1].coef_)[:k]]


def search(model: Any, k: int, seed: int) -> tuple[list[float], float]:
    """The mean of the SEARCH_TOP best of SEARCH_SAMPLES uniform random mixtures, and its
    predicted target."""
    import numpy as np

    candidates = np.random.default_rng([seed, 1 << 20]).dirichlet(np.ones(k), SEARCH_SAMPLES)
    predicted = model.predict(features(candidates))
    best = candidates[np.argsort(predicted)[:SEARCH_TOP]].mean(axis=0)
    chosen = _clean(best)
    return chosen, float(model.predict(features([chosen]))[0])


def run_mix(
    recipe: Recipe,
    recipe_file: Path,
    workdir: Path,
    *,
    targets: list[str] | None = None,
    mixtures: int | None = None,
    steps: int | None = None,
    workers: int | None = None,
    extra: list[str] | None = None,
    out: Path | None = None,
    apply: bool = False,
    progress: bool = True,
    slurm: SlurmSpec | None = None,
    scheduler: str | None = None,
) -> MixResult:
    """Sample, train, fit, search, check (the module's steps 1-6); write the chosen blend into a
    copy of `recipe_file` (`out`, default NAME-mixed.yaml beside it) and, with `apply`, into
    `recipe_file` itself."""
    started = time.time()
    sources = [b.source for b in recipe.blend] if recipe.blend else [s.name for s in recipe.sources]
    if len(sources) < 2:
        raise ConfigError(f"mix: the recipe blends one source ({sources[0]}); a mixture needs at least two")
    explicit = [Mixture(f"given-{i}", parse_mixture(text, sources)) for i, text in enumerate(extra or [])]
    scoring = check_targets(recipe, targets or recipe.proxies.targets(), "mix")
    config = proxy_config(recipe, steps, scoring.suite)
    objective, sign, objective_name = scoring.objective()
    count = mixtures or recipe.proxies.mixtures
    if count + len(explicit) < 4:
        raise ConfigError(f"mix: {count + len(explicit)} mixtures are too few to fit and cross-validate; use 4 or more")
    workers = default_workers(recipe, workers)

    data = tokenize_recipe(recipe, workdir / "data", scheduler=scheduler, progress=progress)
    budget = check_budget(data, config, f"mix: recipe {recipe.name}")
    shares = data.token_shares()
    seed = recipe.proxies.seed
    sampled = sample_mixtures(shares, count, seed) + explicit

    def job(mixture: Mixture, proxy_seed: int = seed) -> ProxyJob:
        return mixture_job(mixture, data, config, proxy_seed, scoring.files)

    def train(jobs: list[ProxyJob]) -> dict[str, dict[str, Any]]:
        return run_proxies(jobs, workdir, workers, slurm=slurm, scheduler=scheduler)

    results = train([job(m) for m in sampled])
    proxies = [results[job(m).fingerprint] | {"name": m.name} for m in sampled]
    import numpy as np

    weights = np.array([[p["weights"][s] for s in sources] for p in proxies])
    measured = np.array([sign * p[objective] for p in proxies])  # lower is better
    model_name, correlations = select_model(weights, measured)
    rho = correlations[model_name]
    model = fit(weights, measured, model_name)
    chosen_list, predicted = search(model, len(sources), seed)
    chosen = dict(zip(sources, chosen_list))
    best = proxies[int(np.argmin(measured))]
    candidates = {
        "chosen": chosen,
        "uniform": dict(zip(sources, _clean([1.0] * len(sources)))),
        "token-proportional": dict(zip(sources, _clean([shares[s] for s in sources]))),
        f"best proxy ({best['name']})": best["weights"],
    }
    check_seeds = [seed + 1 + i for i in range(recipe.proxies.check_seeds)]
    check_runs = check_blends(candidates, check_seeds, job, train)
    checks = [
        VariantScore(name, [r[objective] for r in runs], [r["curve"] for r in runs])
        for name, runs in check_runs.items()
    ]
    verdicts = [compare([checks[0], other], objective_name, higher_is_better=sign < 0)[0] for other in checks[1:]]
    result = MixResult(
        sources,
        proxies,
        rho,
        chosen,
        sign * predicted,
        checks,
        check_runs,
        verdicts,
        best,
        dict(zip(sources, linear_coefficients(model, len(sources)))),
        objective,
        objective_name,
        model_name,
        correlations,
        compute=compute_spent([*proxies, *(r for runs in check_runs.values() for r in runs)], budget, started),
    )
    result.recipe_out = write_chosen_recipe(
        recipe_file, chosen, out or recipe_file.with_name(f"{recipe_file.stem}-mixed.yaml")
    )
    if apply:
        apply_blend(recipe_file, chosen)
    result.data = data
    return result


def check_blends(
    candidates: dict[str, dict[str, float]],
    seeds: list[int],
    job: Callable[[Mixture, int], ProxyJob],
    train: Callable[[list[ProxyJob]], dict[str, dict[str, Any]]],
) -> dict[str, list[dict[str, Any]]]:
    """Each candidate blend trained at each of `seeds` (in one batch of proxies): its records, in
    the order of the seeds."""
    jobs = {name: [job(Mixture(f"{name} seed {s}", w), s) for s in seeds] for name, w in candidates.items()}
    results = train([j for js in jobs.values() for j in js])
    return {name: [results[j.fingerprint] for j in js] for name, js in jobs.items()}


def mixture_job(
    mixture: Mixture, data: TokenizedData, config: dict[str, Any], seed: int, targets: list[str]
) -> ProxyJob:
    """The proxy of `mixture`: the tokenized sources at its weights, trained at `seed`."""
    names = list(data.shards)
    return ProxyJob(
        mixture.name,
        [data.shards[n] for n in names],
        [mixture.weights[n] for n in names],
        seed,
        config,
        data.tokenizer,
        targets,
    )


def blend_yaml(weights: dict[str, float]) -> str:
    lines = ["blend:"] + [f"  - {{source: {s}, weight: {w:.4f}}}" for s, w in weights.items() if w > 0]
    return "\n".join(lines) + "\n"


def write_chosen_recipe(recipe_file: Path, weights: dict[str, float], path: Path) -> Path:
    """The recipe file with its blend replaced by `weights`, written to `path` (by default beside
    the recipe, so that its relative paths and comments mean what they meant)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, recipe_file.read_text())
    apply_blend(path, weights)
    return path


def apply_blend(recipe_file: Path, weights: dict[str, float]) -> None:
    """Replace the top-level `blend:` block of the recipe file (or add one), keeping every other
    line, comments included, as written."""
    text = recipe_file.read_text()
    block = re.compile(r"^blend:.*?(?=^\S|\Z)", re.MULTILINE | re.DOTALL)
    replacement = blend_yaml(weights)
    new = (
        block.sub(lambda _: replacement, text, count=1)
        if block.search(text)
        else text.rstrip("\n") + "\n" + replacement
    )
    atomic_write_text(recipe_file, new)
