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
from pydantic import Field, ValidationError

from tokenmill.errors import ConfigError, YamlSyntaxError
from tokenmill.infra import storage
from tokenmill.pipelines.checks import LeftOut, check_recipe
from tokenmill.pipelines.schema import Recipe, Source
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
        # The sections and items that passed are checked too, so that every problem is listed at once.
        rest, left_out = _valid_parts(data, [item["loc"] for item in error.errors()], base_dir, problems)
        if rest is not None:
            check_recipe(rest, problems, check_paths=check_paths, left_out=left_out)
        raise RecipeError(origin, problems.in_file_order()) from None
    check_recipe(recipe, problems, check_paths=check_paths)
    if problems.items:
        raise RecipeError(origin, problems.in_file_order())
    recipe._warnings.extend(problems.warnings)
    return recipe


# The list sections whose bad items are left out of the checks one by one; other sections
# mention the items of the first two by their names.
ITEM_SECTIONS = ("sources", "classifiers", "curate", "blend")
NAMED_SECTIONS = ("sources", "classifiers")


class _CheckedPart(Recipe):
    """What of a recipe is checked once the parts with problems of their own are left out: its
    sources may all be among them."""

    sources: list[Source] = Field(default_factory=list)


def _valid_parts(
    data: dict[str, Any], error_locs: list[tuple[Any, ...]], base_dir: Path, problems: Problems
) -> tuple[Recipe | None, LeftOut]:
    """(the recipe without the sections and list items whose problems are reported, or None where
    what is left is no recipe; what was left out).

    Where items of a list section are left out, `problems` is told each kept item's place in
    the file, so that a later check still names `curate[2]` as the file has it."""
    bad_items: dict[str, set[int]] = {}
    whole: set[str] = set()
    for loc in error_locs:
        if not loc:
            continue
        if loc[0] in ITEM_SECTIONS and len(loc) > 1 and isinstance(loc[1], int) and isinstance(data[loc[0]], list):
            bad_items.setdefault(loc[0], set()).add(loc[1])
        else:
            whole.add(loc[0])
    kept = {key: value for key, value in data.items() if key not in whole}
    names: dict[str, frozenset[str] | None] = {}
    for key, bad in bad_items.items():
        if key in kept:
            places = [i for i in range(len(data[key])) if i not in bad]
            kept[key] = [data[key][i] for i in places]
            problems.item_places[key] = places
            if key in NAMED_SECTIONS:
                names[key] = _names_of(data[key][i] for i in sorted(bad))
    left_out = LeftOut(frozenset(whole), names)
    try:
        return _CheckedPart.model_validate({**kept, "base_dir": base_dir}), left_out
    except ValidationError:
        return None, left_out


def _names_of(items: Any) -> frozenset[str] | None:
    """The names of a section's left-out items; None when one has no name to read."""
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    return frozenset(names) if all(isinstance(name, str) for name in names) else None
