"""`tokenmill ablate`: does a curation make a better model? Variants of a recipe (or several
recipes) are curated and tokenized, the same proxy model trains on each for the same budget
with S seeds, and each proxy is scored in bits per byte on one held-out text, as DataDecide
(Magnusson et al., 2025) ranks corpora with small models.

A variant is a set of overrides of the recipe: `strict: curate.filter.options.min_score=0.9`
(a curation step by its name, then its keys), `sources.wiki.path=clean.jsonl` (a source by
name), `blend.wiki.weight=2`, `tokenize.vocab_size=4096`. Each variant runs in its own
work directory; a step whose fingerprint an earlier variant already finished is linked from
there, not run again, and proxies of identical data are one proxy (proxies.py).

The verdict for each pair: the difference of the mean targets, and whether it exceeds twice
its standard error (the seed-to-seed spread of each variant, sd / sqrt(S), combined), which
is the noise a single pair of runs cannot tell from a real effect. With a suite among the
targets (CORE, DCLM's early-signal suite), every pair has a second verdict on its score.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenmill.errors import ConfigError
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
from tokenmill.pipelines.recipe import Recipe, parse_recipe
from tokenmill.pipelines.step_graph import build_plan, is_fresh, state_path

log = logging.getLogger(__name__)

VARIANTS_DIR = "variants"


@dataclass
class Variant:
    name: str
    recipe: Recipe


@dataclass
class AblateResult:
    variants: list[VariantScore]  # by the target's bits per byte (empty without text to score)
    comparisons: list[Comparison]
    seeds: int
    compute: dict[str, float] = field(default_factory=dict)
    suite: str | None = None  # the suite's name, when the proxies were scored on one
    suite_variants: list[VariantScore] = field(default_factory=list)  # by its score
    suite_comparisons: list[Comparison] = field(default_factory=list)


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME: key=value key=value` (values read as YAML: 0.9 is a number, [a, b] a list)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"--variant {text!r}: expected NAME: key=value ... (NAME letters, digits, - and _)")
    overrides: dict[str, Any] = {}
    for item in shlex.split(rest):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--variant {name}: {item!r} is not key=value")
        overrides[key] = yaml.safe_load(value)
    return name, overrides


def variant_sections(data: dict[str, Any], overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """The recipe's top-level sections that `overrides` change, changed (copies). A list section
    (sources, curate, blend) is addressed by its items' names: `curate.NAME...`, where NAME is
    a step's `name` or stage, `sources.NAME...`, `blend.SOURCE...`."""
    changed: dict[str, Any] = {}
    for key, value in overrides.items():
        section, *path = key.split(".")
        if section not in data and section not in ("blend", "tokenize", "proxies"):
            raise ConfigError(f"{where}: {key}: the recipe has no section {section!r}")
        current = changed.setdefault(section, yaml.safe_load(yaml.safe_dump(data.get(section))))
        if not path:
            changed[section] = value
            continue
        node = current
        if isinstance(node, list):
            node = _named_item(node, path.pop(0), section, key, where)
        if node is None:
            node = changed[section] = {}
        for part in path[:-1]:
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: {key}: {part!r} is not inside a mapping")
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {key}: not a mapping")
        node[path[-1]] = value
    return changed


def _named_item(items: list[Any], name: str, section: str, key: str, where: str) -> dict[str, Any]:
    field_name = {"sources": "name", "blend": "source"}.get(section)
    for item in items:
        if not isinstance(item, dict):
            continue
        names = [item.get(field_name)] if field_name else [item.get("name"), item.get("stage")]
        if name in names:
            return item
    known = [
        str(i.get(field_name) if field_name else i.get("name") or i.get("stage")) for i in items if isinstance(i, dict)
    ]
    raise ConfigError(f"{where}: {key}: no {section} item named {name!r} (the recipe has {', '.join(known)})")


def load_variants(recipe_paths: list[str], variant_texts: list[str]) -> list[Variant]:
    """One variant per `--variant` of the first recipe, or one per recipe when several are given."""
    from tokenmill.recipes import resolve_recipe

    if len(recipe_paths) > 1 and variant_texts:
        raise ConfigError("ablate: give several recipes or --variant overrides of one recipe, not both")
    loaded = []
    for spec in recipe_paths:
        path, bundled = resolve_recipe(spec)
        if not Path(path).is_file():
            raise ConfigError(f"recipe not found: {spec}")
        loaded.append((path, Path.cwd() if bundled else Path(path).resolve().parent))
    if len(recipe_paths) > 1:
        variants = []
        for path, base in loaded:
            recipe = parse_recipe(Path(path).read_text(), origin=str(path), base_dir=base)
            variants.append(Variant(recipe.name, recipe))
    else:
        path, base = loaded[0]
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        variants = []
        for vtext in variant_texts:
            name, overrides = parse_variant(vtext)
            origin = f"{path} (variant {name})"
            changed = variant_sections(data, overrides, f"--variant {name}") if isinstance(data, dict) else {}
            variants.append(Variant(name, parse_recipe(text, origin=origin, base_dir=base, overrides=changed)))
    names = [v.name for v in variants]
    if len(variants) < 2:
        raise ConfigError("ablate: compare at least two variants (--variant NAME: ... twice, or two recipes)")
    if len(set(names)) < len(names):
        raise ConfigError(f"ablate: variant names repeat: {', '.join(names)}")
    return variants


def share_finished_steps(recipe: Recipe, workdir: Path, earlier: list[Path]) -> int:
    """Link into `workdir` every step of `recipe` that an earlier variant's work directory
    finished under the same fingerprint (its output hard-linked, its record copied), so that
    the run finds it up to date. Returns the number of steps shared."""
    shared = 0
    for step in build_plan(recipe, workdir):
        if is_fresh(workdir, step):
            continue
        for other in earlier:
            theirs = next((s for s in build_plan(recipe, other) if s.name == step.name), None)
            if theirs is None or theirs.fingerprint != step.fingerprint or not is_fresh(other, theirs):
                continue
            shutil.rmtree(step.output, ignore_errors=True)
            step.output.parent.mkdir(parents=True, exist_ok=True)
            if theirs.output.is_dir():
                shutil.copytree(theirs.output, step.output, copy_function=os.link)
            else:
                os.link(theirs.output, step.output)
            state_path(workdir, step).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(state_path(other, theirs), state_path(workdir, step))
            shared += 1
            break
    return shared


def run_ablate(
    variants: list[Variant],
    workdir: Path,
    *,
    targets: list[str] | None = None,
    seeds: int | None = None,
    steps: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    slurm: SlurmSpec | None = None,
    scheduler: str | None = None,
) -> AblateResult:
    started = time.time()
    base = variants[0].recipe
    seeds = seeds or base.proxies.seeds
    scoring = check_targets(base, targets or base.proxies.targets(), "ablate")
    config = proxy_config(base, steps, scoring.suite)
    workers = default_workers(base, workers)
    prepared: dict[str, TokenizedData] = {}
    done_dirs: list[Path] = []
    for variant in variants:
        variant_dir = workdir / VARIANTS_DIR / variant.name
        shared = share_finished_steps(variant.recipe, variant_dir, done_dirs)
        if shared:
            log.info(f"variant {variant.name}: {shared} steps shared with earlier variants")
        prepared[variant.name] = tokenize_recipe(variant.recipe, variant_dir, scheduler=scheduler, progress=progress)
        done_dirs.append(variant_dir)
        budget = check_budget(prepared[variant.name], config, f"ablate: variant {variant.name}")
    jobs = {
        variant.name: [
            _job(variant.name, prepared[variant.name], config, base.proxies.seed + s, scoring.files)
            for s in range(seeds)
        ]
        for variant in variants
    }
    results = run_proxies([j for js in jobs.values() for j in js], workdir, workers, slurm=slurm, scheduler=scheduler)

    def by(key: str) -> list[VariantScore]:
        return [
            VariantScore(name, [results[j.fingerprint][key] for j in js], [results[j.fingerprint]["curve"] for j in js])
            for name, js in jobs.items()
        ]

    scores = by("target_bpb") if scoring.files else []
    suite_scores = by("suite_score") if scoring.suite else []
    suite = scoring.suite.suite if scoring.suite else None
    return AblateResult(
        scores,
        compare(scores),
        seeds,
        compute=compute_spent(results.values(), budget, started),
        suite=suite,
        suite_variants=suite_scores,
        suite_comparisons=compare(suite_scores, f"{suite} score", higher_is_better=True),
    )


def _job(name: str, data: TokenizedData, config: dict[str, Any], seed: int, targets: list[str]) -> ProxyJob:
    names = list(data.shards)
    return ProxyJob(
        f"{name} seed {seed}",
        [data.shards[n] for n in names],
        [data.weights[n] for n in names],
        seed,
        config,
        data.tokenizer,
        targets,
    )
