"""The sections of a recipe as typed models: sources, curation steps, classifiers, tokenizer,
blend, training, evaluation and Slurm. `tokenmill.pipelines.recipe` loads a file into them and
`tokenmill.pipelines.checks` checks what one section says about another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from tokenmill.errors import ConfigError, TokenmillError, YamlSyntaxError
from tokenmill.eval.suites import BUNDLED_SUITES
from tokenmill.infra import storage
from tokenmill.infra.slurm import SlurmSpec
from tokenmill.recipes import TRAIN_PREFIX, bundled_recipes
from tokenmill.train.config import MOVED as MOVED_TRAINING_KEYS

# The names of sources, curate steps and classifiers: also parts of paths in the work directory.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Source(_Strict):
    """One raw corpus. `path` is relative to the recipe file; `python-docs` needs none (the
    corpus is assembled from the running Python installation, see `curate/python_docs.py`)."""

    name: str = Field(pattern=NAME_PATTERN)
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
    name: str | None = Field(default=None, pattern=NAME_PATTERN)  # default: the stage kind
    sources: list[str] | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def step_name(self) -> str:
        return self.name or self.stage


class ChainSpec(_Strict):
    """How the curation steps that work document by document (extract, normalize, langid,
    url-filter, pii, filter, classify) run: consecutive ones in one pass over the data (`fuse`),
    what their `rejected/` holds (whole documents, `ids` with reasons, or `none`: counts only),
    and whether each writes its `kept/` (only the last of a pass does unless `keep_intermediate`)."""

    fuse: bool = True
    rejected: Literal["whole", "ids", "none"] = "ids"
    keep_intermediate: bool = False


class ClassifierSpec(_Strict):
    """A fastText quality classifier trained inside the run (GPT-3 / MT-NLG): `positive`
    sources (reference-quality text) against `negative` ones (raw web text), read as ingested.
    A `classify` curate stage uses it with `options: {classifier: NAME, ...}`."""

    name: str = Field(pattern=NAME_PATTERN)
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
    eval: dict[str, Any] | None = None  # evaluation during training (not the recipe's `eval:` step)
    nnodes: int = Field(default=1, ge=1)
    # What `--dry-run` gives the planner for a cluster-sized recipe (the run itself uses tp*pp*dp).
    gpus: int | None = Field(default=None, ge=1)
    gpu_memory: str | None = None
    extra_args: list[str] = Field(default_factory=list)

    # The keys `train:` once took (the launch keys `tp`, `pp`, `dp`, `zero`, `steps`) or a flat
    # training config did: only for the error that says where they went.
    MOVED: ClassVar[dict[str, str]] = MOVED_TRAINING_KEYS
    SECTIONS: ClassVar[tuple[str, ...]] = (
        "model",
        "dataset",
        "optimizer",
        "schedule",
        "parallel",
        "checkpoint",
        "logging",
        "eval",
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


class SuiteTarget(_Strict):
    """An ICL suite the proxies are scored on at their last step (the training config's `eval:`
    section, as `tokenmill eval --suite` scores): its aggregate, higher is better."""

    suite: str = "core"  # a bundled suite (core: DCLM's early-signal suite) or a suite YAML file
    tasks: list[str] | None = None  # a subset of its tasks
    data_dir: str | None = None  # the folder its task files are under
    limit: int = Field(default=50, ge=1)  # the first `limit` examples of each task


class ProxySpec(_Strict):
    """Small proxy models for `tokenmill ablate` and `tokenmill mix` (pipelines/proxies.py): the
    training config they share, the budget in steps, and how many runs each command trains.
    The defaults train the bundled `tiny` model for 200 steps: seconds per proxy on a laptop."""

    config: dict[str, Any] | str = "tiny"  # a training config: a bundled name, a file, or inline
    steps: int = Field(default=200, ge=1)
    # The budget's other factors, when not the config's: tokens = steps x batch_size x seq_len.
    batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    seeds: int = Field(default=3, ge=1)  # ablate: proxies per variant
    mixtures: int = Field(default=16, ge=2)  # mix: mixtures sampled over the sources
    seed: int = 0  # mix: the mixtures' sampling and the proxies' seed; ablate: the first seed
    # mix: seeds of each check run (seed + 1, seed + 2, ...: fresh ones, not the proxies' own)
    check_seeds: int = Field(default=3, ge=1)
    workers: int | None = Field(default=None, ge=1)  # proxies trained at once (default: one per 2 cores)
    slurm: bool = False  # train them as one Slurm job array, where the recipe's `slurm:` section says
    # What the proxies are scored on: held-out text (bits per byte), a suite, or a list of texts
    # and at most one suite.
    target: str | SuiteTarget | list[str | SuiteTarget] | None = None

    @field_validator("target")
    @classmethod
    def _one_suite(cls, value: Any) -> Any:
        if isinstance(value, list) and sum(isinstance(t, SuiteTarget) for t in value) > 1:
            raise ValueError("at most one suite")
        return value

    def targets(self) -> list[str | SuiteTarget]:
        return [] if self.target is None else list(self.target) if isinstance(self.target, list) else [self.target]


class Recipe(_Strict):
    name: str = "run"
    description: str | None = None
    workdir: str | None = None
    # A Dask scheduler's address: where the curation runs, and the proxies of ablate and mix train.
    scheduler: str | None = None
    workers: int | None = Field(default=None, ge=1)
    sources: list[Source] = Field(min_length=1)
    classifiers: list[ClassifierSpec] = Field(default_factory=list)
    curate: list[CurateStep] = Field(default_factory=list)
    chain: ChainSpec = Field(default_factory=ChainSpec)
    tokenize: TokenizerSpec | None = None
    blend: list[BlendEntry] | None = None
    train: TrainSpec | None = None
    eval: EvalSpec | None = None
    proxies: ProxySpec = Field(default_factory=ProxySpec)
    # How `tokenmill run --slurm` submits the recipe (recipe_job.py), and where the proxies'
    # job array runs (`--slurm` of ablate and mix, or proxies.slurm); ignored otherwise.
    slurm: SlurmSpec | None = None

    # Set by `load_recipe`: the recipe file's directory, against which relative paths resolve.
    base_dir: Path = Field(default=Path("."), exclude=True)
    # Problems that do not stop a dry run (input paths of a template that do not exist here).
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name_stays_in_the_directory(cls, value: str) -> str:
        """The default work directory is ``NAME-work`` in the current directory: a name never moves
        it elsewhere (``../x``, ``/tmp/x``)."""
        try:
            storage.join_inside(".", f"{value}-work", "the work directory")
        except TokenmillError:
            raise ValueError(
                f"{value!r} would put the default work directory ({value}-work) outside the current directory;"
                " give the recipe a name without '..' parts or a leading '/', or set workdir:"
            ) from None
        return value

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    def resolve(self, path: str) -> Path:
        """A path relative to the recipe made absolute; a URL (s3://, https://, ...) as it is."""
        if not storage.Location(path).is_local:
            return path  # type: ignore[return-value]  # URLs pass through to the storage layer
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def train_config_file(self) -> Path:
        """`train.config` given as a file (relative to the recipe) or as a bundled name (`tiny`)."""
        assert self.train is not None and isinstance(self.train.config, str)
        return self.config_file(self.train.config)

    def config_file(self, name: str) -> Path:
        """A training config named in the recipe: a file (relative to the recipe) or a bundled name."""
        path = self.resolve(name)
        if path.is_file():
            return path
        return bundled_recipes(TRAIN_PREFIX).get(name, path)

    def config_data(self, config: dict[str, Any] | str) -> dict[str, Any]:
        """A training config as data (a copy: callers add to it), read from its file if named."""
        if not isinstance(config, str):
            return json.loads(json.dumps(config))
        path = self.config_file(config)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as error:
            raise ConfigError(f"training config {config!r} is neither a file nor a bundled name ({error})") from None
        except yaml.YAMLError as error:
            raise YamlSyntaxError(str(path), error) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of key: value at the top level")
        return data

    def train_config_dict(self) -> dict[str, Any]:
        """The trainer's config as data (a copy: callers add to it): `train.config` with the
        sections written in `train:` merged over it."""
        assert self.train is not None
        data = self.config_data(self.train.config)
        return self._resolve_eval_paths(_merge_sections(data, self.train.sections()))

    def _resolve_eval_paths(self, data: dict[str, Any]) -> dict[str, Any]:
        """The in-training evaluation's files (a suite file, its data folder, held-out text),
        relative to the recipe as its other paths are."""
        section = data.get("eval")
        if isinstance(section, dict):
            for key in ("suite", "data_dir", "bpb"):
                value = section.get(key)
                if isinstance(value, str) and not (key == "suite" and value in BUNDLED_SUITES):
                    section[key] = str(self.resolve(value))
        return data

    def train_layout(self) -> dict[str, int]:
        """The run's tp, pp, dp, cp and zero (the trainer config's `parallel`, checked by
        pipelines/checks.py), for plans and job scripts; with a config file that is not there
        (a template checked without its paths), the sections written in `train:`."""
        assert self.train is not None
        if isinstance(self.train.config, str) and not self.train_config_file().is_file():
            data = _merge_sections({}, self.train.sections())
        else:
            data = self.train_config_dict()
        parallel = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
        defaults = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "zero": 0}
        return {key: int(parallel.get(key, default)) for key, default in defaults.items()}

    def train_world_size(self) -> int:
        layout = self.train_layout()
        return layout["tp"] * layout["pp"] * layout["dp"] * layout["cp"]


def _merge_sections(data: dict[str, Any], sections: dict[str, Any]) -> dict[str, Any]:
    """Sections over config data: a mapping over a mapping key by key, anything else replaces."""
    out = dict(data)
    for name, value in json.loads(json.dumps(sections)).items():
        below = out.get(name)
        if isinstance(below, str) and name == "model" and isinstance(value, dict):
            below = {"preset": below}  # `model: tiny` below, overrides of the preset here
        out[name] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
    return out
