"""Recipes: one YAML file describing a whole run (sources -> curation -> tokenizer -> blend ->
training -> evaluation), loaded into typed models (`schema`) and checked before anything runs
(`checks`).

Every mistake is reported with the key's location in the file (`curate[2].options.min_score`,
line 14) and, for a misspelt key or name, the closest valid one. All errors of a recipe are
collected and raised together, so a user fixes a file in one pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tokenmill.errors import ConfigError, YamlSyntaxError
from tokenmill.infra import storage
from tokenmill.pipelines.checks import check_recipe
from tokenmill.pipelines.schema import Recipe
from tokenmill.problems import Problems, line_index, pydantic_problems


class RecipeError(ConfigError):
    """All problems found in a recipe, one per line (one problem: one line in all)."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.problems = problems
        if len(problems) == 1:
            super().__init__(f"{path}: {problems[0]}")
            return
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problems in the recipe:\n{lines}")


def load_recipe(path: str | Path, *, check_paths: bool | str = True, base_dir: Path | None = None) -> Recipe:
    """Parse and validate a recipe file; raise `RecipeError` listing every problem. Relative
    paths resolve against `base_dir`, by default the file's directory (the current directory for
    a recipe read from a URL)."""
    if not storage.Location(path).is_local:
        if not storage.isfile(path):
            raise ConfigError(f"recipe not found: {path}")
        return parse_recipe(
            storage.read_text(path), origin=str(path), base_dir=base_dir or Path.cwd(), check_paths=check_paths
        )
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"recipe not found: {path}")
    return parse_recipe(
        path.read_text(), origin=str(path), base_dir=base_dir or path.resolve().parent, check_paths=check_paths
    )


def parse_recipe(
    text: str,
    *,
    origin: str,
    base_dir: Path,
    overrides: dict[str, Any] | None = None,
    check_paths: bool | str = True,
) -> Recipe:
    """Validate recipe text. `overrides` (top-level keys) replace the file's values before
    validation, so they are checked like the rest (the demo sets `eval` this way).
    `check_paths`: True (missing paths are errors), "warn" (listed in `recipe.warnings`, for
    dry runs of templates), False (not checked)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise YamlSyntaxError(origin, error) from None
    if not isinstance(data, dict):
        raise RecipeError(origin, ["the recipe must be a YAML mapping (sources:, curate:, ...)"])
    data.update(overrides or {})
    problems = Problems(line_index(text))
    try:
        recipe = Recipe.model_validate({**data, "base_dir": base_dir})
    except ValidationError as error:
        pydantic_problems(error, problems, Recipe)
        # The sections that passed are checked too, so that every problem is listed at once.
        reported = {item["loc"][0] for item in error.errors() if item["loc"]}
        rest = _valid_sections(data, reported, base_dir)
        if rest is not None:
            check_recipe(rest, problems, check_paths=check_paths, reported=reported)
        raise RecipeError(origin, problems.in_file_order()) from None
    check_recipe(recipe, problems, check_paths=check_paths)
    if problems.items:
        raise RecipeError(origin, problems.in_file_order())
    recipe._warnings.extend(problems.warnings)
    return recipe


def _valid_sections(data: dict[str, Any], reported: set[str], base_dir: Path) -> Recipe | None:
    """The recipe without the sections whose problems are reported; None where what is left is
    no recipe (its sources are among them)."""
    try:
        return Recipe.model_validate({**{k: v for k, v in data.items() if k not in reported}, "base_dir": base_dir})
    except ValidationError:
        return None
