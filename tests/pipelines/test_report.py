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
