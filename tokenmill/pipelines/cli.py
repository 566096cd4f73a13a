"""`tokenmill run RECIPE` and `tokenmill demo`."""

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
