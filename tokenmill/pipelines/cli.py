"""`tokenmill run RECIPE`, `tokenmill demo`, `tokenmill ablate` and `tokenmill mix`."""

from __future__ import annotations

import argparse
import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any

from tokenmill.infra.slurm_options import add_slurm_options, check_slurm_only_options

log = logging.getLogger(__name__)

DEMO_RECIPE = "demo.yaml"


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="from_",
        action="append",
        metavar="STEP",
        help="re-run this step and everything after it that depends on it (a step name, a prefix such as"
        " `curate` or `tokenize`, or a stage name such as `langid`); repeatable",
    )
    parser.add_argument(
        "--until", action="append", metavar="STEP", help="stop after this step (and what it needs); repeatable"
    )
    parser.add_argument(
        "--force",
        action="append",
        metavar="STEP",
        help="re-run this step and its dependents even when their fingerprints are unchanged; repeatable",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the plan (with the training layout and memory); run nothing",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        help="address of a Dask scheduler for curation (default: the recipe's, else $DASK_SCHEDULER_ADDRESS, else a LocalCluster)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="LocalCluster worker processes (default: one per core)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run",
        help="run a recipe end to end: curate, tokenize, train, evaluate, report",
        description="Run every stage of a YAML recipe. Steps whose fingerprint is unchanged are skipped; a killed run"
        " started again resumes. Writes WORKDIR/report.html and report.md.",
    )
    run.add_argument(
        "recipe",
        help="a recipe YAML file, or the name of a bundled recipe: mtnlg (a documented MT-NLG 530B template), demo,"
        " common-crawl (WARC files -> curated tokens)",
    )
    run.add_argument("--workdir", default=None, help="work directory (default: the recipe's `workdir:` or ./NAME-work)")
    _add_run_options(run)
    add_slurm_options(run)
    run.set_defaults(func=_run_command)

    demo = subparsers.add_parser(
        "demo",
        help="the bundled end-to-end demo: Python's own docs -> curated corpus -> tokenizer -> GPT (dp=2) -> eval",
        description="Run the bundled recipe (tokenmill/recipes/demo.yaml) offline on the CPU: a corpus assembled from the"
        " documentation that ships with Python and installed packages, every curation stage, a trained"
        " tokenizer, token shards, a small GPT trained with data parallelism over 2 processes, evaluation.",
    )
    demo.add_argument("--workdir", default="demo-work", help="work directory (default: ./demo-work)")
    demo.add_argument(
        "--eval-data",
        default=None,
        metavar="DIR",
        help="benchmark files in their original formats (piqa_valid.jsonl, ...); tasks whose files are here"
        " are evaluated, and the corpus is decontaminated against them",
    )
    _add_run_options(demo)
    demo.set_defaults(func=_demo_command)
    _register_decisions(subparsers)


def _add_proxy_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        action="append",
        metavar="FILE",
        help="held-out text the proxies are scored on in bits per byte (.txt, .jsonl with `text`, or a document"
        " directory); repeatable (default: the recipe's proxies.target)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per proxy (default: proxies.steps, 200)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="proxies trained at once (default: proxies.workers, else cores / 2)"
    )
    parser.add_argument("--workdir", default=None, help="work directory (default: ./NAME-COMMAND)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")
    parser.add_argument(
        "--scheduler",
        default=None,
        help="address of a Dask scheduler: the curation runs there and each proxy trains as one task of its"
        " workers (default: the recipe's scheduler:, else local processes)",
    )
    # With --slurm the proxies train as one job array (one task each), the command waits for it.
    add_slurm_options(parser)


def _register_decisions(subparsers: argparse._SubParsersAction) -> None:
    ablate = subparsers.add_parser(
        "ablate",
        help="compare curated corpora: the same small proxy model trained on each variant, with seeds, and a verdict",
        description="Curate and tokenize each variant of a recipe (steps that variants share run once), train the"
        " recipe's proxy model (proxies: section) on each for the same token budget with S seeds, score every proxy in"
        " bits per byte on one held-out text, and say which differences exceed the seed-to-seed noise."
        " Writes WORKDIR/ablate.md and ablate.html. A killed run started again trains only the proxies it has no"
        " result of.",
    )
    ablate.add_argument("recipe", nargs="+", help="a recipe (with --variant), or several recipes, one variant each")
    ablate.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'NAME: KEY=VALUE ...'",
        help="a variant of the recipe: overrides such as curate.filter.options.min_score=0.9,"
        " sources.wiki.path=clean.jsonl, blend.wiki.weight=2; `NAME:` alone is the recipe as written; repeatable",
    )
    ablate.add_argument("--seeds", type=int, default=None, help="proxies per variant (default: proxies.seeds, 3)")
    _add_proxy_options(ablate)
    ablate.set_defaults(func=_ablate_command)

    mix = subparsers.add_parser(
        "mix",
        help="find the blend of a recipe's sources that best predicts a held-out target, with small proxy models",
        description="Sample mixtures of the recipe's sources around their token shares, train a proxy on each, fit a"
        " regression from weights to the target's bits per byte, search the simplex with it, and write the chosen"
        " weights as a recipe (RegMix). The check: the chosen, uniform, token-proportional and best proxy's blends"
        " train again at proxies.check_seeds fresh seeds, compared beyond the seed noise. Writes WORKDIR/mix.md and"
        " mix.html; a killed run started again trains only what had not finished.",
    )
    mix.add_argument("recipe", help="a recipe file with two or more sources and a tokenize: section")
    mix.add_argument("--mixtures", type=int, default=None, help="mixtures sampled (default: proxies.mixtures, 16)")
    mix.add_argument(
        "--mixture",
        action="append",
        default=[],
        metavar="SOURCE=W,...",
        help="a mixture to train besides the sampled ones (weights summing to 1); repeatable",
    )
    mix.add_argument(
        "--out", default=None, help="the recipe written with the chosen blend (default: WORKDIR/NAME-mixed.yaml)"
    )
    mix.add_argument("--apply", action="store_true", help="also write the chosen blend into the recipe file's blend:")
    _add_proxy_options(mix)
    mix.set_defaults(func=_mix_command)


def _positive(args: argparse.Namespace, *names: str) -> None:
    from tokenmill.errors import ConfigError

    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be at least 1 (got {value})")


def _proxy_placement(recipe: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Where the proxies train: `slurm` (a job array's spec) or `scheduler` (a Dask cluster's
    address), neither for local processes; the two flags together are one line."""
    from tokenmill.errors import ConfigError
    from tokenmill.infra.slurm_options import slurm_overrides
    from tokenmill.pipelines.proxies import proxy_scheduler, proxy_slurm_spec

    if args.scheduler and args.slurm:
        raise ConfigError("--scheduler and --slurm: the proxies train on a Dask cluster or a Slurm job array, not both")
    slurm = None if args.scheduler else proxy_slurm_spec(recipe, args.slurm, slurm_overrides(args))
    return {"slurm": slurm, "scheduler": proxy_scheduler(recipe, args.scheduler, slurm)}


def _ablate_command(args: argparse.Namespace) -> int:
    from tokenmill.pipelines.ablate import load_variants, run_ablate
    from tokenmill.pipelines.decision_report import write_ablate_report

    _positive(args, "seeds", "steps", "workers")
    check_slurm_only_options(args)
    variants = load_variants(args.recipe, args.variant)
    workdir = Path(args.workdir or f"{variants[0].recipe.name}-ablate").resolve()
    result = run_ablate(
        variants,
        workdir,
        targets=args.target,
        seeds=args.seeds,
        steps=args.steps,
        workers=args.workers,
        progress=not args.no_progress,
        **_proxy_placement(variants[0].recipe, args),
    )
    for score in result.variants:
        print(f"{score.name}: {score.mean:.4f} bits/byte (sd {score.sd:.4f} over {len(score.scores)} seeds)")
    for score in result.suite_variants:
        print(f"{score.name}: {result.suite} {score.mean:.4f} (sd {score.sd:.4f} over {len(score.scores)} seeds)")
    for comparison in result.comparisons + result.suite_comparisons:
        print(comparison.verdict)
    print(f"report: {write_ablate_report(result, workdir)}")
    return 0


def _mix_command(args: argparse.Namespace) -> int:
    from tokenmill.errors import ConfigError
    from tokenmill.pipelines.decision_report import write_mix_report
    from tokenmill.pipelines.mix import run_mix
    from tokenmill.pipelines.recipe import load_recipe

    _positive(args, "mixtures", "steps", "workers")
    check_slurm_only_options(args)
    path = Path(args.recipe)
    if not path.is_file():
        raise ConfigError(f"recipe not found: {args.recipe}")
    recipe = load_recipe(path)
    workdir = Path(args.workdir or f"{recipe.name}-mix").resolve()
    result = run_mix(
        recipe,
        path,
        workdir,
        targets=args.target,
        mixtures=args.mixtures,
        steps=args.steps,
        workers=args.workers,
        extra=args.mixture,
        out=Path(args.out).resolve() if args.out else None,
        apply=args.apply,
        progress=not args.no_progress,
        **_proxy_placement(recipe, args),
    )
    print(
        f"rank correlation (leave-one-out, {len(result.proxies)} proxies, {result.model} regression):"
        f" {result.rank_correlation:.3f}"
    )
    print("chosen blend: " + ", ".join(f"{s}={w:.3f}" for s, w in result.chosen.items()))
    for score in result.checks:
        print(
            f"{score.name}: {score.mean:.4f} {result.objective_name} (sd {score.sd:.4f} over {len(score.scores)} seeds)"
        )
    for verdict in result.verdicts:
        print(verdict.verdict)
    print(f"recipe: {result.recipe_out}")
    print(f"report: {write_mix_report(result, workdir)}")
    return 0


def _run_recipe(recipe: Any, workdir: str | Path, args: argparse.Namespace) -> int:
    from tokenmill.pipelines.runner import format_plan, run_recipe

    if args.dry_run:
        print(format_plan(recipe, workdir, args.from_, args.until, args.force))
        return 0
    run_recipe(
        recipe,
        workdir,
        from_=args.from_,
        until=args.until,
        force=args.force,
        scheduler=args.scheduler,
        workers=args.workers,
        progress=not args.no_progress,
    )
    return 0


def _run_command(args: argparse.Namespace) -> int:
    from tokenmill.pipelines.recipe import load_recipe
    from tokenmill.pipelines.workdir import default_workdir, resolve_workdir
    from tokenmill.recipes import resolve_recipe

    path, bundled = resolve_recipe(args.recipe)
    # A bundled recipe is a template: its relative paths mean the user's directory, not the package's.
    recipe = load_recipe(path, check_paths="warn" if args.dry_run else True, base_dir=Path.cwd() if bundled else None)
    for warning in recipe.warnings:
        log.warning(warning)
    workdir = resolve_workdir(args.workdir) if args.workdir else default_workdir(recipe)
    from tokenmill.pipelines.recipe_job import submit_recipe

    check_slurm_only_options(args)
    if args.slurm:
        submit_recipe(recipe, args.recipe, workdir, args)
        return 0
    return _run_recipe(recipe, workdir, args)


def demo_recipe_text() -> str:
    return resources.files("tokenmill").joinpath("recipes", DEMO_RECIPE).read_text()


def demo_overrides(eval_data: str | None) -> dict[str, Any]:
    """With `--eval-data`, the demo evaluates the benchmark tasks found there and
    decontaminates the corpus against them; without, it reports held-out perplexity only."""
    import yaml  # only the demo reads YAML here: `tokenmill --help` need not load it

    base = yaml.safe_load(demo_recipe_text())
    evaluation = dict(base.get("eval") or {})
    curate = list(base.get("curate") or [])
    if eval_data:
        data_dir = str(Path(eval_data).resolve())
        evaluation.update(data_dir=data_dir, skip_missing=True)
        for step in curate:
            if step.get("stage") == "decontaminate":
                step.setdefault("options", {})["data_dir"] = data_dir
    else:
        evaluation.update(tasks=[], data_dir=None)
        curate = [s for s in curate if s.get("stage") != "decontaminate"]
    return {"eval": evaluation, "curate": curate}


def _demo_command(args: argparse.Namespace) -> int:
    from tokenmill.pipelines.recipe import parse_recipe

    if args.eval_data and not Path(args.eval_data).is_dir():
        from tokenmill.errors import TokenmillError

        raise TokenmillError(f"--eval-data {args.eval_data} is not a directory")
    recipe = parse_recipe(
        demo_recipe_text(),
        origin=f"tokenmill/recipes/{DEMO_RECIPE}",
        base_dir=Path.cwd(),
        overrides=demo_overrides(args.eval_data),
    )
    started = time.time()
    code = _run_recipe(recipe, Path(args.workdir).resolve(), args)
    if not args.dry_run:
        log.info(f"demo finished in {time.time() - started:.0f}s")
    return code
