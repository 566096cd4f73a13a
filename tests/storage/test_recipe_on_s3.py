"""A recipe read from a bucket whose sources are on the bucket: the re-run skips every
finished step, and a changed object re-runs its ingest and what follows."""

from __future__ import annotations

import pytest

from tokenmill.errors import ConfigError
from tokenmill.infra import storage
from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.runner import run_recipe

RECIPE = """
name: bucket
sources:
  - name: plays
    path: {bucket}/raw/plays.txt
    format: text
    separator: '\\n\\n'
  - name: notes
    path: {bucket}/raw/notes
    format: jsonl
curate:
  - stage: normalize
  - stage: exact_dedup
"""


@pytest.mark.slow
def test_recipe_with_bucket_sources_resumes(bucket, shared_data, s3_dask_client, tmp_path) -> None:
    plays = (shared_data / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000]
    storage.write_text(f"{bucket}/raw/plays.txt", plays)
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n{"text": "a note"}\n')
    storage.write_text(f"{bucket}/recipes/bucket.yaml", RECIPE.format(bucket=bucket))
    recipe = load_recipe(f"{bucket}/recipes/bucket.yaml")
    workdir = tmp_path / "work"

    first = run_recipe(recipe, workdir, progress=False, report=False, client=s3_dask_client)
    assert {s.status for s in first.steps} == {"ran"} and len(first.steps) == 6
    second = run_recipe(
        load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, report=False, client=s3_dask_client
    )
    assert {s.status for s in second.steps} == {"skipped"}

    # A changed object on the bucket: its source's steps run again, the other source's do not.
    storage.write_text(f"{bucket}/raw/notes/a.jsonl", '{"text": "a note"}\n{"text": "another note"}\n')
    third = run_recipe(
        load_recipe(f"{bucket}/recipes/bucket.yaml"), workdir, progress=False, report=False, client=s3_dask_client
    )
    ran = sorted(s.name for s in third.steps if s.status == "ran")
    assert ran and all("notes" in name for name in ran), ran
    assert all("plays" in s.name for s in third.steps if s.status == "skipped")

    with pytest.raises(ConfigError, match="recipe not found"):
        load_recipe(f"{bucket}/recipes/missing.yaml")


def test_a_missing_source_on_the_bucket_is_a_recipe_problem(bucket) -> None:
    storage.write_text(f"{bucket}/r.yaml", RECIPE.format(bucket=bucket))
    with pytest.raises(ConfigError, match="path not found"):
        load_recipe(f"{bucket}/r.yaml")
