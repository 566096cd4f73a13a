"""The report reads the training config in its sections, as the trainer writes it (no Dask, no
training: the run directory holds what the trainer leaves)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import yaml
from pipeline_outputs import assert_blend_table_is_the_draw
from shard_writing import add_each

from tokenmill.pipelines.context import Context
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.report import train_config, write_report
from tokenmill.pipelines.step_graph import StepRef, build_plan
from tokenmill.pipelines.steps import RUNNERS
from tokenmill.tokenize.indexed import IndexedDatasetWriter
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
    # An even count of speeds: the median is the mean of the middle two, not the upper one.
    for step, speed, mfu in ((2, 1000.0, 0.1), (4, 2000.0, 0.2), (6, 3000.0, 0.4), (8, 5000.0, 0.5)):
        logger.log({"step": step, "loss": 5.0, "consumed_samples": 16 * step, "tokens_per_s": speed, "mfu": mfu})
    logger.close()
    md, html = write_report(recipe, work, steps)
    assert "| layout | tp=1 pp=1 dp=2 zero=1 |" in md.read_text()
    assert "| median tokens/s | 2500 |" in md.read_text() and "| median MFU | 0.3 |" in md.read_text()
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


# Sources given in epochs and in weights, interleaved, of different sizes: the blend step
# orders its weights one way (epoch sources first), the blend file another (the recipe's).
MIXED_BLEND = """
name: mixed
sources:
  - {name: a, path: a.jsonl}
  - {name: b, path: b.jsonl}
  - {name: c, path: c.jsonl}
  - {name: d, path: d.jsonl}
tokenize: {vocab_size: 300}
blend:
  - {source: a, weight: 0.6}
  - {source: b, epochs: 1}
  - {source: c, weight: 0.4}
  - {source: d, epochs: 2}
train: {config: tiny, schedule: {steps: 30}}
"""


def test_blend_table_gives_each_source_its_own_realised_share_and_epochs(tmp_path: Path) -> None:
    """With `epochs:` and `weight:` sources mixed, each row's realised share and epochs are
    those of its own source in the trainer's blended dataset (the samples it will draw)."""
    for source in "abcd":
        (tmp_path / f"{source}.jsonl").write_text(json.dumps({"text": "hello world"}) + "\n")
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(MIXED_BLEND))
    recipe = load_recipe(tmp_path / "recipe.yaml")
    work = tmp_path / "work"
    work.mkdir()
    steps = build_plan(recipe, work)
    by_name = {s.name: s for s in steps}
    # The encode steps' shards as `tokenize encode` leaves them: 40 documents each, of sizes
    # that make every source's share differ from the others'.
    doc_tokens = {"a": 25, "b": 75, "c": 12, "d": 50}
    for source, length in doc_tokens.items():
        prefix = by_name[StepRef.encode(source)].output / source
        writer = IndexedDatasetWriter(prefix, np.uint16)
        add_each(writer, [np.arange(length) % 300] * 40)
        writer.finalize()
        counts = {"in": 40, "kept": 40, "rejected": {}}
        Path(f"{prefix}.json").write_text(json.dumps({"tokens": 40 * length, "documents": 40, "counts": counts}))
    context = Context(recipe, work, steps, scheduler=None, workers=None, progress=False)
    RUNNERS["blend"](context, by_name[StepRef.blend()])

    md, _ = write_report(recipe, work, steps)
    config = train_config(recipe, work)
    assert config is not None
    samples = 30 * config["schedule"]["global_batch_size"]
    assert f"realised shares are those of the {samples:,} samples training will draw" in md.read_text()
    blend = assert_blend_table_is_the_draw(md.read_text(), work / "blend" / "blend.json", config, samples, list("abcd"))
    assert len({blend[source][3] for source in "abcd"}) == 4  # a permutation of the sources' numbers would show
