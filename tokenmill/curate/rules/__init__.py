"""Heuristic quality rules, one module per family: Gopher quality, Gopher repetition, C4 and
FineWeb, with the published thresholds as dataclass defaults.

A `RuleSet` applies the enabled families in FineWeb's order (Gopher repetition, Gopher quality,
C4, FineWeb); the first rule that fires names the rejection reason (`<family>.<rule>`). C4's
line rules edit the text that the families after it see.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tokenmill.curate.rules.base import Doc, RuleFamily
from tokenmill.curate.rules.c4 import C4
from tokenmill.curate.rules.fineweb import FineWeb
from tokenmill.curate.rules.gopher_quality import GopherQuality
from tokenmill.curate.rules.gopher_repetition import GopherRepetition
from tokenmill.errors import ConfigError

FAMILIES: dict[str, type[RuleFamily]] = {
    GopherRepetition.name: GopherRepetition,
    GopherQuality.name: GopherQuality,
    C4.name: C4,
    FineWeb.name: FineWeb,
}

__all__ = ["C4", "Doc", "FAMILIES", "FineWeb", "GopherQuality", "GopherRepetition", "RuleFamily", "RuleSet"]


@dataclass
class RuleSet:
    gopher_repetition: GopherRepetition = field(default_factory=GopherRepetition)
    gopher_quality: GopherQuality = field(default_factory=GopherQuality)
    c4: C4 = field(default_factory=C4)
    fineweb: FineWeb = field(default_factory=FineWeb)

    def families(self) -> list[RuleFamily]:
        return [getattr(self, name) for name in FAMILIES]

    def enabled(self) -> list[RuleFamily]:
        return [family for family in self.families() if family.enabled]

    def apply(self, text: str, stats: Counter | None = None) -> tuple[str, str | None]:
        """(text after line edits, reason of the first rule that fired or None)."""
        stats = Counter() if stats is None else stats
        doc = Doc(text)
        for family in self.enabled():
            doc, reason = family.apply(doc, stats)
            if reason is not None:
                return doc.text, reason
        return doc.text, None

    def family(self, name: str) -> RuleFamily:
        if name not in FAMILIES:
            raise ConfigError(f"unknown rule family {name!r}; families: {', '.join(FAMILIES)}")
        return getattr(self, name)

    def disable(self, qualified: str) -> None:
        """Turn off a family (`c4`) or one rule (`c4.curly_bracket`)."""
        name, _, rule = qualified.partition(".")
        family = self.family(name)
        if rule:
            family.disable(rule)
        else:
            family.enabled = False

    def set(self, qualified: str, value: Any) -> None:
        """Set a threshold: `gopher_quality.min_words`, value as a string or a number."""
        name, _, key = qualified.partition(".")
        if not key:
            raise ConfigError(f"a setting is <family>.<field>, got {qualified!r}")
        self.family(name).set(key, value)

    def update(self, config: dict[str, Any]) -> None:
        """Apply a nested mapping `{family: {field: value}}` (a family may be `false` to turn it
        off), as read from a YAML rules file."""
        if not isinstance(config, dict):
            raise ConfigError("a rules configuration is a mapping of family -> settings")
        for name, settings in config.items():
            family = self.family(name)
            if isinstance(settings, bool):
                family.enabled = settings
                continue
            if not isinstance(settings, dict):
                raise ConfigError(f"settings of {name} must be a mapping or true/false, got {settings!r}")
            for key, value in settings.items():
                if key == "disable":
                    for rule in [value] if isinstance(value, str) else value:
                        family.disable(rule)
                else:
                    family.set(key, value)
