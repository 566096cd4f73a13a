"""Recipes: one YAML file describing a whole run (sources -> curation -> tokenizer -> blend ->
training -> evaluation), loaded into typed models and checked before anything runs.

Every mistake is reported with the key's location in the file (`curate[2].options.min_score`,
line 14) and, for a misspelt key or name, the closest valid one. All errors of a recipe are
collected and raised together, so a user fixes a file in one pass.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from tokenmill.errors import ConfigError
from tokenmill.infra import storage
from tokenmill.infra.slurm import SlurmSpec

SOURCE_FORMATS = ("jsonl", "parquet", "text", "warc", "wet", "html", "python-docs")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Source(_Strict):
    """One raw corpus. `path` is relative to the recipe file; `python-docs` needs none (the
    corpus is assembled from the running Python installation, see `pydocs.py`)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")
    path: str | list[str] | None = None
    format: Literal["jsonl", "parquet", "text", "warc", "wet", "html", "python-docs"] | None = None
    text_field: str = "text"
    id_field: str | None = None
    separator: str | None = None
    # python-docs only: cap the documents taken from each kind (None: all).
    max_documents: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _path_needed(self) -> Source:
        if self.format != "python-docs" and not self.path:
            raise ValueError("`path` is required unless format is python-docs")
        return self

    def paths(self) -> list[str]:
        if self.path is None:
            return []
        return [self.path] if isinstance(self.path, str) else list(self.path)


class CurateStep(_Strict):
    """One curation stage, applied in order to every source (or to those in `sources`)."""

    stage: str
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")  # default: the stage kind
    sources: list[str] | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def step_name(self) -> str:
        return self.name or self.stage


class ClassifierSpec(_Strict):
    """A fastText quality classifier trained inside the run (GPT-3 / MT-NLG): `positive`
    sources (reference-quality text) against `negative` ones (raw web text), read as ingested.
    A `classify` curate stage uses it with `options: {classifier: NAME, ...}`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")
    positive: list[str] = Field(min_length=1)
    negative: list[str] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)


class TokenizerSpec(_Strict):
    """Train a byte-level BPE on the curated documents, or use an existing tokenizer.json."""

    vocab_size: int = Field(default=8192, ge=260)
    file: str | None = None
    # Documents sampled for training (None: all curated documents).
    sample_docs: int | None = Field(default=None, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class BlendEntry(_Strict):
    """A source's share of the training stream: a weight, or a number of epochs (MT-NLG's
    table gives both); epochs become weights proportional to epochs x tokens."""

    source: str
    weight: float | None = Field(default=None, gt=0)
    epochs: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> BlendEntry:
        if (self.weight is None) == (self.epochs is None):
            raise ValueError("give exactly one of `weight` or `epochs`")
        return self


class TrainSpec(_Strict):
    """The trainer's config (a bundled name, a file, or inline), sections of it written here,
    and where the run goes."""

    config: dict[str, Any] | str = Field(default_factory=dict)
    # Sections of the trainer's config written in `train:` itself (`parallel: {dp: 2}`), merged
    # over `config`'s; the trainer's schema checks the result (pipelines/checks.py).
    model: dict[str, Any] | str | None = None
    dataset: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    schedule: dict[str, Any] | None = None
    parallel: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    logging: dict[str, Any] | None = None
    nnodes: int = Field(default=1, ge=1)
    # What `--dry-run` gives the planner for a cluster-sized recipe (the run itself uses tp*pp*dp).
    gpus: int | None = Field(default=None, ge=1)
    gpu_memory: str | None = None
    extra_args: list[str] = Field(default_factory=list)

    # The launch keys `train:` had before the layout moved into the trainer's sections: only for
    # the error that says where they went.
    MOVED: ClassVar[dict[str, str]] = {
        "tp": "parallel.tp",
        "pp": "parallel.pp",
        "dp": "parallel.dp",
        "zero": "parallel.zero",
        "steps": "schedule.steps",
    }
    SECTIONS: ClassVar[tuple[str, ...]] = (
        "model",
        "dataset",
        "optimizer",
        "schedule",
        "parallel",
        "checkpoint",
        "logging",
    )

    def sections(self) -> dict[str, Any]:
        """The trainer config sections written in `train:` itself."""
        return {name: getattr(self, name) for name in self.SECTIONS if getattr(self, name) is not None}


class EvalSpec(_Strict):
    """Benchmarks (tasks x shots, data from `data_dir`) and held-out perplexity."""

    tasks: list[str] = Field(default_factory=list)
    shots: list[int] = Field(default_factory=lambda: [0])
    data_dir: str | None = None
    limit: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=16, ge=1)
    perplexity: bool = True
    # Tasks whose data file is absent from data_dir are skipped (the demo) instead of failing.
    skip_missing: bool = False

    @field_validator("shots")
    @classmethod
    def _shots(cls, value: list[int]) -> list[int]:
        if any(s < 0 for s in value):
            raise ValueError("shots must be >= 0")
        return value


class Recipe(_Strict):
    name: str = "run"
    description: str | None = None
    workdir: str | None = None
    scheduler: str | None = None
    workers: int | None = Field(default=None, ge=1)
    sources: list[Source] = Field(min_length=1)
    classifiers: list[ClassifierSpec] = Field(default_factory=list)
    curate: list[CurateStep] = Field(default_factory=list)
    tokenize: TokenizerSpec | None = None
    blend: list[BlendEntry] | None = None
    train: TrainSpec | None = None
    eval: EvalSpec | None = None
    # How `tokenmill run --slurm` submits the recipe (infra/slurm.py); ignored otherwise.
    slurm: SlurmSpec | None = None

    # Set by `load_recipe`: the recipe file's directory, against which relative paths resolve.
    base_dir: Path = Field(default=Path("."), exclude=True)
    # Problems that do not stop a dry run (input paths of a template that do not exist here).
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    def resolve(self, path: str) -> Path:
        """A path relative to the recipe made absolute; a URL (s3://, https://, ...) as it is."""
        if storage.is_url(path):
            return path  # type: ignore[return-value]  # URLs pass through to the storage layer
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def train_config_file(self) -> Path:
        """`train.config` given as a file (relative to the recipe) or as a bundled name (`tiny`)."""
        assert self.train is not None and isinstance(self.train.config, str)
        path = self.resolve(self.train.config)
        if path.is_file():
            return path
        from tokenmill.recipes import TRAIN_PREFIX, bundled_recipes

        return bundled_recipes(TRAIN_PREFIX).get(self.train.config, path)

    def train_config_dict(self) -> dict[str, Any]:
        """The trainer's config as data (a copy: callers add to it): `train.config` with the
        sections written in `train:` merged over it."""
        assert self.train is not None
        if isinstance(self.train.config, str):
            path = self.train_config_file()
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as error:
                raise ConfigError(f"{path}: not valid YAML: {error}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: expected a mapping of key: value at the top level")
        else:
            data = json.loads(json.dumps(self.train.config))
        return _merge_sections(data, self.train.sections())

    def train_layout(self) -> dict[str, int]:
        """The run's tp, pp, dp and zero (the trainer config's `parallel`, checked by
        pipelines/checks.py), for plans and job scripts; with a config file that is not there
        (a template checked without its paths), the sections written in `train:`."""
        assert self.train is not None
        if isinstance(self.train.config, str) and not self.train_config_file().is_file():
            data = _merge_sections({}, self.train.sections())
        else:
            data = self.train_config_dict()
        parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
        defaults = {"tp": 1, "pp": 1, "dp": 1, "zero": 0}
        return {key: int(parallel.get(key, default)) for key, default in defaults.items()}

    def train_world_size(self) -> int:
        layout = self.train_layout()
        return layout["tp"] * layout["pp"] * layout["dp"]


def _merge_sections(data: dict[str, Any], sections: dict[str, Any]) -> dict[str, Any]:
    """Sections over config data: a mapping over a mapping key by key, anything else replaces."""
    out = dict(data)
    for name, value in json.loads(json.dumps(sections)).items():
        below = out.get(name)
        if isinstance(below, str) and name == "model" and isinstance(value, dict):
            below = {"preset": below}  # `model: tiny` below, overrides of the preset here
        out[name] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
    return out


# --------------------------------------------------------------------------------------------
# Error reporting with locations in the file


class RecipeError(ConfigError):
    """All problems found in a recipe, one per line (one problem: one line in all)."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        self.problems = problems
        if len(problems) == 1:
            super().__init__(f"{path}: {problems[0]}")
            return
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problems in the recipe:\n{lines}")


def format_loc(loc: tuple[Any, ...] | list[Any]) -> str:
    """('curate', 2, 'options', 'min_score') -> 'curate[2].options.min_score'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def suggest(word: str, candidates: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _line_index(text: str) -> dict[tuple[Any, ...], int]:
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
    import typing

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
            import re

            choices = re.findall(r"'([^']*)'", str(item.get("ctx", {}).get("expected", "")))
            problems.add(loc, f"{item['msg']} (got {item['input']!r}){suggest(item['input'], choices)}")
        else:
            problems.add(loc, f"{item['msg']} (got {item.get('input')!r})")


def load_recipe(path: str | Path, *, check_paths: bool | str = True, base_dir: Path | None = None) -> Recipe:
    """Parse and validate a recipe file; raise `RecipeError` listing every problem. Relative
    paths resolve against `base_dir`, by default the file's directory (the current directory for
    a recipe read from a URL)."""
    if storage.is_url(path):
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
        raise RecipeError(origin, [f"not valid YAML: {error}"]) from None
    if not isinstance(data, dict):
        raise RecipeError(origin, ["the recipe must be a YAML mapping (sources:, curate:, ...)"])
    data.update(overrides or {})
    problems = Problems(_line_index(text))
    try:
        recipe = Recipe.model_validate({**data, "base_dir": base_dir})
    except ValidationError as error:
        pydantic_problems(error, problems, Recipe)
        raise RecipeError(origin, problems.items) from None
    from tokenmill.pipelines.checks import check_recipe

    check_recipe(recipe, problems, check_paths=check_paths)
    if problems.items:
        raise RecipeError(origin, problems.items)
    recipe._warnings.extend(problems.warnings)
    return recipe
