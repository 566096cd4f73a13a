"""The `filter` stage: Gopher quality, Gopher repetition, C4 and FineWeb heuristic rules.

Families run in FineWeb's order (Gopher repetition, Gopher quality, C4, FineWeb); a rejected
document carries the reason of the first rule that fired (`gopher_quality.mean_word_length`)
and its original text. C4's line rules edit the text that later families see and that is kept;
the manifest's `stats` count lines removed per rule (`c4.lines_removed.terminal_punct`) and
documents edited (`c4.docs_edited`). Every threshold is a field of `tokenmill.curate.rules`;
None (or `off` on the command line) turns a rule off.

    from tokenmill.curate.filter import FilterStage
    stage = FilterStage.from_options(disable=["c4.terminal_punct"], settings={"gopher_quality.min_words": 100})
    output = stage.process(frame)          # or run_stage(stage, "normalized/", "filtered/")
"""

from __future__ import annotations

import argparse
import logging
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.curate.registry import Stage, option
from tokenmill.curate.rules import FAMILIES, RuleSet
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import ConfigError, YamlSyntaxError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

REASONS = {"filter.no_text": "the text is missing (null)"}


def load_rules_config(path: str | Path) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"rules file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise YamlSyntaxError(str(path), error) from None
    return config


def _parse_settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set takes FAMILY.FIELD=VALUE (e.g. gopher_quality.min_words=100), got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


@dataclass
class FilterStage(StageOptions):
    """The filter's options, and the `RuleSet` they make: defaults, then `config` (a mapping or
    YAML file), then `disable` (families like `c4` or rules like `c4.curly_bracket`), then
    `settings` (`family.field: value`). `rules` given directly (a `RuleSet`, or a mapping as in
    a rules YAML file) replaces all of that."""

    config: dict[str, Any] | str | None = option(
        None,
        help="YAML file: {family: {field: value, disable: [rule]}} or {family: false}",
    )
    disable: list[str] = option(
        default_factory=list,
        cli={"nargs": "+", "default": [], "metavar": "RULE"},
        help="turn off rules or families, e.g. c4.terminal_punct gopher_quality.stop_words fineweb",
    )
    settings: dict[str, Any] | None = option(
        None,
        flag="--set",
        cli={"nargs": "+", "default": [], "metavar": "FAMILY.FIELD=VALUE"},
        parse=_parse_settings,
        help="change thresholds, e.g. gopher_quality.min_words=100 fineweb.max_short_line_ratio=0.8 (off = rule off)",
    )
    rules: RuleSet | dict[str, Any] | None = None

    name = "filter"

    def __post_init__(self) -> None:
        if self.rules is None:
            rules = RuleSet()
            if self.config is not None:
                rules.update(load_rules_config(self.config) if isinstance(self.config, (str, Path)) else self.config)
            for name in self.disable:
                rules.disable(name)
            for key, value in (self.settings or {}).items():
                rules.set(key, value)
            self.rules = rules
        elif isinstance(self.rules, dict):
            # a mapping as in a rules YAML file (e.g. from a pipeline recipe): {family: {field: value}}
            rules = RuleSet()
            rules.update(self.rules)
            self.rules = rules
        elif not isinstance(self.rules, RuleSet):
            raise ConfigError(f"filter rules must be a RuleSet or a mapping, got {type(self.rules).__name__}")

    @classmethod
    def from_options(
        cls,
        config: dict[str, Any] | str | Path | None = None,
        *,
        disable: list[str] = (),
        settings: dict[str, Any] | None = None,
    ) -> FilterStage:
        """The stage from a rules file or mapping, rules to turn off and thresholds to change."""
        return cls(config=config, disable=list(disable), settings=settings)

    def manifest_config(self) -> dict[str, Any]:
        return {"rules": asdict(self.rules)}

    def process(self, docs: pd.DataFrame) -> Batch:
        import pandas as pd

        stats: Counter = Counter()
        apply = self.rules.apply
        texts: list[Any] = []
        reasons: list[str | None] = []
        for text in docs["text"].tolist():
            if not isinstance(text, str):
                texts.append(text)
                reasons.append("filter.no_text")
                continue
            new_text, reason = apply(text, stats)
            texts.append(new_text)
            reasons.append(reason)
        reason_series = pd.Series(reasons, index=docs.index, dtype=object)
        keep = reason_series.isna().to_numpy()
        kept = docs[keep].assign(text=[t for t, k in zip(texts, keep) if k])
        rejected = reject(docs[~keep], reason_series[~keep])
        return Batch(n_in=len(docs), kept=kept, rejected=rejected, stats=dict(stats))


def rules_help() -> str:
    lines = ["rules (family.rule) and their settings with defaults:"]
    for name, family_type in FAMILIES.items():
        family = family_type()
        lines.extend(
            textwrap.wrap(", ".join(family.RULES), width=100, initial_indent=f"  {name}: ", subsequent_indent="      ")
        )
        settings = [f"{f.name}={getattr(family, f.name)}" for f in fields(family) if f.name != "enabled"]
        lines.extend(
            textwrap.wrap(", ".join(settings), width=100, initial_indent="    settings: ", subsequent_indent="      ")
        )
    return "\n".join(lines)


def _family_flags(parser: argparse.ArgumentParser) -> None:
    for name in FAMILIES:
        flag = name.replace("_", "-")
        parser.add_argument(f"--no-{flag}", dest=f"no_{name}", action="store_true", help=f"turn off the {name} rules")


def _from_cli(args: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any]:
    values["disable"] = [name for name in FAMILIES if getattr(args, f"no_{name}")] + list(values["disable"])
    if not FilterStage(**values).rules.enabled():
        raise ConfigError("every rule family is turned off; nothing to filter")
    return values


def _report(manifest: dict[str, Any], args: argparse.Namespace) -> None:
    stats = manifest.get("stats", {})
    if "c4.lines_in" in stats:
        log.info(
            f"  c4 removed {stats.get('c4.lines_removed', 0)} of {stats['c4.lines_in']} lines"
            f" and edited {stats.get('c4.docs_edited', 0)} kept documents"
        )


STAGES = (
    Stage(
        "filter",
        FilterStage,
        help="Gopher quality / repetition, C4 and FineWeb heuristic rules",
        description="Apply the Gopher quality, Gopher repetition, C4 and FineWeb rules with their published "
        "thresholds. C4's line rules remove lines; the other rules reject documents with the reason "
        "<family>.<rule>.",
        epilog=rules_help(),
        extend_cli=_family_flags,
        from_cli=_from_cli,
        report=_report,
    ),
)
