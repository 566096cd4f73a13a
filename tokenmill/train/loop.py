"""The training loop: data stream -> engine steps -> logs, validation, checkpoints.

Everything that decides a step (batch size, learning rate, which samples) is a function of
``consumed_samples``, and checkpoints store it with the model, optimizer and RNG states, so a
run stopped at step k and resumed reaches step n with the same losses as one that never
stopped (bitwise on the CPU in fp32; tested).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from tokenmill.entry import said_by_parent
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.train.checkpoint import load_checkpoint, set_rng_state
from tokenmill.train.checkpoint_files import read_meta
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine, pick_device
from tokenmill.train.evaluation import Evaluation, EvaluationAtStop
from tokenmill.train.hooks import (
    Checkpoints,
    Faults,
    Hook,
    Report,
    StepEnd,
    StepValues,
    Stop,
    Throughput,
    Validation,
    after_step,
)
from tokenmill.train.lifecycle import SUPERVISOR_PID_ENV, RunLock
from tokenmill.train.optim import Schedule, adamw_implementation
from tokenmill.train.parallel.mesh import release_own_group
from tokenmill.train.parallel.parallelize import uses_fsdp
from tokenmill.train.preflight import Prepared, checkpoint_location, nothing_to_do, prepare, refuse_fresh_start
from tokenmill.train.stop import StopRequest
from tokenmill.train.watchdog import CollectiveWatchdog, collective_failure

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    consumed_samples: int
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, this process's steps
    val_losses: dict[int, float] = field(default_factory=dict)
    eval_scores: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> the eval section's scores
    checkpoint: Path | None = None
    stopped: str | None = None  # why the run stopped at `checkpoint` before its last step (stop.py)


# ---------------------------------------------------------------------------- data


def build_streams(
    cfg: TrainConfig, schedule: Schedule, dp_rank: int, dp_size: int, consumed: int, validate: bool = True
):
    from tokenmill.tokenize.loader import SampleStream, build_dataset

    seq = cfg.sequence_length
    train_ds = build_dataset(
        cfg.dataset.path,
        seq_len=seq,
        num_samples=schedule.total_samples,
        seed=cfg.schedule.seed,
        split="train",
        split_ratios=cfg.dataset.split,
        same_source_order=cfg.dataset.same_source_order,
    )
    stream = SampleStream(train_ds, dp_rank=dp_rank, dp_size=dp_size, consumed_samples=consumed)
    valid_batches: list[torch.Tensor] = []
    if cfg.logging.eval_interval > 0 and validate:
        valid_ds = build_dataset(
            cfg.dataset.path,
            seq_len=seq,
            num_samples=cfg.logging.eval_iters * cfg.schedule.global_batch_size,
            seed=cfg.schedule.seed,
            split="valid",
            split_ratios=cfg.dataset.split,
        )
        # The same validation batches every time, so val_loss curves are comparable.
        valid_stream = SampleStream(valid_ds, dp_rank=dp_rank, dp_size=dp_size)
        valid_batches = [
            valid_stream.next_global_batch(cfg.schedule.global_batch_size) for _ in range(cfg.logging.eval_iters)
        ]
    return stream, valid_batches


# ---------------------------------------------------------------------------- engine


def build_engine(cfg: TrainConfig) -> Engine:
    """The engine of this process's share of the layout, on the configured device: the model
    is built on the meta device and initialized there, never first in full on the CPU."""
    return Engine(cfg, device=pick_device(cfg.parallel.device))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- loop


def train(
    cfg: TrainConfig,
    *,
    resume: bool | str | Path = False,
    engine: Engine | None = None,
    prepared: Prepared | None = None,
) -> TrainResult:
    """Train ``cfg.schedule.steps`` steps (counted from step 0, so a resumed run does the rest).
    ``prepared``: what `prepare` found, when the caller already checked the run."""
    prepared = prepared or prepare(cfg, resume)
    # The writing process (rank 0 under torchrun) holds the run directory before anything in
    # it is changed; a second run on it stops here.
    rank = int(os.environ.get("RANK", "0"))
    lock = RunLock(cfg.run_dir).acquire() if rank == 0 else None
    try:
        refuse_fresh_start(cfg, resume)
        done = nothing_to_do(cfg, prepared)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if done is not None:
        if lock is not None:
            lock.release()
        if rank == 0:
            log.log(*done)
        assert prepared.checkpoint is not None and prepared.checkpoint_step is not None
        return TrainResult(
            run_dir=cfg.run_dir,
            step=prepared.checkpoint_step,
            consumed_samples=int(prepared.checkpoint_meta.get("consumed_samples", 0)),
            checkpoint=prepared.checkpoint,
        )
    # Ranks wait for each other from the engine's first collective on: none waits forever.
    watchdog = CollectiveWatchdog(cfg.parallel.collective_timeout, rank).start() if cfg.world_size > 1 else None
    stop = StopRequest(cfg.run_dir, watch_file=rank == 0, world_size=cfg.world_size)
    if "LOCAL_RANK" not in os.environ:
        # A request left from an earlier run is stale; under torchrun its launcher (the local
        # one, or the Slurm script) removed it before starting the ranks.
        stop.clear_file()
    stop.install()
    built_here = engine is None
    try:
        return _train_steps(cfg, prepared, engine, stop)
    except RuntimeError as error:
        # A peer that died or stopped answering: one line naming this rank and the operation.
        failure = collective_failure(error, rank) if cfg.world_size > 1 else None
        if failure is None:
            raise
        if os.environ.get(SUPERVISOR_PID_ENV):  # the launcher names the rank that failed first
            said_by_parent(failure)
        raise failure from error
    finally:
        stop.uninstall()
        if built_here:
            release_own_group()  # FSDP2 on one process: its group of one ends with the run
        if watchdog is not None:
            watchdog.stop()
        if lock is not None:
            lock.release()


def _train_steps(cfg: TrainConfig, prepared: Prepared, engine: Engine | None, stop: StopRequest) -> TrainResult:
    """The loop: forward and backward, clip, optimizer step; the rest hangs off it as hooks."""
    schedule = Schedule(cfg)
    seed_everything(cfg.schedule.seed)
    engine = engine or build_engine(cfg)
    start, consumed = _resume(cfg, prepared, engine)
    stream, valid_batches = _open_data(cfg, prepared, engine, schedule, consumed)
    validation = Validation(cfg, engine, valid_batches)
    checkpoints = Checkpoints(
        cfg, engine, _checkpoint_meta(cfg, prepared), start_step=start, resumed=prepared.checkpoint is not None
    )
    stopping = Stop(stop, engine)
    report = Report(cfg, engine, start)
    _write_config(cfg, engine)
    # In the order they run after each step: the metrics row is made, validated and written;
    # then the checkpoint, the stop request and the injected fault, which may end the process.
    hooks: list[Hook] = [Throughput(cfg, engine), validation, report, checkpoints, stopping, Faults()]
    evaluation = None
    if prepared.evaluation is not None:
        evaluation = Evaluation(
            cfg, engine, prepared.evaluation, _tokenizer(cfg, prepared), prepared.data.get("eod_id")
        )
        hooks.insert(2, evaluation)  # scored before the row is written
        # A stopped run's weights are scored once their checkpoint is published.
        hooks.append(EvaluationAtStop(evaluation, stopping, report))
    step, values = start, StepValues()
    try:
        while step < cfg.schedule.steps:
            batch_size, lr = schedule.batch_size(consumed), schedule.lr(consumed)
            tokens = stream.next_global_batch(batch_size)
            if step == start:
                _check_tokens(tokens, cfg)  # the first batch this process reads
            # Loss and norm stay on the device: the host reads them when a hook needs them.
            loss = engine.forward_backward(tokens, cfg.local_micro_batch_size)
            grad_norm = engine.clip_gradients(cfg.optimizer.clip_grad)
            engine.optimizer_step(lr)
            step, consumed = step + 1, consumed + batch_size
            values.add(step, loss, grad_norm)
            end = StepEnd(step, values, lr, batch_size, consumed, last=step == cfg.schedule.steps)
            if after_step(hooks, end).stop is not None:
                break
        values.read()  # the run's last losses, checked before its last checkpoint
        for hook in hooks:
            hook.finish(step, consumed)
    finally:
        for hook in reversed(hooks):
            hook.close()
    return TrainResult(
        run_dir=cfg.run_dir,
        step=step,
        consumed_samples=consumed,
        losses=values.losses,
        val_losses=validation.losses,
        eval_scores=evaluation.scores if evaluation is not None else {},
        checkpoint=checkpoints.latest,
        stopped=stopping.reason,
    )


def describe_engine(cfg: TrainConfig, engine: Engine) -> str:
    """One line saying how the steps run: device, precision, attention kernel, compile, optimizer."""
    p = cfg.parallel
    device = str(engine.device)
    if engine.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(engine.device)})"
    if p.precision == "bf16":
        precision = "bf16 (FSDP2 bf16 parameters, fp32 reduce)" if uses_fsdp(p) else "bf16 (autocast, fp32 weights)"
    else:
        precision = "fp32"
    return (
        f"device {device} | precision {precision} | attention {p.attention_backend} | "
        f"compile {'per block' if p.compile else 'off'} | activation checkpointing {p.activation_checkpointing} | "
        f"activation offload {'on' if p.activation_offload else 'off'} | "
        f"optimizer AdamW {adamw_implementation(engine.optimizer)}"
    )


def _write_config(cfg: TrainConfig, engine: Engine) -> None:
    """The run's config as trained, beside its metrics and checkpoints; how it runs, logged once
    (shown on GPUs, where the kernels chosen matter; a debug line on the CPU)."""
    if engine.is_logging_rank:
        log.log(logging.INFO if engine.device.type == "cuda" else logging.DEBUG, describe_engine(cfg, engine))
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (cfg.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _resume(cfg: TrainConfig, prepared: Prepared, engine: Engine) -> tuple[int, int]:
    """(step, consumed samples) to start from: the checkpoint's, loaded into the engine, with its
    RNG states; (0, 0) for a fresh run."""
    ckpt_path = prepared.checkpoint
    if ckpt_path is None:
        return 0, 0
    meta = read_meta(ckpt_path)  # verifies sizes and checksums first
    if meta.get("model") != cfg.model.to_dict():
        diff = {
            k: (v, meta.get("model", {}).get(k))
            for k, v in cfg.model.to_dict().items()
            if meta.get("model", {}).get(k) != v
        }
        raise ConfigError(
            f"model: the config's model differs from the checkpoint's ({ckpt_path / 'meta.json'}): "
            + ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in diff.items())
        )
    state = engine.state_dict_for_checkpoint()
    load_checkpoint(ckpt_path, state, verify=False)
    engine.load_state_dict_from_checkpoint(state)
    if "rng" in meta:
        set_rng_state(meta["rng"], ckpt_path / "meta.json")
    if engine.is_logging_rank:
        log.info(f"resuming from step {int(meta['step'])} ({checkpoint_location(cfg, ckpt_path)})")
    return int(meta["step"]), int(meta["consumed_samples"])


def _open_data(
    cfg: TrainConfig, prepared: Prepared, engine: Engine, schedule: Schedule, consumed: int
) -> tuple[Any, list[torch.Tensor]]:
    """The training stream, positioned at ``consumed``, and the validation batches (none when
    the valid split is empty, which the logging rank warns about)."""
    dp_rank, dp_size = engine.dp_rank, engine.dp_size
    if prepared.no_validation and engine.is_logging_rank:
        log.warning("no validation: %s", prepared.no_validation)
    return build_streams(cfg, schedule, dp_rank, dp_size, consumed, validate=prepared.no_validation is None)


def _checkpoint_meta(cfg: TrainConfig, prepared: Prepared) -> dict[str, Any]:
    """The fields of every checkpoint's meta.json that stay the same all run."""
    return {
        "model": cfg.model.to_dict(),
        "train": cfg.to_dict(),
        "tokenizer": _tokenizer(cfg, prepared),
        "eod_id": prepared.data.get("eod_id"),
    }


def _tokenizer(cfg: TrainConfig, prepared: Prepared) -> str | None:
    """The run's tokenizer file: the config's, else the one the data names."""
    return cfg.dataset.tokenizer or prepared.data["tokenizer"]


def _check_tokens(tokens: torch.Tensor, cfg: TrainConfig) -> None:
    top = int(tokens.max())
    if top >= cfg.model.vocab_size:
        raise ConfigError(
            f"model.vocab_size: {cfg.model.vocab_size} but the data holds token id {top}; "
            f"set model.vocab_size to at least {top + 1}"
        )
    if tokens.shape[1] != cfg.sequence_length + 1:
        raise TokenmillError(
            f"the data stream gave rows of {tokens.shape[1]} tokens, expected seq_len+1 = {cfg.sequence_length + 1}"
        )
