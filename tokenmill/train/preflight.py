"""The checks of a training run that need no process group and no torch (but for a CUDA
device, whose GPUs torch counts), in the order a user fixes things: config, device, data,
checkpoint, vocabulary, parallel layout; and what a run directory already holds (its latest
checkpoint, whether there is anything left to do).

The launcher of a multi-rank run calls `prepare` before starting any rank, and so reports every
such mistake once, in one line, without loading torch; a rank (loop.py) calls it again.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenmill.errors import ConfigError, TokenmillError, suggest
from tokenmill.eval.bpb import read_documents
from tokenmill.eval.suites import Suite, SuiteData, load_suite, load_suite_data
from tokenmill.infra import storage
from tokenmill.infra.atomic import read_json
from tokenmill.train.checkpoint_files import (
    LATEST,
    CheckpointError,
    RemoteRun,
    list_checkpoints,
    read_meta,
    resolve_checkpoint,
)
from tokenmill.train.config import TrainConfig, check_batch_layout, check_layout, resolve_vocab_size


def check_device(cfg: TrainConfig) -> None:
    """A CUDA device asked for (``parallel.device``, ``--device``) is there, one GPU for each
    rank on this machine, before any rank starts: otherwise every rank would fail in its own
    CUDA or NCCL error. torch is imported only for a CUDA device (the check needs it, and such
    a run loads it anyway)."""
    device = cfg.parallel.device
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"parallel.device is {device!r} but torch sees no GPU on this machine "
            "(torch.cuda.is_available() is false); train on the CPU with --device cpu"
        )
    visible = torch.cuda.device_count()
    # The ranks on this machine: torchrun says so (a Slurm job over nodes); the local launcher
    # starts them all here.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size))
    suffix = device.partition(":")[2]
    index = int(suffix) if suffix.isdigit() else None
    if index is not None and index >= visible:
        raise ConfigError(f"parallel.device is {device!r} but torch sees {visible} GPU(s) on this machine")
    if index is None and local_ranks > visible:
        raise ConfigError(
            f"{local_ranks} ranks on this machine (tp x pp x dp x cp) need a GPU each, but torch sees {visible} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )


def check_data(data: str | None) -> list[str]:
    """The shard prefixes behind ``data`` (a prefix or a blend file), checked to exist and
    opened once, so that a damaged index is refused here, before any worker starts."""
    if not data:
        raise ConfigError("data: no training data given; set `data:` in the config or pass --data PREFIX")
    from tokenmill.tokenize.indexed import IndexedDataset
    from tokenmill.tokenize.loader import resolve_blend

    resolved = resolve_blend(data)  # raises a TokenmillError naming a missing shard or blend file
    prefixes = [resolved] if isinstance(resolved, str) else [entry.prefix for entry in resolved]
    for prefix in prefixes:
        IndexedDataset(prefix).close()  # raises a TokenmillError naming the shard and the bad entry
    return prefixes


def data_metadata(prefixes: list[str]) -> dict[str, Any]:
    """vocab_size (the largest, and the ``PREFIX.json`` naming it), tokenizer path and EOD id
    from the ``PREFIX.json`` files, where present."""
    vocab, source, tokenizer, eod = 0, None, None, None
    for prefix in prefixes:
        path = Path(f"{prefix}.json")
        meta = read_json(path)
        if not isinstance(meta, dict):
            continue
        if int(meta.get("vocab_size") or 0) > vocab:
            vocab, source = int(meta["vocab_size"]), str(path)
        tok = meta.get("tokenizer")
        tokenizer = tokenizer or (tok.get("path") if isinstance(tok, dict) else tok)
        eod = eod if eod is not None else meta.get("eod_id")
    return {"vocab_size": vocab or None, "vocab_source": source, "tokenizer": tokenizer, "eod_id": eod}


def split_tokens(prefix: str, ratios: str, split: str) -> tuple[int, int, int]:
    """(documents in the shard, documents in one split of it, tokens in that split)."""
    from tokenmill.tokenize.gpt_dataset import split_document_range
    from tokenmill.tokenize.indexed import IndexedDataset

    indexed = IndexedDataset(prefix)
    try:
        bounds = split_document_range(len(indexed), ratios, split)
        if bounds is None or bounds[1] <= bounds[0]:
            return len(indexed), 0, 0
        tokens = int(indexed.sequence_lengths[bounds[0] : bounds[1]].sum(dtype="int64"))
        return len(indexed), bounds[1] - bounds[0], tokens
    finally:
        indexed.close()


def check_data_fills_a_sample(cfg: TrainConfig, prefixes: list[str]) -> None:
    """Every shard's train split holds one sample at least (``seq_len + 1`` tokens). A shorter
    split would fill each sample with its own tokens over and over, and such a run started
    without a word on a first step of minutes (seq_len 1000000 over 289,441 tokens)."""
    seq_len = cfg.sequence_length
    for prefix in prefixes:
        _, _, tokens = split_tokens(prefix, cfg.dataset.split, "train")
        if tokens < seq_len + 1:
            raise ConfigError(
                f"dataset.seq_len is {seq_len} but the train split of {prefix} holds {tokens} tokens "
                f"(split {cfg.dataset.split!r}), fewer than one sample of seq_len + 1; lower dataset.seq_len "
                "(and model.max_seq_len) or train on more data"
            )


def empty_valid_split(cfg: TrainConfig, prefixes: list[str]) -> str | None:
    """Why validation cannot run (a shard whose valid split has no documents), or None."""
    for prefix in prefixes:
        documents, in_split, _ = split_tokens(prefix, cfg.dataset.split, "valid")
        if not in_split:
            return (
                f"the valid split of {prefix} has no documents ({documents} documents, split "
                f"{cfg.dataset.split!r}); give it more documents or a larger valid share in `dataset.split`"
            )
    return None


@dataclass
class EvalData:
    """What the eval section scores, read before training starts."""

    suite: SuiteData | None
    documents: list[str] | None


def check_eval(cfg: TrainConfig) -> EvalData | None:
    """Read the eval section's suite (only the tasks it names) and held-out text, so that an
    unknown suite or task, a missing folder or a bad file stops the run before it starts."""
    ev = cfg.eval
    if not ev.enabled:
        return None
    suite_data = None
    if ev.suite is not None:
        try:
            suite = load_suite(ev.suite)
            chosen = suite
            if ev.tasks is not None:
                labels = [t.label for t in suite.tasks]
                for task in ev.tasks:
                    if task not in labels:
                        extra = suggest(task, labels, form="; did you mean {!r}?")
                        raise ConfigError(f"unknown task {task!r} of suite {suite.name}{extra}")
                chosen = Suite(suite.name, suite.aggregate, tuple(t for t in suite.tasks if t.label in ev.tasks))
            suite_data = load_suite_data(chosen, ev.data_dir)
        except TokenmillError as error:
            raise ConfigError(f"eval: {error}") from None
        # The tasks left out by choice count as not run: the aggregate says what it is over.
        suite_data.missing += [t.label for t in suite.tasks if t not in chosen.tasks]
        suite_data.suite = suite
    try:
        documents = read_documents(ev.bpb) if ev.bpb else None
    except TokenmillError as error:
        raise ConfigError(f"eval.bpb: {str(error).removeprefix('--bpb: ')}") from None
    return EvalData(suite_data, documents)


@dataclass
class Prepared:
    """What `prepare` found: the data's shards and metadata, the checkpoint to resume from."""

    prefixes: list[str]
    data: dict[str, Any]
    checkpoint: Path | None
    no_validation: str | None  # why validation is skipped, or None
    checkpoint_meta: dict[str, Any] = field(default_factory=dict)  # its meta.json, unverified
    evaluation: EvalData | None = None  # what the eval section scores during training

    @property
    def checkpoint_step(self) -> int | None:
        """The step `checkpoint` was saved at."""
        step = self.checkpoint_meta.get("step")
        return None if step is None else int(step)


def resume_checkpoint(run_dir: Path, resume: bool | str | Path) -> Path | None:
    if not resume:
        return None
    if not storage.Location(resume).is_local:
        raise CheckpointError(f"--resume {resume}: a checkpoint on object storage is resumed with --out URL --resume")
    if resume is True and not list_checkpoints(run_dir):
        return None  # --resume on a fresh run directory simply starts
    return resolve_checkpoint(run_dir if resume is True else Path(resume))


def prepare(cfg: TrainConfig, resume: bool | str | Path = False) -> Prepared:
    """Every check that needs no process group, in the order a user fixes things: config,
    device, data (and whether it fills a sample), checkpoint, vocabulary, parallel layout.
    Sets model.vocab_size when the config takes it from the data. The launcher calls this
    before starting any worker."""
    cfg.validate()
    check_device(cfg)
    prefixes = check_data(cfg.dataset.path)
    meta_data = data_metadata(prefixes)
    if cfg.out_is_url and resume is True:
        ckpt_path = RemoteRun(cfg.out).pull()  # the URL, not the local cache, says where the run is
    else:
        ckpt_path = resume_checkpoint(cfg.run_dir, resume)
    ckpt_meta = read_meta(ckpt_path, verify=False) if ckpt_path is not None else {}
    if cfg.vocab_from_data and ckpt_path is not None:
        # A resumed run keeps its vocabulary, also under another tp (whose padding differs).
        saved = int(ckpt_meta.get("model", {}).get("vocab_size") or 0)
        if saved >= (meta_data["vocab_size"] or 0) and saved % cfg.parallel.tp == 0:
            cfg.model = replace(cfg.model, vocab_size=saved)
            cfg.vocab_from_data = False
    resolve_vocab_size(cfg, meta_data["vocab_size"], meta_data["vocab_source"] or "the data")
    check_data_fills_a_sample(cfg, prefixes)
    if cfg.dataset.document_masking and cfg.dataset.eod_id is None:
        if meta_data["eod_id"] is None:
            raise ConfigError(
                "dataset.document_masking: the data names no EOD token (PREFIX.json eod_id); set dataset.eod_id"
            )
        cfg.dataset.eod_id = int(meta_data["eod_id"])
    if cfg.world_size > 1:
        check_layout(cfg.parallel, cfg.model, cfg.sequence_length)
        check_batch_layout(cfg, cfg.parallel)
    no_validation = empty_valid_split(cfg, prefixes) if cfg.logging.eval_interval > 0 else None
    evaluation = check_eval(cfg)
    if evaluation is not None and not (cfg.dataset.tokenizer or meta_data["tokenizer"]):
        raise ConfigError("eval: the data names no tokenizer (PREFIX.json); set dataset.tokenizer to score prompts")
    return Prepared(prefixes, meta_data, ckpt_path, no_validation, ckpt_meta, evaluation)


def checkpoint_location(cfg: TrainConfig, checkpoint: Path) -> str:
    """A checkpoint as the user knows it: for a run on object storage, its URL (not the cache)."""
    if cfg.out_is_url and checkpoint.parent == cfg.run_dir / "checkpoints":
        return storage.join(cfg.out, "checkpoints", checkpoint.name)
    return str(checkpoint)


def latest_checkpoint(cfg: TrainConfig) -> str | None:
    """The run's latest complete checkpoint (a path, or a URL for a run on object storage)."""
    found = list_checkpoints(cfg.run_dir)
    if found:
        return checkpoint_location(cfg, found[-1])
    if cfg.out_is_url:
        pointer = RemoteRun(cfg.out).mirror.read(f"checkpoints/{LATEST}")
        name = pointer.decode().strip() if pointer else ""
        if name:
            return storage.join(cfg.out, "checkpoints", name)
    return None


def refuse_fresh_start(cfg: TrainConfig, resume: bool | str | Path) -> None:
    """A run directory that holds checkpoints is continued only when asked (``--resume``):
    started afresh there, a run would replace the metrics and rotate the checkpoints away."""
    if resume:
        return
    latest = latest_checkpoint(cfg)
    if latest is not None:
        raise TokenmillError(
            f"{cfg.out} already holds a run's checkpoints (latest {latest}); rerun with --resume to continue "
            "it, or pass another --out to start a new run"
        )


def nothing_to_do(cfg: TrainConfig, prepared: Prepared) -> tuple[int, str] | None:
    """(log level, message) when the resumed checkpoint is already at or past the last step."""
    step = prepared.checkpoint_step
    if prepared.checkpoint is None or step is None or step < cfg.schedule.steps:
        return None
    read_meta(prepared.checkpoint)  # a damaged last checkpoint is refused, not reported as done
    where = checkpoint_location(cfg, prepared.checkpoint)
    if step == cfg.schedule.steps:
        return logging.INFO, f"nothing to do: the run already reached its last step, {step} ({where})"
    return logging.WARNING, (
        f"nothing to do: the checkpoint {where} is at step {step}, past the {cfg.schedule.steps} steps asked for "
        f"(--steps, schedule.steps); ask for more than {step} steps to train further"
    )
