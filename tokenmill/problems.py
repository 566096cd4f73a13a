"""Problems found in a YAML file, each named by its key path and line (`curate[2].options.min_score
(line 14): ...`), with the closest valid key for a misspelt one. Recipes and training configs
report their mistakes this way, all of them at once, so a user fixes a file in one pass."""

from __future__ import annotations

import re
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tokenmill.errors import suggest


def format_loc(loc: tuple[Any, ...] | list[Any]) -> str:
    """('curate', 2, 'options', 'min_score') -> 'curate[2].options.min_score'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def line_index(text: str) -> dict[tuple[Any, ...], int]:
    """Map each key path of a YAML document to its 1-based line, for error messages."""
    index: dict[tuple[Any, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return index

    def walk(node: yaml.Node, path: tuple[Any, ...]) -> None:
        index.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*path, key.value)
                index[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    if root is not None:
        walk(root, ())
    return index


class Problems:
    """Collects problems with their location and line."""

    def __init__(self, lines: dict[tuple[Any, ...], int]) -> None:
        self.lines = lines
        self.items: list[str] = []
        self.warnings: list[str] = []
        self._line_of: dict[str, int] = {}
        self._without_line: dict[str, str] = {}
        # Per list section whose bad items were left out of later checks: each checked item's
        # index in the file, so that a problem found there names the item as the file has it.
        self.item_places: dict[str, list[int]] = {}

    def warn(self, loc: tuple[Any, ...], message: str) -> None:
        self.add(loc, message)
        self.warnings.append(self.items.pop())

    def add(self, loc: tuple[Any, ...], message: str) -> None:
        places = self.item_places.get(loc[0]) if len(loc) > 1 and isinstance(loc[1], int) else None
        if places is not None:
            loc = (loc[0], places[loc[1]], *loc[2:])
        line = None
        for n in range(len(loc), -1, -1):  # the nearest located ancestor
            line = self.lines.get(tuple(loc[:n]))
            if line is not None:
                break
        where = format_loc(loc) + (f" (line {line})" if line else "")
        self.items.append(f"{where}: {message}")
        if line:
            self._line_of[self.items[-1]] = line
            self._without_line[self.items[-1]] = f"{format_loc(loc)}: {message}"

    def in_file(self, item: str, origin: str) -> str:
        """One problem said as a compiler says it, the file and line first:
        `train.yaml:3: steps: moved; write schedule.steps` (`origin: item` without a line)."""
        line = self._line_of.get(item)
        return f"{origin}:{line}: {self._without_line[item]}" if line else f"{origin}: {item}"

    def in_file_order(self) -> list[str]:
        """The problems by line, as a user reads the file (those without a line last)."""
        return sorted(self.items, key=lambda item: self._line_of.get(item, 1 << 62))


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The model class at `loc` inside `model`, None where there is none."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _model_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at `loc` inside the Recipe model (for 'did you mean')."""
    current = _model_at(model, loc)
    return [k for k in current.model_fields if k != "base_dir"] if current is not None else []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


# pydantic's error types, said as tokenmill's own checks say them (train/config.py): what was
# expected, then what was given.
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping of key: value",
    "model_type": "a mapping of key: value",
    "model_attributes_type": "a mapping of key: value",
}
_BOUNDS = {
    "greater_than_equal": "at least",
    "greater_than": "above",
    "less_than_equal": "at most",
    "less_than": "below",
}


def pydantic_message(item: Any) -> str:
    """One pydantic error (an item of `ValidationError.errors()`) in tokenmill's words:
    "expected an integer, got 'x'", "must be at least 1, got 0"."""
    kind, given, ctx = item["type"], item.get("input"), item.get("ctx") or {}
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {given!r}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"must be {_BOUNDS[kind]} {bound}, got {given!r}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}, got {given!r}"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = suggest(given, choices) if isinstance(given, str) else ""
        return f"must be one of {', '.join(choices)}, got {given!r}{hint}"
    if kind == "value_error":  # a validator's own words
        return str(ctx.get("error") or item["msg"].removeprefix("Value error, "))
    message = str(item["msg"])
    return f"{message[:1].lower()}{message[1:]}, got {given!r}"


def pydantic_problems(
    error: ValidationError, problems: Problems, model: type[BaseModel], prefix: tuple[Any, ...] = ()
) -> None:
    for item in error.errors():
        loc = tuple(
            part for part in item["loc"] if not (isinstance(part, str) and ("[" in part or part in ("function-after",)))
        )
        loc = (*prefix, *loc)
        if item["type"] == "extra_forbidden":
            parent = loc[:-1]
            moved = getattr(_model_at(model, parent[len(prefix) :]), "MOVED", {}) if model is not None else {}
            if loc[-1] in moved:
                problems.add(loc, f"moved; write {format_loc((*parent, *moved[loc[-1]].split('.')))}")
                continue
            valid = _model_fields(model, parent[len(prefix) :]) if model is not None else []
            problems.add(loc, f"unknown key `{loc[-1]}`{suggest(loc[-1], valid)}")
        elif item["type"] == "missing":
            problems.add(loc, "required key is missing")
        else:
            problems.add(loc, pydantic_message(item))
