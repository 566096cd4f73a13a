"""Command-line flags made from declarations: one flag per declared field (`field_argument`), as
the curate stages' options (curate/registry.py) and the training config's keys (train/config.py)
are declared once and become `tokenmill` flags; and parsers whose arguments are added when
they are first used (`CommandParser`), so that a command whose declarations load a library
(train's config: pydantic) costs nothing to `tokenmill --help` or to another command."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def field_argument(
    name: str,
    annotation: Any,
    default: Any,
    *,
    flag: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The argparse flag and keywords of one declared field: `--NAME` (`_` as `-`), a boolean a
    switch (`--no-NAME`, store_false, when its default is True), an int or float typed, a
    Literal's values as choices. `extra` adds or replaces keywords (`default`, `metavar`, ...)."""
    cli = dict(extra or {})
    dashed = name.replace("_", "-")
    base = scalar_type(annotation)
    if base is bool and "action" not in cli:
        if default is True:
            return flag or f"--no-{dashed}", {"action": "store_false", **cli}
        return flag or f"--{dashed}", {"action": "store_true", **cli}
    kwargs: dict[str, Any] = {"default": default}
    if base in (int, float) and "action" not in cli:
        kwargs["type"] = base
    choices = literal_choices(annotation)
    if choices:
        kwargs["choices"] = choices
    kwargs.update(cli)
    return flag or f"--{dashed}", kwargs


def scalar_type(annotation: Any) -> Any:
    """int for `int`, `int | None` and `Annotated[int, ...]`; else the annotation."""
    if typing.get_origin(annotation) is typing.Annotated:
        return scalar_type(typing.get_args(annotation)[0])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return scalar_type(args[0])
    return annotation


def literal_choices(annotation: Any) -> list[Any] | None:
    annotation = scalar_type(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return None


class CommandParser(argparse.ArgumentParser):
    """A parser whose arguments `arguments(parser)` adds the first time it parses or prints its
    help or usage. `add_subparsers` hands its class down, so every subcommand of `tokenmill`'s
    parser is one and takes `arguments=` beside argparse's own keywords."""

    def __init__(self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._undeclared = arguments

    def declare(self) -> CommandParser:
        """Add the arguments given to the constructor, once; returns the parser."""
        if self._undeclared is not None:
            arguments, self._undeclared = self._undeclared, None
            arguments(self)
        return self

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super(CommandParser, self.declare()).parse_known_args(args, namespace)

    def format_help(self) -> str:
        return super(CommandParser, self.declare()).format_help()

    def format_usage(self) -> str:
        return super(CommandParser, self.declare()).format_usage()
