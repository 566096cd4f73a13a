"""The report reads the training config in its sections, as the trainer writes it (no Dask, no
training: the run directory holds what the trainer leaves)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml

from tokenmill.pipelines.plan import build_plan
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.report import train_config, write_report
from tokenmill.train.config import apply_overrides, config_from_dict
from tokenmill.train.metrics import MetricsLogger

RECIPE = """
name: layout
sources:
  - {name: a, path: a.jsonl}
tokenize: {vocab_size: 300}
blend:
  - {source: a, weight: 1}
train: {config: tiny, parallel: {dp: 2, zero: 1}, schedule: {steps: 8}}
"""


def test_training_table_gives_the_layout_the_run_trained_with(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(RECIPE))
    recipe = load_recipe(tmp_path / "recipe.yaml")
    work = tmp_path / "work"
    work.mkdir()  # as the run makes it before the report
    steps = build_plan(recipe, work)
    # Before training: the recipe's layout and schedule, the trainer's defaults filled in.
    planned = train_config(recipe, work)
    assert planned is not None and planned["parallel"]["dp"] == 2 and planned["schedule"]["steps"] == 8
    md, _ = write_report(recipe, work, steps)
    assert "Training has not run yet." in md.read_text()

    # What the trainer leaves in its run directory: config.yaml in sections, and metrics.
    run = work / "train" / "run"
    trained = config_from_dict(apply_overrides(recipe.train_config_dict(), {"out": str(run)}))
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(trained.to_dict(), sort_keys=False))
    logger = MetricsLogger(run, tensorboard=False)
    logger.log({"step": 8, "loss": 5.0, "consumed_samples": 128, "tokens_per_s": 1000.0})
    logger.close()
    md, html = write_report(recipe, work, steps)
    assert "| layout | tp=1 pp=1 dp=2 zero=1 |" in md.read_text()
    assert "<td>layout</td><td>tp=1 pp=1 dp=2 zero=1</td>" in html.read_text()


EVAL_RECIPE = """
name: evaluated
sources:
  - {name: a, path: a.jsonl}
tokenize: {vocab_size: 300}
blend:
  - {source: a, weight: 1}
train:
  config: tiny
  eval: {every: 4, suite: core, tasks: [copa, winograd], data_dir: icl, bpb: held_out.jsonl}
"""


def test_evaluation_during_training_is_a_recipe_key_and_a_curve_per_task(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(EVAL_RECIPE))
    recipe = load_recipe(tmp_path / "recipe.yaml", check_paths=False)
    section = recipe.train_config_dict()["eval"]
    # Paths relative to the recipe, as its other paths; the bundled suite's name stays a name.
    assert section["data_dir"] == str(tmp_path / "icl") and section["bpb"] == str(tmp_path / "held_out.jsonl")
    assert section["suite"] == "core" and section["tasks"] == ["copa", "winograd"]
    work = tmp_path / "work"
    work.mkdir()
    steps = build_plan(recipe, work)
    run = work / "train" / "run"
    logger = MetricsLogger(run, tensorboard=False)
    for step, score in ((4, 0.1), (8, 0.3)):
        logger.log(
            {
                "step": step,
                "loss": 5.0,
                "eval/copa/acc": 0.5,
                "eval/copa/centered_acc": score,
                "eval/winograd/acc": 0.5,
                "eval/winograd/centered_acc": -score,
                "eval/core": 0.0,
                "eval/bpb": 3.0 - score,
                "eval/seconds": 1.0,
            }
        )
    logger.close()
    _, html = write_report(recipe, work, steps)
    page = html.read_text()
    figure = page[page.index('data-chart="in-training evaluation') :]
    figure = figure[: figure.index("</figure>")]
    assert all(f">{name}</text>" in figure for name in ("CORE", "copa", "winograd"))
    assert "seconds" not in figure
    assert 'data-chart="bits per byte"' in page
