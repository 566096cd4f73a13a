"""What every rule family shares: a dataclass of thresholds (None turns a rule off), an ordered
list of rules that each map to the fields they read, and `apply(doc, stats)` that returns the
(possibly edited) text and the reason of the first rule that fired, or None to keep."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import ClassVar

from tokenmill.curate.text import split_words
from tokenmill.errors import ConfigError


class Doc:
    """A document's text with its words computed once, on first use, and shared by the rules
    of every family that reads the same text."""

    __slots__ = ("text", "_words")

    def __init__(self, text: str):
        self.text = text
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = split_words(self.text)
        return self._words


@dataclass
class RuleFamily:
    """Base of the rule families. Subclasses are dataclasses whose fields are thresholds."""

    enabled: bool = True

    name: ClassVar[str] = "family"
    # rule name -> the fields that rule reads; `disable(rule)` sets them to None / False.
    RULES: ClassVar[dict[str, tuple[str, ...]]] = {}
    # rule name -> what it means in one line, a format string over the family's fields (so the
    # explanation shows the thresholds actually used); `tokenmill inspect` prints it.
    EXPLAIN: ClassVar[dict[str, str]] = {}

    def apply(self, doc: Doc, stats: Counter) -> tuple[Doc, str | None]:
        """Return the document (edited by line-level rules, else the same) and the reason of
        the first rule that rejects it, `"<family>.<rule>"`, or None to keep it."""
        raise NotImplementedError

    def reason(self, rule: str) -> str:
        return f"{self.name}.{rule}"

    def explain(self, rule: str) -> str | None:
        """One line on what rule `rule` (unqualified) checks, with this family's thresholds."""
        template = self.EXPLAIN.get(rule)
        if template is None:
            return None
        values = {f.name: _Off() if getattr(self, f.name) is None else getattr(self, f.name) for f in fields(self)}
        return template.format(**values)

    def rules(self) -> list[str]:
        """Qualified names of the rules, in the order they are checked."""
        return [self.reason(rule) for rule in self.RULES]

    def disable(self, rule: str) -> None:
        if rule not in self.RULES:
            raise ConfigError(f"unknown rule {self.name}.{rule}; rules of {self.name}: {', '.join(self.RULES)}")
        for field_name in self.RULES[rule]:
            current = getattr(self, field_name)
            setattr(self, field_name, False if isinstance(current, bool) else None)

    def set(self, key: str, value) -> None:
        """Set a threshold field from a string or a value, converting to the field's type."""
        known = {f.name: f for f in fields(self)}
        if key not in known:
            raise ConfigError(f"unknown setting {self.name}.{key}; settings of {self.name}: {', '.join(known)}")
        setattr(self, key, _convert(value, getattr(type(self)(), key), f"{self.name}.{key}"))


class _Off:
    """A threshold turned off, shown as `off` whatever number format the explanation asks for."""

    def __format__(self, spec: str) -> str:
        return "off"


def _convert(value, default, where: str):
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("none", "null", "off"):
        return False if isinstance(default, bool) else None
    try:
        if isinstance(default, bool):
            if text.lower() in ("true", "on", "yes", "1"):
                return True
            if text.lower() in ("false", "no", "0"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(part.strip() for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{where}: cannot read {value!r} as {type(default).__name__}") from None
    return text
