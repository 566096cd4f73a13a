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

    def warn(self, loc: tuple[Any, ...], message: str) -> None:
        self.add(loc, message)
        self.warnings.append(self.items.pop())

    def add(self, loc: tuple[Any, ...], message: str) -> None:
        line = None
        for n in range(len(loc), -1, -1):  # the nearest located ancestor
            line = self.lines.get(tuple(loc[:n]))
            if line is not None:
                break
        where = format_loc(loc) + (f" (line {line})" if line else "")
        self.items.append(f"{where}: {message}")


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
        elif item["type"] == "literal_error" and isinstance(item.get("input"), str):
            choices = re.findall(r"'([^']*)'", str(item.get("ctx", {}).get("expected", "")))
            problems.add(loc, f"{item['msg']} (got {item['input']!r}){suggest(item['input'], choices)}")
        else:
            problems.add(loc, f"{item['msg']} (got {item.get('input')!r})")
