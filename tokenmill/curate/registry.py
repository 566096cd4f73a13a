"""The curate stages, each declared once: its name and its options, which do its work.

A stage module declares a `Stage` in its `STAGES` (`STAGE_MODULES` below is the explicit list of
those modules). Its options are the fields of one dataclass, each made with `option(...)`, which
carries the help text and how the option appears on the command line and in recipes. That
dataclass is a `stage.StageOptions` whose `process` is the per-batch function (`partitions` for a
stage that splits raw files itself, as ingest), run by `stage.run_stage`. A stage with shuffle
phases of its own (dedup) or a command that writes no stage directory (fetch-cc,
train-classifier) names the function that runs it instead (`run`). From that one declaration come

- the `tokenmill curate NAME` subcommand (`add_cli`): one flag per option, and
- the recipe schema (`options_model`): a strict pydantic model of the recipe's `options:`.

`tokenmill.pipelines` looks stages up here (`recipe_stage`) and nowhere else.

A stage module imports without numpy, pandas, pyarrow or numba (it imports them in the functions
that process a batch, which run in the Dask workers): the command line builds every stage's parser
from these declarations, and `tokenmill --help` stays instant (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tokenmill.curate.stage import run_stage
from tokenmill.errors import ConfigError
from tokenmill.infra import storage
from tokenmill.infra.flags import field_argument

if TYPE_CHECKING:
    from pydantic import BaseModel

log = logging.getLogger(__name__)

# The modules that declare stages, in pipeline order (the order of `tokenmill curate --help`).
STAGE_MODULES = (
    "tokenmill.curate.fetch",
    "tokenmill.curate.ingest",
    "tokenmill.curate.extract.stage",
    "tokenmill.curate.normalize",
    "tokenmill.curate.langid",
    "tokenmill.curate.url_filter",
    "tokenmill.curate.pii",
    "tokenmill.curate.filter",
    "tokenmill.curate.classifier",
    "tokenmill.curate.dedup",
    "tokenmill.curate.decontaminate",
)


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Any = dataclasses.MISSING,
    flag: str | None = None,
    cli: bool | Mapping[str, Any] = True,
    parse: Callable[[Any], Any] | None = None,
    recipe: bool = True,
    path: bool | str = False,
    group: str | None = None,
    exclusive: str | None = None,
) -> Any:
    """A dataclass field that is a stage option.

    help: the option's help text (command line and docs).
    flag: its command-line flag (default `--NAME` with `-` for `_`; a boolean that defaults to
        True becomes `--no-NAME`).
    cli: False for a recipe-only option, or extra `argparse.add_argument` keywords
        (`choices`, `nargs`, `metavar`, `required`, `action`, `type`, `default`).
    parse: turns the command-line value into the option's value (e.g. a comma list).
    recipe: False for a command-line-only option.
    path: a path, resolved against the recipe's directory; "state" for one where the stage keeps
        state of its own across runs (a dedup index): created if missing, and not an input of
        the recipe step, so that what the step adds there does not put it out of date.
    group / exclusive: an argparse argument group / mutually exclusive group.
    """
    if not help or not help.strip():
        raise ValueError("every stage option needs help")
    metadata = {
        "help": help,
        "flag": flag,
        "cli": cli,
        "parse": parse,
        "recipe": recipe,
        "path": path,
        "group": group,
        "exclusive": exclusive,
    }
    return field(default=default, default_factory=default_factory, metadata={"option": metadata})


def option_fields(options: type) -> list[dataclasses.Field]:
    """The fields of an options dataclass declared with `option(...)`."""
    return [f for f in dataclasses.fields(options) if f.init and "option" in f.metadata]


def _meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata["option"]


# Runs a stage: fn(options, input, output, *, client, scheduler, workers, progress) -> manifest.
RunFn = Callable[..., dict[str, Any]]


@dataclass(frozen=True, eq=False)  # hashed by identity: one object per stage
class Stage:
    """A curate stage: `tokenmill curate NAME` and, when `in_recipes`, `stage: NAME` in a recipe.

    `execute(options, input, output, *, client, scheduler, workers, progress) -> manifest`
    (`execute(options) -> result` when `io` is "none")."""

    name: str
    options: type  # a dataclass whose `option(...)` fields are the stage's options
    help: str
    description: str
    # None: `run_stage(options, ...)`, the options being a `StageOptions`. A stage with phases of
    # its own (dedup) or a command (`io` "none") gives its function.
    run: RunFn | None = None
    epilog: str | None = None  # printed with its line breaks (a table of rules)
    # documents: --input stage dirs / Parquet, --output STAGE_DIR and the Dask options; files: the
    # same with --input raw files (ingest); none: the options are all the command takes.
    io: str = "documents"
    in_recipes: bool = True
    # Extra command-line flags that are no option of their own (filter's --no-FAMILY), added by
    # `extend_cli(parser)` and folded into the option values by `from_cli(args, values)`.
    extend_cli: Callable[[argparse.ArgumentParser], None] | None = None
    from_cli: Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]] | None = None
    # Lines printed after the summary of a command-line run: report(result, args).
    report: Callable[[dict[str, Any], argparse.Namespace], None] | None = None

    def execute(self, options: Any, *args: Any, **runner: Any) -> dict[str, Any]:
        """Run the stage with these options (from `cli_options` or `recipe_options`)."""
        return (self.run or run_stage)(options, *args, **runner)

    # ---- recipes

    def recipe_fields(self) -> list[dataclasses.Field]:
        return [f for f in option_fields(self.options) if _meta(f)["recipe"]]

    @property
    def path_options(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.recipe_fields() if _meta(f)["path"])

    @property
    def input_path_options(self) -> tuple[str, ...]:
        """The path options that name inputs: they must exist, and their files are part of the
        step's fingerprint (not the "state" ones)."""
        return tuple(f.name for f in self.recipe_fields() if _meta(f)["path"] is True)

    def options_model(self) -> type[BaseModel]:
        return _options_model(self)

    def recipe_options(self, options: dict[str, Any]) -> Any:
        """Validate a recipe's `options:` and build the options object (defaults from the dataclass)."""
        model = self.options_model()
        validated = model.model_validate(options)
        given = {k: getattr(validated, k) for k in options if k in model.model_fields}
        return self.options(**given)

    # ---- command line

    def add_cli(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        extra: dict[str, Any] = {}
        if self.epilog:
            extra = {"epilog": self.epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description, **extra)
        if self.io == "files":
            parser.add_argument(
                "--input",
                required=True,
                nargs="+",
                help="files or directories (every file under a directory is read by its extension)",
            )
        if self.io != "none":
            add_stage_arguments(parser, document_input=self.io == "documents")
        hints = typing.get_type_hints(self.options)
        groups: dict[str, Any] = {}
        for f in option_fields(self.options):
            meta = _meta(f)
            if meta["cli"] is False:
                continue
            target: Any = parser
            if meta["group"]:
                if meta["group"] not in groups:
                    groups[meta["group"]] = parser.add_argument_group(meta["group"])
                target = groups[meta["group"]]
            if meta["exclusive"]:
                key = ("exclusive", meta["exclusive"])
                if key not in groups:
                    groups[key] = target.add_mutually_exclusive_group()
                target = groups[key]
            default = f.default if f.default is not dataclasses.MISSING else None
            cli = meta["cli"] if isinstance(meta["cli"], Mapping) else None
            flag, kwargs = field_argument(f.name, hints[f.name], default, flag=meta["flag"], extra=cli)
            target.add_argument(flag, dest=f.name, help=meta["help"], **kwargs)
        if self.extend_cli is not None:
            self.extend_cli(parser)
        parser.set_defaults(func=self._command)
        return parser

    def cli_options(self, args: argparse.Namespace) -> Any:
        values: dict[str, Any] = {}
        for f in option_fields(self.options):
            meta = _meta(f)
            if meta["cli"] is False:
                continue
            value = getattr(args, f.name)
            if meta["path"] and value:
                value = (
                    [for_workers(v, meta["path"]) for v in value]
                    if isinstance(value, list)
                    else for_workers(value, meta["path"])
                )
            values[f.name] = meta["parse"](value) if meta["parse"] is not None and value is not None else value
        if self.from_cli is not None:
            values = self.from_cli(args, values)
        return self.options(**values)

    def _command(self, args: argparse.Namespace) -> int:
        options = self.cli_options(args)
        if self.io == "none":
            result = self.execute(options)
        else:
            input = stage_input(args) if self.io == "documents" else args.input
            result = self.execute(options, input, args.output, **runner_options(args))
            print_summary(result, args.output)
        if self.report is not None:
            self.report(result, args)
        return 0


def for_workers(value: Any, kind: bool | str) -> Any:
    """A path option's value as the stage's Dask workers (on a cluster, in another working
    directory) must read it: a local file or directory made absolute, and so is a location the
    stage creates ("state"). Anything else (a URL, a `NAME=PATH` spec the stage parses) is left
    as typed."""
    if isinstance(value, str) and (kind == "state" or os.path.exists(value)):
        return storage.absolute(value)
    return value


# --------------------------------------------------------------------------------------------
# The options and the summary every stage's command shares


def add_stage_arguments(
    parser: argparse.ArgumentParser,
    *,
    document_input: bool = True,
    input_help: str = "a stage directory (its kept/ is read) or Parquet files / directories",
    output_help: str = "the stage directory to write (kept/, rejected/, manifest.json)",
) -> None:
    """Options shared by every curate stage."""
    if document_input:
        parser.add_argument("--input", required=True, nargs="+", help=input_help)
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument(
        "--scheduler",
        default=None,
        help="address of an existing Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, else a LocalCluster)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="LocalCluster worker processes (default: one per core)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def stage_input(args: argparse.Namespace) -> Any:
    return args.input[0] if len(args.input) == 1 else list(args.input)


def runner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"scheduler": args.scheduler, "workers": args.workers, "progress": not args.no_progress}


def print_summary(manifest: dict[str, Any], output: str) -> None:
    counts = manifest["counts"]
    rejected = counts["rejected"]
    log.info(
        f"{manifest['stage']}: in {counts['in']}, kept {counts['kept']}, rejected {sum(rejected.values())}"
        f" in {manifest['timings']['seconds']:.1f}s -> {output}"
    )
    for reason, n in sorted(rejected.items(), key=lambda item: -item[1]):
        log.info(f"  {reason}: {n}")
    if manifest.get("resumed_phases"):
        log.info(f"  resumed {phases_text(manifest['resumed_phases'])} from an earlier run")
    if manifest.get("resumed_partitions"):
        log.info(
            f"  resumed {manifest['resumed_partitions']} of {manifest['partitions']} partitions from an earlier run"
        )


def phases_text(names: Sequence[str]) -> str:
    """`the signatures and candidates phases`, `the hashes phase`: for a summary or an error."""
    if len(names) == 1:
        return f"the {names[0]} phase"
    return f"the {', '.join(names[:-1])} and {names[-1]} phases"


@cache
def _options_model(stage: Stage) -> type[BaseModel]:
    """A strict pydantic model of a stage's recipe options, so recipes get the same unknown-key
    and type errors as the stage."""
    from pydantic import ConfigDict, create_model  # the recipe schema; the command line needs none

    hints = typing.get_type_hints(stage.options)
    fields: dict[str, Any] = {f.name: (hints[f.name], None) for f in stage.recipe_fields()}
    return create_model(
        f"{stage.name}_options", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields
    )


def options_model(name: str, options: type) -> type[BaseModel]:
    """A strict model of an options dataclass's recipe options (for `classifiers[].options`)."""
    from pydantic import ConfigDict, create_model  # the recipe schema; the command line needs none

    hints = typing.get_type_hints(options)
    fields = {f.name: (hints[f.name], None) for f in option_fields(options) if _meta(f)["recipe"]}
    return create_model(
        f"{name}_options", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields
    )


# --------------------------------------------------------------------------------------------
# The registry


@cache
def stage_modules() -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(name) for name in STAGE_MODULES)


@cache
def all_stages() -> dict[str, Stage]:
    """Every stage by name, from each module's `STAGES`, in `STAGE_MODULES` order."""
    stages: dict[str, Stage] = {}
    for module in stage_modules():
        for stage in module.STAGES:
            if stage.name in stages:
                raise RuntimeError(f"two stages are named {stage.name}")
            typing.get_type_hints(stage.options)  # an annotation that does not resolve fails here, loudly
            stages[stage.name] = stage
    return stages


def cli_stages() -> list[Stage]:
    """The `tokenmill curate` subcommands."""
    return list(all_stages().values())


def recipe_stages() -> dict[str, Stage]:
    """The stages a recipe can name."""
    return {name: s for name, s in all_stages().items() if s.in_recipes}


def recipe_stage(name: str) -> Stage:
    stage = recipe_stages().get(name)
    if stage is None:
        raise ConfigError(renamed(name) or f"unknown stage `{name}`; stages: {', '.join(recipe_stages())}")
    return stage


# Stage names recipes used before, and what to write instead: only for the error that says so.
RENAMED: dict[str, str] = {
    "exact_dedup": "`stage: dedup` with `options: {method: exact}`",
    "fuzzy_dedup": "`stage: dedup` with `options: {method: fuzzy}`",
}


def renamed(name: str) -> str | None:
    """The error for a stage name recipes no longer take, None for any other name."""
    if name not in RENAMED:
        return None
    return f"stage `{name}` is now {RENAMED[name]} (and `name: {name}` to keep the step's name)"


def all_reasons() -> dict[str, str]:
    """Rejection reason -> explanation template, from every stage module's `REASONS`."""
    reasons: dict[str, str] = {}
    for module in stage_modules():
        reasons.update(getattr(module, "REASONS", {}))
    return reasons
