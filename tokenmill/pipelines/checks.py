"""Checks across a recipe's sections, run before anything executes: names that must refer to
sources, stages that must exist, options that must fit the stage, paths that must exist."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tokenmill.curate.registry import options_model, recipe_stages, renamed
from tokenmill.errors import ConfigError, YamlSyntaxError, suggest
from tokenmill.infra import storage
from tokenmill.pipelines.schema import Recipe
from tokenmill.problems import Problems, pydantic_message


def _check_path(recipe: Recipe, problems: Problems, loc: tuple[Any, ...], value: str, *, check: bool | str) -> None:
    if check and not storage.exists(recipe.resolve(value)):
        (problems.warn if check == "warn" else problems.add)(loc, f"path not found: {recipe.resolve(value)}")


@dataclass(frozen=True)
class LeftOut:
    """What of a recipe is left out of its checks because its own problems are listed already:
    the `sections` left out whole, and the `names` of the items left out of the sections whose
    items others mention by name (`sources:`, `classifiers:`). Those parts are there in the
    file, so nothing that depends on them is said here."""

    sections: frozenset[str] = frozenset()
    # Per section, the names of its items left out; None where one of them has no name to read,
    # so that any name mentioned may be its.
    names: Mapping[str, frozenset[str] | None] = field(default_factory=dict)

    def names_in(self, section: str) -> frozenset[str] | None:
        """The names of `section`'s items that are left out (None: any name may be one)."""
        return None if section in self.sections else self.names.get(section, frozenset())


def check_recipe(
    recipe: Recipe, problems: Problems, *, check_paths: bool | str = True, left_out: LeftOut = LeftOut()
) -> None:
    """Every check across sections, in the recipe's order of sections, into `problems`.
    `check_paths`: paths must exist (True), only warn (``"warn"``), or are not looked at.
    `left_out`: the parts left out of ``recipe`` because their own problems are listed already."""
    _check_sources(recipe, problems, check_paths)
    _check_classifiers(recipe, problems, left_out)
    _check_curate(recipe, problems, check_paths, left_out)
    if recipe.tokenize is not None and recipe.tokenize.file:
        _check_path(recipe, problems, ("tokenize", "file"), recipe.tokenize.file, check=check_paths)
    if recipe.blend is not None:
        _check_blend(recipe, problems, left_out)
    if recipe.train is not None:
        _check_train(recipe, problems, check_paths, left_out.sections)
    if recipe.eval is not None:
        _check_eval(recipe, problems, check_paths, left_out.sections)


def _check_name(
    problems: Problems, loc: tuple[Any, ...], name: str, section: str, recipe: Recipe, left_out: LeftOut
) -> None:
    """A name that must be one of `section`'s items (a source, a classifier): unknown only when
    it is neither a checked item's name nor possibly a left-out one's."""
    known = [item.name for item in getattr(recipe, section)]
    left_out_names = left_out.names_in(section)
    if name in known or left_out_names is None or name in left_out_names:
        return
    known += sorted(left_out_names)  # for "did you mean"
    if section == "sources":
        problems.add(loc, f"no source named `{name}`{suggest(name, known)}")
    else:
        problems.add(loc, f"no classifier named `{name}`{suggest(name, known)} in `classifiers:`")


def _check_sources(recipe: Recipe, problems: Problems, check_paths: bool | str) -> None:
    seen: set[str] = set()
    for i, source in enumerate(recipe.sources):
        if source.name in seen:
            problems.add(("sources", i, "name"), f"duplicate source name `{source.name}`")
        seen.add(source.name)
        if isinstance(source.path, list):
            for j, p in enumerate(source.path):
                _check_path(recipe, problems, ("sources", i, "path", j), p, check=check_paths)
        elif source.path:
            _check_path(recipe, problems, ("sources", i, "path"), source.path, check=check_paths)
        if source.separator is not None:
            import re

            try:
                re.compile(source.separator)
            except re.error as error:
                problems.add(("sources", i, "separator"), f"not a valid regular expression: {error}")


def _check_classifiers(recipe: Recipe, problems: Problems, left_out: LeftOut) -> None:
    classifier_names = [c.name for c in recipe.classifiers]
    for i, spec in enumerate(recipe.classifiers):
        if classifier_names.count(spec.name) > 1:
            problems.add(("classifiers", i, "name"), f"duplicate classifier name `{spec.name}`")
        for side in ("positive", "negative"):
            for j, src in enumerate(getattr(spec, side)):
                _check_name(problems, ("classifiers", i, side, j), src, "sources", recipe, left_out)
        _check_options(
            problems, ("classifiers", i, "options"), "train-classifier", _classifier_options_model(), spec.options
        )


def _check_curate(recipe: Recipe, problems: Problems, check_paths: bool | str, left_out: LeftOut) -> None:
    """Each curation step: a known stage, a unique step name, known sources, options that fit
    the stage, and the files its options name."""
    stages = recipe_stages()
    step_names: set[str] = set()
    for i, step in enumerate(recipe.curate):
        kind = stages.get(step.stage)
        if kind is None:
            problems.add(
                ("curate", i, "stage"),
                renamed(step.stage)
                or f"unknown stage `{step.stage}`{suggest(step.stage, list(stages))}; stages: {', '.join(stages)}",
            )
            continue
        if step.step_name in step_names:
            problems.add(("curate", i, "name"), f"two curate steps are named `{step.step_name}`; give one a `name:`")
        step_names.add(step.step_name)
        for j, src in enumerate(step.sources or []):
            _check_name(problems, ("curate", i, "sources", j), src, "sources", recipe, left_out)
        options = dict(step.options)
        if step.stage == "classify":
            _check_classify_model(recipe, problems, i, options, left_out)
        _check_options(problems, ("curate", i, "options"), f"stage {step.stage}", kind.options_model(), options)
        for option in kind.input_path_options:
            value = step.options.get(option)
            values = value if isinstance(value, list) else [value]
            for v in values:
                if isinstance(v, str):
                    _check_path(recipe, problems, ("curate", i, "options", option), v, check=check_paths)


def _check_classify_model(
    recipe: Recipe, problems: Problems, i: int, options: dict[str, Any], left_out: LeftOut
) -> None:
    """`classifier: NAME` names a classifier trained in this run instead of a model file; it is
    taken out of `options` (the stage's own options are checked next)."""
    name = options.pop("classifier", None)
    if name is not None:
        _check_name(problems, ("curate", i, "options", "classifier"), str(name), "classifiers", recipe, left_out)
    if name is None and not options.get("model"):
        problems.add(("curate", i, "options"), "classify needs `model: PATH` or `classifier: NAME`")
    if name is not None and options.get("model"):
        problems.add(("curate", i, "options"), "give `model` or `classifier`, not both")


def _check_blend(recipe: Recipe, problems: Problems, left_out: LeftOut) -> None:
    assert recipe.blend is not None
    if recipe.tokenize is None and "tokenize" not in left_out.sections:
        problems.add(("blend",), "a blend needs a `tokenize:` section (the shards are made there)")
    blended: set[str] = set()
    for i, entry in enumerate(recipe.blend):
        _check_name(problems, ("blend", i, "source"), entry.source, "sources", recipe, left_out)
        if entry.source in blended:
            problems.add(("blend", i, "source"), f"`{entry.source}` appears twice in the blend")
        blended.add(entry.source)


def _check_train(recipe: Recipe, problems: Problems, check_paths: bool | str, reported: frozenset[str]) -> None:
    assert recipe.train is not None
    if recipe.blend is None and "blend" not in reported:
        problems.add(("train",), "training needs a `blend:` section (which shards to train on)")
    config = recipe.train.config
    if isinstance(config, str) and not recipe.train_config_file().is_file():  # neither a file nor a bundled name
        _check_path(recipe, problems, ("train", "config"), config, check=check_paths)
    else:
        _check_train_config(recipe, problems)


def _check_eval(recipe: Recipe, problems: Problems, check_paths: bool | str, reported: frozenset[str]) -> None:
    assert recipe.eval is not None
    if recipe.train is None and "train" not in reported:
        problems.add(("eval",), "evaluation needs a `train:` section (the model to evaluate)")
    if recipe.eval.data_dir:
        _check_path(recipe, problems, ("eval", "data_dir"), recipe.eval.data_dir, check=check_paths)
    known = _known_tasks()
    for i, task in enumerate(recipe.eval.tasks):
        if task not in known:
            problems.add(("eval", "tasks", i), f"unknown task `{task}`{suggest(task, known)}")


def _check_options(problems: Problems, where: tuple[Any, ...], what: str, model: Any, options: dict[str, Any]) -> None:
    try:
        model.model_validate(options)
    except ValidationError as error:
        for item in error.errors():
            loc = (*where, *item["loc"])
            if item["type"] == "extra_forbidden":
                problems.add(
                    loc,
                    f"unknown option `{item['loc'][-1]}` for {what}{suggest(item['loc'][-1], list(model.model_fields))};"
                    f" options: {', '.join(model.model_fields) or 'none'}",
                )
            elif item["type"] == "missing":
                problems.add(loc, f"{what} needs this option")
            else:
                problems.add(loc, pydantic_message(item))


def _classifier_options_model() -> Any:
    from tokenmill.curate.classifier import TrainClassifierOptions

    return options_model("train_classifier", TrainClassifierOptions)


def _known_tasks() -> list[str]:
    """The task names of the eval registry."""
    from tokenmill.eval.tasks import TASKS

    return sorted(TASKS)


class _TrainProblems:
    """Places a trainer config problem at the recipe key that set it: a section key written in
    `train:` itself (`train.parallel.dp`), else inside `train.config`."""

    def __init__(self, problems: Problems, written: dict[str, Any]) -> None:
        self.problems = problems
        self.written = written
        self.items: list[str] = []

    def add(self, loc: tuple[Any, ...], message: str) -> None:
        section = self.written.get(loc[0]) if loc else None
        here = section is not None and (len(loc) == 1 or not isinstance(section, dict) or loc[1] in section)
        self.problems.add(("train", *loc) if here else ("train", "config", *loc), message)
        self.items.append(self.problems.items[-1])


def _check_train_config(recipe: Recipe, problems: Problems) -> None:
    """Validate the trainer config (`train.config` with the sections written in `train:`) with
    the trainer's own schema, its layout included, each problem located at its recipe key."""
    from tokenmill.train.config import add_problems

    assert recipe.train is not None
    try:
        data = recipe.train_config_dict()
    except YamlSyntaxError:
        raise  # one line naming the config file, its line and column
    except ConfigError as error:  # the config file is no YAML mapping
        problems.add(("train", "config"), str(error))
        return
    add_problems(data, _TrainProblems(problems, recipe.train.sections()))
