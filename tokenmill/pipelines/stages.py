"""The curation stages a recipe can name, and how each is called.

A stage is either a `DocumentStage` dataclass (its fields are the recipe's `options`, run with
`run_stage`) or a function `fn(input, output, *, client, progress, **options) -> manifest`
(global stages such as deduplication, which shuffle across partitions). Both are resolved
lazily, so a recipe naming a stage whose module is not installed gets a clear error at
validation time, not a crash halfway through a run.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model

from tokenmill.errors import ConfigError

# Arguments the runner supplies itself; never recipe options.
RUNNER_ARGS = {"input", "inputs", "output", "client", "scheduler", "workers", "progress", "self", "paths"}


@dataclass(frozen=True)
class StageKind:
    """A curate stage known to recipes: where its implementation lives and what it does."""

    name: str
    module: str
    attrs: tuple[str, ...]  # candidate attribute names, first found wins
    help: str
    # Options whose value is a path, resolved against the recipe's directory.
    path_options: tuple[str, ...] = ()
    # "module:Class" whose dataclass fields are the options (minus `exclude`), when the
    # implementation takes a config object rather than keyword options.
    options_from: str | None = None
    exclude: tuple[str, ...] = ()
    # A function of this module that calls the implementation (when its signature is not the
    # plain `fn(input, output, **options)`).
    adapter: str | None = None

    def load(self) -> Any:
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as error:
            if error.name and self.module.startswith(error.name):
                raise ConfigError(f"stage `{self.name}` is not available: module {self.module} is not installed") from None
            raise
        for attr in self.attrs:
            if hasattr(module, attr):
                return getattr(module, attr)
        raise ConfigError(f"stage `{self.name}`: {self.module} has none of {', '.join(self.attrs)}")

    def is_class(self) -> bool:
        return inspect.isclass(self.load())

    def options_model(self) -> type[BaseModel]:
        return _options_model(self)

    def run(self, options: dict[str, Any], input: Any, output: Path, *, client: Any, progress: bool) -> dict[str, Any]:
        impl = self.load()
        if self.adapter:
            return globals()[self.adapter](options, input, output, client=client, progress=progress)
        if inspect.isclass(impl):
            from tokenmill.curate.stage import run_stage

            # A stage with a `from_options` factory takes the recipe's options through it (the
            # filter's rule sets are built that way); otherwise options are its dataclass fields.
            factory = getattr(impl, "from_options", None)
            stage = factory(**options) if factory is not None else impl(**options)
            return run_stage(stage, input, output, client=client, progress=progress)
        params = inspect.signature(impl).parameters
        kwargs: dict[str, Any] = dict(options)
        if "client" in params:
            kwargs["client"] = client
        if "progress" in params:
            kwargs["progress"] = progress
        return impl(input, output, **kwargs)


STAGES: dict[str, StageKind] = {
    kind.name: kind
    for kind in (
        StageKind("normalize", "tokenmill.curate.normalize", ("NormalizeStage",), "ftfy, NFC, whitespace"),
        StageKind("langid", "tokenmill.curate.langid", ("LangIdStage",), "fastText language id", ("model",)),
        StageKind("filter", "tokenmill.curate.filter", ("FilterStage",), "Gopher / C4 / FineWeb rules"),
        StageKind(
            "classify", "tokenmill.curate.classifier", ("ClassifyStage", "ClassifierStage"),
            "fastText quality classifier (GPT-3 / MT-NLG)", ("model",),
        ),
        StageKind(
            "exact_dedup", "tokenmill.curate.dedup", ("run_dedup",), "exact duplicates by normalized-text hash",
            options_from="tokenmill.curate.dedup:DedupConfig",
            exclude=("method", "threshold", "num_perm", "seed", "scheme", "bands", "rows", "ngram", "char_ngram",
                     "shingle", "verify", "all_pairs_limit", "index", "update_index", "work_dir", "keep_work"),
            adapter="_exact_dedup",
        ),
        StageKind(
            "fuzzy_dedup", "tokenmill.curate.dedup", ("run_dedup",), "near duplicates by MinHash LSH", ("index",),
            options_from="tokenmill.curate.dedup:DedupConfig", exclude=("method", "work_dir", "keep_work"),
            adapter="_fuzzy_dedup",
        ),
        StageKind(
            "decontaminate", "tokenmill.curate.decontaminate", ("run_decontaminate",),
            "13-gram overlap with evaluation tasks", ("tasks", "data_dir"), adapter="_decontaminate",
            options_from="tokenmill.pipelines.stages:DecontaminateOptions",
        ),
    )
}


def stage_kind(name: str) -> StageKind | None:
    return STAGES.get(name)


def _annotations(impl: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(impl)
    except Exception:  # a forward reference we cannot resolve: fall back to Any
        return {}


@dataclass
class DecontaminateOptions:
    """Recipe options of `decontaminate`: task files (JSONL, `[NAME=]PATH[:FIELD,...]`) and/or a
    directory whose every `.jsonl` file is a task (the benchmark data directory of `eval`)."""

    tasks: list[str] | None = None
    data_dir: str | None = None
    ngram: int = 13
    normalize: str = "lower,punct"
    fields: list[str] | None = None


def _exact_dedup(options: dict[str, Any], input: Any, output: Path, *, client: Any, progress: bool) -> dict[str, Any]:
    from tokenmill.curate.dedup import DedupConfig, run_dedup

    return run_dedup(input, output, DedupConfig(method="exact", **options), client=client, progress=progress)


def _fuzzy_dedup(options: dict[str, Any], input: Any, output: Path, *, client: Any, progress: bool) -> dict[str, Any]:
    from tokenmill.curate.dedup import DedupConfig, run_dedup

    return run_dedup(input, output, DedupConfig(method="fuzzy", **options), client=client, progress=progress)


def decontamination_tasks(tasks: list[str] | None, data_dir: str | None) -> list[str]:
    out = list(tasks or [])
    if data_dir:
        out += [str(p) for p in sorted(Path(data_dir).glob("*.jsonl"))]
    if not out:
        raise ConfigError("decontaminate needs `tasks` (JSONL files) or a `data_dir` holding .jsonl task files")
    return out


def _decontaminate(options: dict[str, Any], input: Any, output: Path, *, client: Any, progress: bool) -> dict[str, Any]:
    from tokenmill.curate.decontaminate import run_decontaminate

    options = dict(options)
    tasks = decontamination_tasks(options.pop("tasks", None), options.pop("data_dir", None))
    return run_decontaminate(input, output, tasks, client=client, progress=progress, **options)


def _class(spec: str) -> Any:
    module, attr = spec.split(":")
    return getattr(importlib.import_module(module), attr)


@cache
def _options_model(kind: StageKind) -> type[BaseModel]:
    """A strict pydantic model of a stage's options, built from its dataclass fields or its
    function signature, so recipes get the same unknown-key and type errors as the stage."""
    impl = kind.load()
    if kind.options_from:
        impl = _class(kind.options_from)
    hints = _annotations(impl)
    fields: dict[str, Any] = {}
    factory = getattr(impl, "from_options", None) if inspect.isclass(impl) else None
    if factory is not None:
        hints = _annotations(factory)
        impl = factory
    if inspect.isclass(impl) and dataclasses.is_dataclass(impl):
        for f in dataclasses.fields(impl):
            if not f.init or f.name in RUNNER_ARGS or f.name in kind.exclude:
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            fields[f.name] = (hints.get(f.name, Any), None if has_default else ...)
    else:
        target: Callable[..., Any] = impl.__init__ if inspect.isclass(impl) else impl
        if not inspect.isclass(impl):
            hints = _annotations(impl)
        for name, param in inspect.signature(target).parameters.items():
            if name in RUNNER_ARGS or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.kind == param.POSITIONAL_ONLY:
                continue
            required = param.default is inspect.Parameter.empty
            fields[name] = (hints.get(name, Any), ... if required else None)
    return create_model(
        f"{kind.name}_options", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields
    )


def given_options(kind: StageKind, options: dict[str, Any]) -> dict[str, Any]:
    """Only the options the recipe set (validated defaults are left to the stage itself)."""
    model = kind.options_model()
    validated = model.model_validate(options)
    return {k: getattr(validated, k) for k in options if k in model.model_fields}


def function_options_model(name: str, fn: Callable[..., Any], exclude: tuple[str, ...] = ()) -> type[BaseModel]:
    """A strict model of a function's keyword options (for `classifiers[].options`)."""
    hints = _annotations(fn)
    fields: dict[str, Any] = {}
    for param_name, param in inspect.signature(fn).parameters.items():
        if param_name in exclude or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        fields[param_name] = (hints.get(param_name, Any), ... if param.default is inspect.Parameter.empty else None)
    return create_model(f"{name}_options", __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields)
