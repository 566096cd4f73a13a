"""The stage registry: one declaration gives the command line and the recipe schema (no Dask)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from tokenmill.curate.dedup import DedupConfig
from tokenmill.curate.registry import (
    cli_stages,
    recipe_stage,
    recipe_stages,
)
from tokenmill.pipelines.plan import StepRef, build_plan
from tokenmill.pipelines.recipe import RecipeError, parse_recipe

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path, curate: str):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    text = "sources:\n  - {name: a, path: a.jsonl}\ncurate:\n" + textwrap.indent(textwrap.dedent(curate), "  ")
    return parse_recipe(text, origin="recipe.yaml", base_dir=tmp_path)


def test_recipe_stages_are_cli_stages_by_the_same_name():
    commands = {s.name for s in cli_stages()}
    current = {name for name, s in recipe_stages().items() if s.alias_of is None}
    assert current == {
        "extract",
        "normalize",
        "langid",
        "url-filter",
        "pii",
        "filter",
        "classify",
        "dedup",
        "decontaminate",
    }
    assert current <= commands
    assert {"exact_dedup", "fuzzy_dedup"} <= set(recipe_stages()) - commands


def test_dedup_options_come_from_dedup_config():
    model = recipe_stage("dedup").options_model()
    declared = {f.name for f in dataclasses.fields(DedupConfig)}
    # The runner owns the work directory and names the owner of the step's batch of an index.
    assert set(model.model_fields) == declared - {"work_dir", "keep_work", "index_owner"}
    # The command line has a flag for the same fields (and the CLI-only ones).
    parser = argparse.ArgumentParser()
    recipe_stage("dedup").add_cli(parser.add_subparsers())
    dests = {a.dest for a in parser._subparsers._group_actions[0].choices["dedup"]._actions}
    assert {"method", "threshold", "num_perm", "update_index", "work_dir", "keep_work", "batch_rows"} <= dests
    # The deprecated spelling takes the options it always took.
    assert set(recipe_stage("exact_dedup").options_model().model_fields) == {
        "normalize",
        "keep",
        "batch_rows",
        "partition_rows",
        "shuffle",
    }


def test_old_dedup_spelling_runs_as_dedup_with_a_warning(tmp_path):
    old = _recipe(
        tmp_path,
        """
        - stage: exact_dedup
        - stage: fuzzy_dedup
          options: {threshold: 0.7}
    """,
    )
    new = _recipe(
        tmp_path,
        """
        - stage: dedup
          name: exact_dedup
          options: {method: exact}
        - stage: dedup
          name: fuzzy_dedup
          options: {method: fuzzy, threshold: 0.7}
    """,
    )
    assert any("`exact_dedup` is deprecated" in w and "method: exact" in w for w in old.warnings)
    assert not new.warnings
    old_plan, new_plan = build_plan(old, tmp_path / "w"), build_plan(new, tmp_path / "w")
    assert [(s.name, s.output) for s in old_plan] == [(s.name, s.output) for s in new_plan]
    # The same stage runs with the same options (the old spelling keeps its fingerprint: the
    # config records the stage as written, so existing work directories stay fresh).
    for old_step, new_step in zip(old_plan[1:], new_plan[1:]):
        old_kind, new_kind = recipe_stage(old_step.config["stage"]), recipe_stage(new_step.config["stage"])
        assert old_kind.run is new_kind.run
        assert old_kind.recipe_options(old_step.config["options"]) == new_kind.recipe_options(
            new_step.config["options"]
        )
    assert old_plan[-1].name == StepRef.curate("a", "fuzzy_dedup") == "curate.a.fuzzy_dedup"


def test_old_spelling_keeps_its_option_set(tmp_path):
    with pytest.raises(RecipeError, match="unknown option `threshold` for stage exact_dedup"):
        _recipe(
            tmp_path,
            """
            - stage: exact_dedup
              options: {threshold: 0.7}
        """,
        )


def test_pipelines_guess_no_names():
    for path in (REPO / "tokenmill" / "pipelines").glob("*.py"):
        text = path.read_text()
        for guess in ("import_module", "globals()", "ModuleNotFoundError", "getattr(eval_tasks"):
            assert guess not in text, f"{path.name}: {guess}"
