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
from tokenmill.pipelines.recipe import RecipeError, parse_recipe

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path, curate: str):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    text = "sources:\n  - {name: a, path: a.jsonl}\ncurate:\n" + textwrap.indent(textwrap.dedent(curate), "  ")
    return parse_recipe(text, origin="recipe.yaml", base_dir=tmp_path)


def test_recipe_stages_are_cli_stages_by_the_same_name():
    commands = {s.name for s in cli_stages()}
    current = set(recipe_stages())
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


@pytest.mark.parametrize("old, method", [("exact_dedup", "exact"), ("fuzzy_dedup", "fuzzy")])
def test_old_dedup_spelling_names_the_new_one(tmp_path, capsys, old, method):
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, f"- stage: {old}\n")
    assert str(info.value) == (
        f"recipe.yaml: curate[0].stage (line 4): stage `{old}` is now `stage: dedup` with"
        f" `options: {{method: {method}}}` (and `name: {old}` to keep the step's name)"
    )
    from tokenmill.cli import main

    (tmp_path / "r.yaml").write_text(f"sources:\n  - {{name: a, path: a.jsonl}}\ncurate:\n  - stage: {old}\n")
    assert main(["run", str(tmp_path / "r.yaml"), "--dry-run"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tokenmill: error:") and f"stage `{old}` is now `stage: dedup`" in line


def test_pipelines_guess_no_names():
    for path in (REPO / "tokenmill" / "pipelines").glob("*.py"):
        text = path.read_text()
        for guess in ("import_module", "globals()", "ModuleNotFoundError", "getattr(eval_tasks"):
            assert guess not in text, f"{path.name}: {guess}"
