"""The training configuration: typed, nested sections (as torchtitan's), validated by pydantic.

```yaml
model: {preset: tiny, n_layers: 4}      # a preset name, or a preset plus overrides
out: runs/train                        # the run directory (logs, checkpoints, tensorboard)
dataset: {path: data/shard, split: "969,30,1", tokenizer: null, seq_len: null}
optimizer: {lr: 3.0e-4, min_lr: 3.0e-5, weight_decay: 0.1, clip_grad: 1.0}
schedule: {steps: 100, global_batch_size: 8, warmup_steps: 10, decay_style: cosine}
parallel: {tp: 1, pp: 1, dp: 1, zero: 0, precision: fp32, max_restarts: 0, collective_timeout: 1800}
checkpoint: {interval: 0, keep_last: 3, async_save: false}
logging: {interval: 1, eval_interval: 0, tensorboard: true}
```

Errors are reported as recipes report them (tokenmill.problems): the key's
location, its line in the file, and the closest valid key for a typo, all problems at once; a
single problem is one line, the file and line first (``train.yaml:3: steps: moved; write
schedule.steps``).
A key of the old flat config (``lr: 3e-4``) is an error naming its place in the sections
(``lr: moved; write optimizer.lr``). The cross-field checks of the layout (ZeRO stage, pipeline
schedule, batch divisibility) live in `layout_problems`, the one place both the config and the
parallel engine use.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from tokenmill.errors import ConfigError, YamlSyntaxError, suggest
from tokenmill.infra.flags import scalar_type
from tokenmill.problems import Problems, line_index, pydantic_problems
from tokenmill.tokenize import DEFAULT_SPLIT
from tokenmill.train.model_config import PRESETS, ModelConfig, preset

PRECISIONS = ("fp32", "bf16")
CHECKPOINTING = ("off", "full", "selective")
# Scaled-dot-product attention kernels (torch.nn.attention.SDPBackend); auto: torch picks.
ATTENTION_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
DECAY_STYLES = ("cosine", "linear", "constant")
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved")
# Errors raised by the validators below carry their full message; pydantic's own are
# formatted by `tokenmill.problems.pydantic_problems`.
_OWN = "tokenmill"


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError(_OWN, message.replace("{", "{{").replace("}", "}}"))


# --------------------------------------------------------------------------------------------
# Value types with the messages users see (YAML gives ints for floats, strings for 3e-4).


def _int(value: Any) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise _fail(f"expected an integer, got {value!r}")
    return int(value)


def _float(value: Any) -> float:
    if isinstance(value, str):
        try:
            return float(value)  # YAML reads 3e-4 (no dot) as a string
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(f"expected a number, got {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _fail(f"expected a string, got {value!r}")
    return str(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(f"expected true or false, got {value!r}")
    return value


def _at_least(low: float) -> AfterValidator:
    def check(value: Any) -> Any:
        if value is not None and value < low:
            raise _fail(f"must be at least {low}, got {value}" if low else f"must be >= 0, got {value}")
        return value

    return AfterValidator(check)


@dataclasses.dataclass(frozen=True)
class _Choices:
    """The validator of a key with a fixed set of values; `choices` also shows in its flag's help."""

    choices: tuple[str, ...]

    def __call__(self, value: str) -> str:
        if value not in self.choices:
            raise _fail(f"must be one of {', '.join(self.choices)}, got {value!r}{suggest(value, self.choices)}")
        return value


def _choice(choices: tuple[str, ...]) -> AfterValidator:
    return AfterValidator(_Choices(choices))


def flag(default: Any, *, help: str, name: str | None = None, metavar: str | None = None) -> Any:
    """A config key that `tokenmill train` also takes as a flag, which overrides it (`config_flags`):
    `--KEY` with `-` for `_` (a boolean that defaults to true: `--no-KEY`), or `name`. `help` is
    the key's description and the flag's help."""
    return Field(default, description=help, json_schema_extra={"flag": name, "metavar": metavar})


Int = Annotated[int, BeforeValidator(_int)]
Positive = Annotated[int, BeforeValidator(_int), _at_least(1)]
Float = Annotated[float, BeforeValidator(_float)]
NonNegative = Annotated[float, BeforeValidator(_float), _at_least(0)]
NonNegativeInt = Annotated[int, BeforeValidator(_int), _at_least(0)]
Str = Annotated[str, BeforeValidator(_str)]
Bool = Annotated[bool, BeforeValidator(_bool)]


def _strs(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise _fail(f"expected a list, got {value!r}")
    return [_str(v) for v in value]


def _ints(value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise _fail(f"expected a list, got {value!r}")
    return [_int(v) for v in value]


# --------------------------------------------------------------------------------------------
# The model: a preset name, or a preset plus overrides, or a full mapping


def model_config_from(value: Any) -> ModelConfig:
    """``model: tiny`` or ``model: {preset: tiny, n_layers: 4, ...}`` or a full mapping.
    Raises ConfigError naming the key."""
    try:
        return _model(value)
    except PydanticCustomError as error:
        raise ConfigError(f"model: {error.message()}") from None
    except ValidationError as error:
        item = error.errors()[0]
        raise ConfigError(f"model.{'.'.join(map(str, item['loc']))}: {item['msg']}") from None


_MODEL_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
_MODEL_TYPES: dict[Any, Any] = {int: _int, float: _float, str: _str, bool: _bool}


def _model(value: Any) -> ModelConfig:
    if isinstance(value, ModelConfig):
        return value
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        raise _fail(f"expected a preset name or a mapping, got {value!r}")
    value = dict(value)
    name = value.pop("preset", None)
    overrides = {}
    for key, raw in value.items():
        if key not in _MODEL_FIELDS:
            extra = suggest(key, [*_MODEL_FIELDS, "preset"], 0.5) or f"; valid keys: {', '.join(sorted(_MODEL_FIELDS))}"
            raise _fail(f"unknown model key `{key}`{extra}")
        kind = {"int": int, "float": float, "str": str, "bool": bool}[str(_MODEL_FIELDS[key].type).split(" |")[0]]
        try:
            overrides[key] = None if raw is None and "None" in str(_MODEL_FIELDS[key].type) else _MODEL_TYPES[kind](raw)
        except PydanticCustomError as error:
            raise _fail(f"{key}: {error.message()}") from None
    if name is None:
        return ModelConfig(**overrides)
    if name not in PRESETS:
        raise _fail(f"unknown preset `{name}`{suggest(name, PRESETS)}; presets: {', '.join(PRESETS)}")
    return preset(name, **overrides)


# --------------------------------------------------------------------------------------------
# The sections


class _Section(BaseModel):
    # defer_build: the flags of `tokenmill train` read the keys alone, and building the
    # validators is most of this module's import; the first config that is read builds them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


class DataConfig(_Section):
    # The splits (train, valid, test) as Megatron's.
    path: Str | None = flag(None, name="--data", help="shard prefix (PREFIX.bin/.idx) or blend file")
    split: Str = DEFAULT_SPLIT
    tokenizer: Str | None = None  # recorded in checkpoints and copied by export-hf
    seq_len: Int | None = None  # None (or 0): the model's max_seq_len
    # Megatron's --make-vocab-size-divisible-by: a vocabulary taken from the data is padded to
    # a multiple of this times tp (so every tensor-parallel shard of the head is equal and wide).
    make_vocab_size_divisible_by: Positive = 128
    # Packed documents attend only within themselves (block-causal attention); documents end
    # at the EOD token (eod_id; None: the data's PREFIX.json). document_positions: positions
    # (RoPE, learned) restart at 0 in each document, as if each were trained alone.
    document_masking: Bool = False
    document_positions: Bool = True
    eod_id: NonNegativeInt | None = None
    # A blend reads each source's samples in the same order whatever the weights (each source
    # indexed as if its weight were 1): runs that differ only in weights, such as proxy models,
    # then differ only by the weights, not by which documents each source happened to give.
    same_source_order: Bool = False


class OptimizerConfig(_Section):
    """AdamW; decay only on matrices, as Megatron."""

    lr: Float = 3e-4
    min_lr: NonNegative = 3e-5
    weight_decay: NonNegative = 0.1
    beta1: Float = 0.9
    beta2: Float = 0.95
    eps: Float = 1e-8
    clip_grad: NonNegative = 1.0  # 0 disables clipping (the norm is still logged)


class ScheduleConfig(_Section):
    """Steps, batch sizes (Megatron's ramp-up) and the learning-rate schedule."""

    steps: Positive = flag(100, help="total training steps (counted from step 0)")
    global_batch_size: Positive = 8
    micro_batch_size: Int | None = None  # None (or 0): the whole local batch at once
    # Megatron's --rampup-batch-size: [start, increment, ramp-up samples].
    rampup_batch_size: Annotated[list[int], BeforeValidator(_ints)] | None = None
    decay_style: Annotated[str, BeforeValidator(_str), _choice(DECAY_STYLES)] = "cosine"
    warmup_steps: Int | None = None  # or warmup_samples; steps count global_batch_size samples
    warmup_samples: Int | None = None
    decay_steps: Int | None = None  # None (and no decay_samples): decay over the whole run
    decay_samples: Int | None = None
    seed: Int = 1234


class ParallelConfig(_Section):
    """How the model is laid out and run: applied by tokenmill.train.parallel.parallelize_gpt."""

    tp: Positive = flag(1, help="tensor-parallel size")
    pp: Positive = flag(1, help="pipeline-parallel size")
    dp: Positive = flag(1, help="data-parallel size")
    # Ranks splitting every sequence: ring attention with the load-balanced causal split.
    cp: Positive = flag(1, help="context-parallel size (ring attention; seq_len divisible by 2 x cp)")
    zero: Int = flag(0, help="ZeRO stage 0-3 over the data-parallel ranks")
    pp_schedule: Annotated[str, BeforeValidator(_str), _choice(PP_SCHEDULES)] = "1f1b"
    virtual_stages: Positive = 1
    sequence_parallel: Bool = False
    activation_checkpointing: Annotated[str, BeforeValidator(_str), _choice(CHECKPOINTING)] = flag(
        "off", help="blocks whose activations the backward pass recomputes: none, all, or every other one"
    )
    compile: Bool = flag(False, help="torch.compile each transformer block")
    activation_offload: Bool = flag(
        False, help="keep the tensors each transformer block saves for the backward pass in host memory"
    )
    # torchao's Float8Linear with tensorwise scaling (tokenmill.train.parallel.float8); fast only
    # on an H100-class GPU.
    float8: Bool = flag(False, help="Linear layers in float8 (needs torchao)")
    # Tokens per chunk of the head + cross-entropy computed together (tokenmill.train.chunked_loss):
    # the logits [tokens, vocab] never exist whole. 0: the plain head, then the loss.
    loss_chunk_tokens: NonNegativeInt = 0
    precision: Annotated[str, BeforeValidator(_str), _choice(PRECISIONS)] = flag(
        "fp32", help="the precision of the computation (bf16: fp32 master weights, optimizer state and loss)"
    )
    attention_backend: Annotated[str, BeforeValidator(_str), _choice(ATTENTION_BACKENDS)] = flag(
        "auto", help="the SDPA kernel of attention, forward and backward (one the device lacks is an error)"
    )
    device: Str = flag("auto", help="auto, cpu, cuda or cuda:N")
    # Restarts by train/supervisor.py; 0: a failed rank ends the job.
    max_restarts: NonNegativeInt = flag(
        0, metavar="N", help="when a rank fails, restart all ranks from the latest checkpoint, up to N times"
    )
    # Seconds a rank may wait in one collective for the other ranks before the job ends with
    # an error naming the rank and the operation (tokenmill.train.watchdog), instead of hanging.
    collective_timeout: Annotated[float, BeforeValidator(_float), _at_least(1)] = 1800.0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def stages_per_rank(self) -> int:
        return self.virtual_stages if self.pp_schedule == "interleaved" and self.pp > 1 else 1

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank


class CheckpointConfig(_Section):
    interval: NonNegativeInt = 0  # 0: only at the end
    keep_last: Positive = 3
    # Write checkpoints in the background (DCP async_save): training goes on while the files
    # are written; the step directory and `latest` are published once the write completes.
    async_save: Bool = False


class LoggingConfig(_Section):
    interval: Positive = 1
    eval_interval: NonNegativeInt = 0  # 0: no validation
    eval_iters: Positive = 1  # global batches of the valid split per evaluation
    peak_tflops: Float | None = flag(
        None, metavar="TFLOPS", help="the device's peak dense TFLOP/s, for MFU (default: known GPUs)"
    )
    tensorboard: Bool = True
    progress: Bool = flag(True, help="a progress bar on a terminal (false: plain log lines)")


class EvalConfig(_Section):
    """Evaluation of the weights in place during training: an ICL suite and/or bits per byte,
    every `every` steps and at the last step (none unless `suite` or `bpb` is set)."""

    every: Positive = 1000
    suite: Str | None = None  # `core` (DCLM's CORE, bundled) or a suite YAML file
    data_dir: Str | None = None  # the folder the suite's task files are under
    tasks: Annotated[list[str], BeforeValidator(_strs)] | None = None  # a subset of the suite's tasks
    limit: Positive = 50  # the first `limit` examples of each task
    bpb: Str | None = None  # held-out text: .jsonl (`text`), a document directory or a text file
    batch_size: Positive = 8  # requests per forward pass

    @property
    def enabled(self) -> bool:
        return bool(self.suite or self.bpb)


SECTIONS: dict[str, type[_Section]] = {
    "dataset": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "parallel": ParallelConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "eval": EvalConfig,
}


@dataclasses.dataclass(frozen=True)
class ConfigFlag:
    """A config key that `tokenmill train` takes as a flag (declared with `flag`)."""

    key: str  # its path: `parallel.tp`
    name: str | None  # the flag when it is not the key's last part (`--data`)
    kind: Any  # int, float, str or bool
    default: Any
    help: str
    choices: tuple[str, ...]
    metavar: str | None


def config_flags() -> list[ConfigFlag]:
    """Every key declared with `flag`, top-level keys first, then the sections' in order."""
    out = []
    for prefix, section in [("", TrainConfig), *((f"{name}.", model) for name, model in SECTIONS.items())]:
        for name, info in section.model_fields.items():
            extra = info.json_schema_extra
            if not isinstance(extra, dict) or "flag" not in extra:
                continue
            choices = [m.func.choices for m in info.metadata if isinstance(getattr(m, "func", None), _Choices)]
            out.append(
                ConfigFlag(
                    key=prefix + name,
                    name=extra["flag"],  # type: ignore[arg-type]
                    kind=scalar_type(info.annotation),
                    default=info.default,
                    help=info.description or "",
                    choices=choices[0] if choices else (),
                    metavar=extra["metavar"],  # type: ignore[arg-type]
                )
            )
    return out


# The keys of the old flat config and where they live now: only for the error that says so.
MOVED: dict[str, str] = {
    "data": "dataset.path",
    "split": "dataset.split",
    "tokenizer": "dataset.tokenizer",
    "seq_len": "dataset.seq_len",
    "make_vocab_size_divisible_by": "dataset.make_vocab_size_divisible_by",
    "lr": "optimizer.lr",
    "min_lr": "optimizer.min_lr",
    "weight_decay": "optimizer.weight_decay",
    "adam_beta1": "optimizer.beta1",
    "adam_beta2": "optimizer.beta2",
    "adam_eps": "optimizer.eps",
    "clip_grad": "optimizer.clip_grad",
    "steps": "schedule.steps",
    "global_batch_size": "schedule.global_batch_size",
    "micro_batch_size": "schedule.micro_batch_size",
    "rampup_batch_size": "schedule.rampup_batch_size",
    "lr_decay_style": "schedule.decay_style",
    "lr_warmup_steps": "schedule.warmup_steps",
    "lr_warmup_samples": "schedule.warmup_samples",
    "lr_decay_steps": "schedule.decay_steps",
    "lr_decay_samples": "schedule.decay_samples",
    "seed": "schedule.seed",
    "tp": "parallel.tp",
    "pp": "parallel.pp",
    "dp": "parallel.dp",
    "zero": "parallel.zero",
    "pp_schedule": "parallel.pp_schedule",
    "virtual_stages": "parallel.virtual_stages",
    "sequence_parallel": "parallel.sequence_parallel",
    "activation_checkpointing": "parallel.activation_checkpointing",
    "compile": "parallel.compile",
    "precision": "parallel.precision",
    "device": "parallel.device",
    "save_interval": "checkpoint.interval",
    "keep_last": "checkpoint.keep_last",
    "log_interval": "logging.interval",
    "eval_interval": "logging.eval_interval",
    "eval_iters": "logging.eval_iters",
    "peak_tflops": "logging.peak_tflops",
    "tensorboard": "logging.tensorboard",
    "progress": "logging.progress",
}


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, defer_build=True)  # as _Section

    model: Annotated[ModelConfig, BeforeValidator(_model)] = Field(default_factory=lambda: preset("tiny"))
    out: Str = flag(
        "runs/train", help="run directory (checkpoints, metrics.jsonl, tensorboard/); one run writes it at a time"
    )
    dataset: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    # Not a config key: True when the YAML left model.vocab_size out, so the run takes the
    # data's vocabulary (padded) instead of the preset's; resolved by `resolve_vocab_size`.
    _vocab_from_data: bool = PrivateAttr(default=False)

    @property
    def vocab_from_data(self) -> bool:
        return self._vocab_from_data

    @vocab_from_data.setter
    def vocab_from_data(self, value: bool) -> None:
        self._vocab_from_data = value

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def out_is_url(self) -> bool:
        """Whether the run directory is on object storage (``out`` is a URL)."""
        from tokenmill.infra import storage

        return not storage.Location(self.out).is_local

    @property
    def run_dir(self) -> Path:
        """Where the run writes: ``out`` itself, or for a URL its local copy in the cache, from
        which each checkpoint is uploaded once complete (`tokenmill.train.checkpoint.RemoteRun`)."""
        from tokenmill.infra import storage

        return storage.working_copy(self.out, "runs") if self.out_is_url else Path(self.out)

    @property
    def sequence_length(self) -> int:
        return self.dataset.seq_len or self.model.max_seq_len

    @property
    def local_micro_batch_size(self) -> int:
        return self.schedule.micro_batch_size or self.schedule.global_batch_size // self.parallel.dp

    def to_dict(self) -> dict[str, Any]:
        """The nested config as plain data (what `config_from_dict` reads back)."""
        data = {"model": self.model.to_dict(), "out": self.out}
        data.update({name: getattr(self, name).model_dump() for name in SECTIONS})
        return data

    def validate(self) -> TrainConfig:  # type: ignore[override]
        """Run the cross-field checks; raise ConfigError listing every problem."""
        problems = Problems({})
        config_problems(self, problems)
        _raise(problems)
        return self


# --------------------------------------------------------------------------------------------
# Cross-field checks, in one place


def layout_problems(
    parallel: ParallelConfig,
    model: ModelConfig | None = None,
    seq_len: int | None = None,
    world_size: int | None = None,
) -> list[tuple[tuple[str, ...], str]]:
    """Every reason the (tp, pp, dp, zero, schedule) layout cannot run: (location, message).
    With `model`, also whether the layout can hold it (the engine checks once the vocabulary
    is known); with `world_size`, whether as many processes were launched."""
    out: list[tuple[tuple[str, ...], str]] = []
    p = parallel
    if world_size is not None and p.world_size != world_size:
        out.append(
            (
                ("parallel",),
                (
                    f"tp x pp x dp{' x cp' if p.cp > 1 else ''} = {p.tp} x {p.pp} x {p.dp}"
                    f"{f' x {p.cp}' if p.cp > 1 else ''} = {p.world_size} "
                    f"but {world_size} processes were launched; they must be equal"
                ),
            )
        )
    if p.zero not in (0, 1, 2, 3):
        out.append((("parallel", "zero"), f"must be 0, 1, 2 or 3, got {p.zero}"))
    if p.float8 and p.tp > 1:
        # Float8Linear under tensor parallel needs torchao's float8 TP plans, not applied here.
        out.append((("parallel", "float8"), f"float8 is not supported with tensor parallel (tp = {p.tp}); use tp = 1"))
    if p.loss_chunk_tokens and (p.tp > 1 or p.zero >= 2):
        # Under tp the logits are vocabulary shards (loss_parallel's loss); FSDP2 (zero 2/3)
        # gathers the head's weight only inside the model's forward, outside which the loss is.
        layout = f"tensor parallel (tp = {p.tp})" if p.tp > 1 else f"zero = {p.zero} (FSDP2)"
        out.append(
            (
                ("parallel", "loss_chunk_tokens"),
                f"the chunked loss is not supported with {layout}; use tp = 1 and zero 0 or 1, or loss_chunk_tokens = 0",
            )
        )
    if p.pp_schedule == "interleaved" and p.virtual_stages < 2:
        out.append((("parallel", "virtual_stages"), "the interleaved schedule needs virtual_stages >= 2"))
    if p.cp > 1 and seq_len is not None and seq_len % (2 * p.cp):
        out.append(
            (
                ("parallel", "cp"),
                f"seq_len {seq_len} does not split into 2 x cp = {2 * p.cp} equal chunks (load-balanced causal split)",
            )
        )
    if model is None:
        return out
    if p.cp > 1 and model.dropout > 0:
        out.append(
            (
                ("parallel", "cp"),
                f"ring attention has no attention dropout; set model.dropout = 0 (got {model.dropout})",
            )
        )
    if p.tp > 1:
        assert model.n_kv_heads is not None and model.ffn_hidden is not None
        for name, value in (
            ("n_heads", model.n_heads),
            ("n_kv_heads", model.n_kv_heads),
            ("ffn_hidden", model.ffn_hidden),
            ("vocab_size", model.vocab_size),
        ):
            if value % p.tp:
                out.append((("parallel", "tp"), f"{p.tp} does not divide model.{name} = {value}"))
                break  # one line: the first dimension tp does not divide
        if p.sequence_parallel and seq_len is not None and seq_len % (p.tp * p.cp):
            split = f"tp = {p.tp}" if p.cp == 1 else f"tp x cp = {p.tp} x {p.cp}"
            out.append((("parallel", "sequence_parallel"), f"seq_len {seq_len} is not divisible by {split}"))
    if p.num_stages > model.n_layers:
        out.append(
            (
                ("parallel", "pp"),
                (
                    f"{p.num_stages} pipeline stages (pp={p.pp} x virtual_stages={p.stages_per_rank}) "
                    f"but the model has only {model.n_layers} layers; every stage needs at least one"
                ),
            )
        )
    return out


def eval_problems(cfg: TrainConfig) -> list[tuple[tuple[str, ...], str]]:
    """What the eval section lacks to say what to score, and the layouts its prompts cannot be
    split under (the files themselves are checked by preflight)."""
    ev, p = cfg.eval, cfg.parallel
    out: list[tuple[tuple[str, ...], str]] = []
    if ev.suite is None and (ev.tasks or ev.data_dir):
        out.append(
            (("eval", "suite"), "tasks and data_dir pick a suite's tasks: set eval.suite (core or a suite YAML file)")
        )
    if ev.suite is not None and not ev.data_dir:
        out.append((("eval", "data_dir"), f"suite {ev.suite}: set eval.data_dir, the folder its task files are under"))
    multiple = eval_length_multiple(p)
    if ev.enabled and cfg.model.max_seq_len % multiple:
        out.append(
            (
                ("eval",),
                f"evaluation pads prompts to a multiple of {multiple} (2 x cp x tp with sequence parallel), "
                f"which model.max_seq_len {cfg.model.max_seq_len} is not",
            )
        )
    return out


def eval_length_multiple(parallel: ParallelConfig) -> int:
    """The multiple an evaluation prompt's padded length must be under this layout: the
    load-balanced context-parallel split and the sequence-parallel split must both be even."""
    multiple = 2 * parallel.cp if parallel.cp > 1 else 1
    if parallel.tp > 1 and parallel.sequence_parallel:
        multiple *= parallel.tp
    return multiple


def check_layout(parallel: ParallelConfig, model: ModelConfig, seq_len: int, world_size: int | None = None) -> None:
    """Raise ConfigError (naming the key) when the layout cannot hold the model."""
    problems = Problems({})
    for loc, message in layout_problems(parallel, model, seq_len, world_size):
        problems.add(loc, message)
    _raise(problems)


def pipeline_microbatches(local_batch: int, n_micro: int, pp: int, pp_schedule: str) -> int:
    """The schedule's micro-batch count: the configured one, or pp when fewer (a pipeline
    needs one per stage; equal smaller micro-batches give the same mean gradient)."""
    n = n_micro
    if n < pp:
        if local_batch % pp:
            raise ConfigError(
                f"schedule.micro_batch_size: local batch {local_batch} gives {n_micro} micro-batch(es) for {pp} pipeline stages and "
                f"cannot be split into {pp}; raise global_batch_size or lower micro_batch_size"
            )
        n = pp
    if pp_schedule == "interleaved" and n % max(1, n // pp):
        raise ConfigError(
            f"schedule.micro_batch_size: the interleaved schedule needs the micro-batch count ({n}) to be a "
            f"multiple of {max(1, n // pp)} (micro-batches // pp); make local batch / micro_batch_size a "
            f"multiple of pp = {pp}"
        )
    return n


def check_batch_layout(cfg: TrainConfig, dims: ParallelConfig) -> None:
    """Raise ConfigError, before any process starts, if a batch of the run (the ramp-up's
    included) cannot be cut into the pipeline's micro-batches."""
    if dims.pp <= 1:
        return
    sizes = {cfg.schedule.global_batch_size}
    if cfg.schedule.rampup_batch_size is not None:
        start, increment, _ = cfg.schedule.rampup_batch_size
        sizes.update(range(start, cfg.schedule.global_batch_size + 1, increment))
    mbs = cfg.local_micro_batch_size
    for size in sorted(sizes):
        local = size // dims.dp
        pipeline_microbatches(local, local // mbs, dims.pp, dims.pp_schedule)


def config_problems(cfg: TrainConfig, problems: Problems, prefix: tuple[Any, ...] = ()) -> None:
    """The checks that need more than one key, added to a recipe-style `Problems`."""

    def add(loc: tuple[Any, ...], message: str) -> None:
        problems.add((*prefix, *loc), message)

    try:
        cfg.model.validate()
    except ValueError as error:
        key, _, message = str(error).partition(": ")
        add(("model", key), message)
    opt, sched = cfg.optimizer, cfg.schedule
    if opt.lr <= 0 or opt.min_lr > opt.lr:
        add(("optimizer", "lr"), f"need 0 < min_lr <= lr, got lr={opt.lr}, min_lr={opt.min_lr}")
    if cfg.sequence_length > cfg.model.max_seq_len:
        add(("dataset", "seq_len"), f"{cfg.sequence_length} exceeds the model's max_seq_len {cfg.model.max_seq_len}")
    if sched.warmup_steps is not None and sched.warmup_samples is not None:
        add(("schedule", "warmup_steps"), "give either warmup_steps or warmup_samples, not both")
    if sched.decay_steps is not None and sched.decay_samples is not None:
        add(("schedule", "decay_steps"), "give either decay_steps or decay_samples, not both")
    for loc, message in layout_problems(cfg.parallel, seq_len=cfg.sequence_length):
        add(loc, message)
    for loc, message in eval_problems(cfg):
        add(loc, message)
    # Every global batch (also during ramp-up) splits into dp ranks x whole micro-batches.
    dp = cfg.parallel.dp
    unit = cfg.local_micro_batch_size * dp
    if unit < 1 or sched.global_batch_size % unit:
        add(
            ("schedule", "global_batch_size"),
            f"{sched.global_batch_size} is not divisible by "
            f"micro_batch_size x dp = {cfg.local_micro_batch_size} x {dp}",
        )
        return
    ramp = sched.rampup_batch_size
    if ramp is not None:
        if len(ramp) != 3:
            add(("schedule", "rampup_batch_size"), "expected [start, increment, ramp-up samples]")
            return
        start, incr, samples = ramp
        if start < 1 or incr < 1 or samples < 1:
            add(("schedule", "rampup_batch_size"), f"all three values must be positive, got {ramp}")
        elif start % unit or incr % unit:
            add(
                ("schedule", "rampup_batch_size"),
                f"start {start} and increment {incr} must be multiples of micro_batch_size x dp = {unit}",
            )
        elif start > sched.global_batch_size or (sched.global_batch_size - start) % incr:
            add(
                ("schedule", "rampup_batch_size"),
                f"global_batch_size - start = {sched.global_batch_size - start} "
                f"is not a non-negative multiple of the increment {incr}",
            )


# --------------------------------------------------------------------------------------------
# Reading: nested data -> TrainConfig, errors located like recipes'


class _Errors:
    """A subset of a ValidationError's items, for `pydantic_problems`."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def errors(self) -> list[dict[str, Any]]:
        return self.items


def add_problems(data: Any, problems: Problems, prefix: tuple[Any, ...] = ()) -> TrainConfig | None:
    """Validate trainer config data into `problems` (a recipe's `Problems`), the keys located
    under `prefix`; returns the config when it is valid. A key of the old flat config is named
    with its new place (``lr: moved; write optimizer.lr``)."""
    if not isinstance(data, dict):
        problems.add(prefix, "the training config must be a YAML mapping of key: value (expected a mapping)")
        return None
    valid = [*SECTIONS, "model", "out"]
    for key in data:
        if key in MOVED:
            problems.add((*prefix, key), f"moved; write {MOVED[key]}")
        elif key not in valid:
            extra = suggest(key, valid, 0.5) or f"; valid keys: {', '.join(sorted(valid))}"
            problems.add((*prefix, key), f"unknown key `{key}`{extra}")
    if problems.items:
        return None
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as error:
        items = error.errors()
        for item in items:
            if item["type"] == _OWN:
                problems.add((*prefix, *_clean(item["loc"])), item["msg"])
        pydantic_problems(_Errors([i for i in items if i["type"] != _OWN]), problems, TrainConfig, prefix)  # type: ignore[arg-type]
        return None
    model = data.get("model")
    cfg._vocab_from_data = not (isinstance(model, dict) and "vocab_size" in model) and not isinstance(
        model, ModelConfig
    )
    config_problems(cfg, problems, prefix)
    return None if problems.items else cfg


def _clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


class _FlagProblems:
    """A recipe-style `Problems` whose keys set on the command line are named by the flag the
    user typed (`--steps: must be at least 1, got 0`), not by the config file they override."""

    def __init__(self, problems: Problems, flags: dict[tuple[str, ...], str]) -> None:
        self.problems = problems
        self.flags = flags
        self.flagged: set[str] = set()  # the items that name a flag

    @property
    def items(self) -> list[str]:
        return self.problems.items

    @property
    def warnings(self) -> list[str]:
        return self.problems.warnings

    def warn(self, loc: tuple[Any, ...], message: str) -> None:
        self.problems.warn(loc, message)

    def in_file(self, item: str, origin: str) -> str:
        return self.problems.in_file(item, origin)

    def add(self, loc: tuple[Any, ...], message: str) -> None:
        flag = self.flags.get(tuple(loc))
        if flag is None:
            self.problems.add(loc, message)
            return
        item = f"{flag}: {message}"
        self.problems.items.append(item)
        self.flagged.add(item)


def _raise(problems: Problems | _FlagProblems, origin: str | None = None) -> None:
    if not problems.items:
        return
    flagged = getattr(problems, "flagged", set())
    in_file = any(p not in flagged for p in problems.items)
    # The file is named only when one of the problems is in it.
    where = f"{origin}: " if origin and in_file else ""
    if len(problems.items) == 1:
        raise ConfigError(problems.in_file(problems.items[0], origin) if origin and in_file else problems.items[0])
    raise ConfigError(
        where
        + f"{len(problems.items)} problems in the {'training config' if in_file else 'options'}:\n"
        + "\n".join(f"  - {p}" for p in problems.items)
    )


def config_from_dict(
    data: dict[str, Any],
    *,
    origin: str | None = None,
    flags: dict[tuple[str, ...], str] | None = None,
    lines: dict[tuple[Any, ...], int] | None = None,
) -> TrainConfig:
    """Read a nested config; raise ConfigError listing every problem. `flags`: the keys (as
    locations, `("schedule", "steps")`) set by command-line flags, and each flag's name, which
    then names their problems instead of `origin`; `lines`: each key's line in the file
    `origin` (`problems.line_index`)."""
    problems = Problems(lines or {})
    if flags:
        problems = _FlagProblems(problems, flags)
    cfg = add_problems(data, problems)
    _raise(problems, origin)
    assert cfg is not None
    return cfg


def override_locations(overrides: dict[str, Any], flags: dict[str, str] | None = None) -> dict[tuple[str, ...], str]:
    """The location of each override that is set (`schedule.steps` -> `("schedule", "steps")`)
    and the flag that set it: `flags[key]`, by default `--` and the key's last part (`--steps`)."""
    out: dict[tuple[str, ...], str] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        default = f"--{key.rpartition('.')[2].replace('_', '-')}"
        out[tuple(key.split("."))] = (flags or {}).get(key, default)
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Config data (a copy) with command-line overrides put in place: each key is a top-level
    key (``out``) or a section's (``parallel.tp``); None values are ignored."""
    nested = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        section, _, name = key.rpartition(".")
        if not section:
            nested[name] = value
            continue
        target = nested.get(section)
        # A section that is not a mapping stays as written, so that its own error is reported.
        if target is None or isinstance(target, dict):
            nested[section] = {**(target or {}), name: value}
    return nested


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int = 1) -> int:
    """Megatron's padding: the next multiple of divisible_by x tp (50257 -> 50304 for GPT-2)."""
    multiple = divisible_by * tp
    return multiple * -(-vocab_size // multiple)


def resolve_vocab_size(cfg: TrainConfig, data_vocab: int | None, where: str = "the data") -> TrainConfig:
    """Set cfg.model.vocab_size from the data's tokenizer when the config left it out; check an
    explicit one covers the data. Returns cfg (changed in place)."""
    if cfg.vocab_from_data and data_vocab:
        size = padded_vocab_size(data_vocab, cfg.dataset.make_vocab_size_divisible_by, cfg.parallel.tp)
        cfg.model = dataclasses.replace(cfg.model, vocab_size=size)
        cfg.vocab_from_data = False
    elif data_vocab and data_vocab > cfg.model.vocab_size:
        raise ConfigError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the data's vocabulary ({data_vocab} in "
            f"{where}); set model.vocab_size >= {data_vocab}, or leave it out to use the data's (padded)"
        )
    return cfg


def load_config(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    *,
    flags: dict[str, str] | None = None,
    name: str | None = None,
) -> TrainConfig:
    """Read a YAML config, apply command-line overrides (None values ignored), validate.
    A problem with an override is named by its flag (`flags[key]`, by default `--key`); one in
    the file by `name` (by default the file's path)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training config {path} does not exist")
    text = path.read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise YamlSyntaxError(str(path), error) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value at the top level")
    # Problems are named by their line and key (`path:3: parallel.tp: ...`), or by the flag
    # that set the key (`--tp: ...`); inside a recipe they carry the recipe file's line
    # (tokenmill.pipelines.checks). A bundled config's lines would point inside the package.
    return config_from_dict(
        apply_overrides(data, overrides or {}),
        origin=name or str(path),
        flags=override_locations(overrides or {}, flags),
        lines=None if name else line_index(text),
    )
