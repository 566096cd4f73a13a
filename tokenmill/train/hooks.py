"""What hangs off the training step (`train/loop.py`): metrics rows, validation, the log and
progress bar, checkpoints, stop requests and fault injection.

The loop calls every hook at three points, in the order it lists them:

- `after_step(end)`: after each optimizer step. A hook may add to ``end.record`` (the metrics
  row of this step) or set ``end.stop`` to end the run after it; once ``end.stop`` is set, the
  hooks after that one are not called for the step.
- `finish(step, consumed)`: once, when the loop has ended without an error.
- `close()`: always, last, in reverse order; releases files, threads and the progress bar.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenmill.errors import TokenmillError
from tokenmill.train.checkpoint import AsyncCheckpointer, rng_state, save_checkpoint
from tokenmill.train.checkpoint_files import RemoteRun
from tokenmill.train.config import TrainConfig
from tokenmill.train.engine import Engine
from tokenmill.train.fault_injection import inject
from tokenmill.train.metrics import MetricsLogger, format_record, peak_flops, peak_memory_bytes
from tokenmill.train.stop import StopRequest


class StepValues:
    """The steps' losses and gradient norms as the device computed them. The host reads them
    only when something asks (a metrics row, a checkpoint, the run's end), every unread step's
    at once, so a step between logs never waits for the device; a non-finite loss among them
    ends the run, naming its step, before anything is written from those weights."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.norms: dict[int, float] = {}
        self._unread: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self._unread.append((step, loss.detach(), grad_norm.detach()))

    def read(self) -> None:
        """Read every unread step's values (one host synchronisation); raise TokenmillError
        at the first non-finite loss."""
        if not self._unread:
            return
        unread, self._unread = self._unread, []
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for _, loss, norm in unread]).tolist()
        for (step, _, _), (loss, norm) in zip(unread, values, strict=True):
            if not math.isfinite(loss):
                raise TokenmillError(f"loss is {loss} at step {step}; lower lr or enable clip_grad")
            self.losses[step], self.norms[step] = loss, norm


@dataclass
class StepEnd:
    """What one optimizer step did, as the hooks see it. Its loss and gradient norm are read
    from the device when a hook first asks for them (`StepValues`)."""

    step: int  # the step just taken, counted from 1
    values: StepValues
    lr: float
    batch_size: int
    consumed: int  # samples consumed, this step's included
    last: bool  # the run's last step (schedule.steps)
    record: dict[str, Any] | None = None  # the metrics row logged for this step, if any
    stop: str | None = None  # why the run stops after this step (a stop request), if it does

    @property
    def loss(self) -> float:
        self.values.read()
        return self.values.losses[self.step]

    @property
    def grad_norm(self) -> float:
        self.values.read()
        return self.values.norms[self.step]


class Hook:
    """A part of the run called at the loop's fixed points; each does nothing by default."""

    def after_step(self, end: StepEnd) -> None:
        pass

    def finish(self, step: int, consumed: int) -> None:
        pass

    def close(self) -> None:
        pass


def after_step(hooks: list[Hook], end: StepEnd) -> StepEnd:
    for hook in hooks:
        hook.after_step(end)
        if end.stop is not None:
            break
    return end


class Throughput(Hook):
    """At each logging step (every ``logging.interval`` and the last), the metrics row: loss,
    learning rate, gradient norm, tokens per second and MFU since the previous row, peak memory."""

    def __init__(self, cfg: TrainConfig, engine: Engine) -> None:
        self.interval = cfg.logging.interval
        self.sequence_length = cfg.sequence_length
        self.world_size = cfg.world_size
        self.device = engine.device
        # The fp8 peak when float8 matmuls are on (parallel.float8, where the config has it).
        self.peak = peak_flops(engine.device, cfg.logging.peak_tflops, bool(getattr(cfg.parallel, "float8", False)))
        self.flops_per_token = cfg.model.flops_per_token(cfg.sequence_length)
        self.tokens, self.since = 0, time.perf_counter()

    def after_step(self, end: StepEnd) -> None:
        self.tokens += end.batch_size * self.sequence_length
        if not (end.step % self.interval == 0 or end.last):
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        tokens_per_s = self.tokens / max(now - self.since, 1e-9)
        self.tokens, self.since = 0, now
        end.record = {
            "step": end.step,
            "loss": end.loss,
            "lr": end.lr,
            "grad_norm": end.grad_norm,
            "batch_size": end.batch_size,
            "consumed_samples": end.consumed,
            "tokens_per_s": tokens_per_s,
            "mfu": self.flops_per_token * tokens_per_s / (self.peak * self.world_size) if self.peak else None,
            "memory_gib": peak_memory_bytes(self.device) / 2**30,
        }


class Validation(Hook):
    """Every ``logging.eval_interval`` steps and at the last, the mean loss over the same
    validation batches; added to the step's row (one is made if the step logs none)."""

    def __init__(self, cfg: TrainConfig, engine: Engine, batches: list[torch.Tensor]) -> None:
        self.interval = cfg.logging.eval_interval
        self.engine = engine
        self.batches = batches
        self.losses: dict[int, float] = {}  # step -> validation loss

    def after_step(self, end: StepEnd) -> None:
        if not (self.interval and (end.step % self.interval == 0 or end.last) and self.batches):
            return
        val = sum(self.engine.eval_loss(b) for b in self.batches) / len(self.batches)
        self.losses[end.step] = val
        end.record = end.record or {"step": end.step, "loss": end.loss}
        end.record["val_loss"] = val
        end.record["val_ppl"] = math.exp(min(val, 50.0))


class Report(Hook):
    """Each row to metrics.jsonl (and TensorBoard) and to the terminal: above the progress bar,
    or as plain lines where there is none (not a terminal, or --no-progress). Only the logging
    rank writes."""

    def __init__(self, cfg: TrainConfig, engine: Engine, start_step: int) -> None:
        self.enabled = engine.is_logging_rank
        # Starting at step k (0 for a fresh run), rows logged after k by an earlier attempt are
        # about to be re-run: drop them so metrics.jsonl keeps one row per step.
        self.logger = MetricsLogger(
            cfg.run_dir, enabled=self.enabled, tensorboard=cfg.logging.tensorboard, start_step=start_step
        )
        self.bar = None
        if self.enabled and cfg.logging.progress:
            from tokenmill.progress import progress_bar

            self.bar = progress_bar(
                total=cfg.schedule.steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True
            )

    def after_step(self, end: StepEnd) -> None:
        if end.record is not None:
            if self.bar is not None and not self.bar.disable:
                self.bar.set_postfix(loss=f"{end.loss:.4f}", lr=f"{end.lr:.2e}")
            self.write(end.record)
        if self.bar is not None:
            self.bar.update(1)

    def write(self, record: dict[str, Any]) -> None:
        """One row to metrics.jsonl and the terminal; a second row of a step adds to its first
        (`metrics.read_metrics` merges them)."""
        self.logger.log(record)
        if self.bar is not None and not self.bar.disable:
            self.bar.write(format_record(record))
        elif self.enabled:
            print(format_record(record), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.logger.close()


class Checkpoints(Hook):
    """A checkpoint every ``checkpoint.interval`` steps and one at the end (unless the last step
    already has one, or a resumed run took no step); written in the background under
    ``checkpoint.async_save``, whose failure stops the run at the next step."""

    def __init__(self, cfg: TrainConfig, engine: Engine, meta: dict[str, Any], start_step: int, resumed: bool) -> None:
        self.cfg, self.engine = cfg, engine
        self.meta = meta  # meta.json's fields that stay the same all run
        self.start_step, self.resumed = start_step, resumed
        self.remote = RemoteRun(cfg.out) if cfg.out_is_url else None
        self.background = AsyncCheckpointer(self.remote) if cfg.checkpoint.async_save else None
        self.latest: Path | None = None  # the last checkpoint this run saved
        self.saved_at: int | None = None  # its step, when saved by the interval

    def save(self, step: int, consumed: int) -> Path:
        meta = {**self.meta, "consumed_samples": consumed, "rng": rng_state()}
        state = self.engine.state_dict_for_checkpoint()
        keep_last = self.cfg.checkpoint.keep_last
        if self.background is not None:
            return self.background.save(self.cfg.run_dir, step, state, meta, keep_last=keep_last)
        return save_checkpoint(self.cfg.run_dir, step, state, meta, keep_last=keep_last, remote=self.remote)

    def after_step(self, end: StepEnd) -> None:
        interval = self.cfg.checkpoint.interval
        if interval and end.step % interval == 0 and not end.last:
            end.values.read()  # never a checkpoint of weights a non-finite loss has stepped
            self.latest, self.saved_at = self.save(end.step, end.consumed), end.step
        if self.background is not None:
            self.background.poll()  # a failed background write stops the run here

    def finish(self, step: int, consumed: int) -> None:
        if self.saved_at != step and (step > self.start_step or not self.resumed):
            self.latest = self.save(step, consumed)
        if self.background is not None:
            self.background.wait()  # the run ends with its last checkpoint published

    def close(self) -> None:
        if self.background is not None:
            self.background.close()


class Stop(Hook):
    """A stop request (a signal or the stop file, `train/stop.py`) that every rank agrees on
    ends the run after this step, which the end's checkpoint then keeps. The logging rank
    removes the request once it is served."""

    def __init__(self, request: StopRequest, engine: Engine) -> None:
        self.request, self.engine = request, engine
        self.reason: str | None = None

    def after_step(self, end: StepEnd) -> None:
        if not end.last and self.request.agreed(self.engine.device):
            end.stop = self.reason = self.request.reason

    def finish(self, step: int, consumed: int) -> None:
        if self.reason and self.engine.is_logging_rank:
            self.request.clear_file()


class Faults(Hook):
    """The fault asked for by ``TOKENMILL_FAULT`` at ``step=N`` (`train/fault_injection.py`)."""

    def after_step(self, end: StepEnd) -> None:
        inject("step", end.step)
