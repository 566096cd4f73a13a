"""Evaluation during training: the weights being trained, scored in place by the ICL suite and
bits per byte of `tokenmill eval` (`tokenmill.eval.suites`, `tokenmill.eval.bpb`), every
``eval.every`` steps and at the last step, under any parallel layout.

`EngineModel` is a model adapter over the trainer's engine: its forward pass is the engine's
`eval_logits`, a collective every rank runs with the same inputs in the same order (every rank
builds the same requests from the same files), so tensor, pipeline, context and data parallel
(ZeRO 0-3) ranks score together, without exporting the weights or starting another process.
Prompts are right-padded to a length the layout can split; the model is causal, so padding
changes no scored position, and the scores are those of `tokenmill eval` on the checkpoint of
the same step (to float32 rounding, in the training precision).
"""

from __future__ import annotations

import logging
import time

import torch

from tokenmill.eval.bpb import bits_per_byte
from tokenmill.eval.models import RunTokenLM
from tokenmill.eval.suites import score_suite
from tokenmill.train.config import TrainConfig, eval_length_multiple
from tokenmill.train.engine import Engine
from tokenmill.train.hooks import Hook, Report, StepEnd, Stop
from tokenmill.train.preflight import EvalData

log = logging.getLogger(__name__)


class EngineModel(RunTokenLM):
    """The trainer's current weights as a model adapter of `tokenmill.eval.models`."""

    def __init__(self, engine: Engine, cfg: TrainConfig, tokenizer: str | None, eod_id: int | None) -> None:
        self.engine = engine
        self.name = f"{cfg.out} (in training)"
        self.device = engine.device
        self.max_length = cfg.model.max_seq_len
        self.length_multiple = eval_length_multiple(cfg.parallel)
        self._use_tokenizer(tokenizer, {"eod_id": eod_id})

    def _forward_selected(self, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        # Right padding to a length that context and sequence parallelism split evenly.
        pad = -inputs.shape[1] % self.length_multiple
        if pad:
            inputs = torch.nn.functional.pad(inputs, (0, pad))
            keep = torch.nn.functional.pad(keep, (0, pad))
        return self.engine.eval_logits(inputs, keep)


def evaluation_scores(model: RunTokenLM, data: EvalData, limit: int, batch_size: int) -> dict[str, float]:
    """The metrics-row keys of one evaluation: `eval/<task>/acc` and `/centered_acc` per task,
    `eval/<suite>` (its aggregate over the tasks that ran), `eval/bpb`, `eval/seconds`."""
    start = time.perf_counter()
    scores: dict[str, float] = {}
    if data.suite is not None:
        result = score_suite(model, data.suite, limit, batch_size, progress=False)
        for task in result.tasks:
            scores[f"eval/{task.task.label}/acc"] = task.accuracy
            scores[f"eval/{task.task.label}/centered_acc"] = task.centered_accuracy
        scores[f"eval/{result.suite.name}"] = result.aggregate_value
    if data.documents is not None:
        scores["eval/bpb"] = bits_per_byte(model, data.documents, batch_size, progress=False)["bits_per_byte"]
    scores["eval/seconds"] = time.perf_counter() - start
    return scores


class Evaluation(Hook):
    """Every ``eval.every`` steps and at the last, the eval section's scores, added to the
    step's metrics row (one is made if the step logs none)."""

    def __init__(self, cfg: TrainConfig, engine: Engine, data: EvalData, tokenizer: str | None, eod_id: int | None):
        self.every, self.limit, self.batch_size = cfg.eval.every, cfg.eval.limit, cfg.eval.batch_size
        self.data = data
        self.model = EngineModel(engine, cfg, tokenizer, eod_id)
        self.scores: dict[int, dict[str, float]] = {}  # step -> scores

    def score(self, step: int) -> dict[str, float]:
        """The current weights' scores, kept as ``step``'s."""
        self.scores[step] = evaluation_scores(self.model, self.data, self.limit, self.batch_size)
        return self.scores[step]

    def after_step(self, end: StepEnd) -> None:
        if not (end.step % self.every == 0 or end.last):
            return
        scores = self.score(end.step)
        end.record = end.record or {"step": end.step, "loss": end.loss}
        end.record.update(scores)


class EvaluationAtStop(Hook):
    """A run stopped on request before its last step is scored too, on the weights it stops
    with, unless that step was already scored. It runs after the stop's checkpoint is published
    (this hook follows `Checkpoints`), so a deadline that ends the process during the evaluation
    (Slurm's SIGKILL after a SIGTERM) costs only these scores, never the checkpoint. Its row
    holds the step and the scores; `metrics.read_metrics` merges it into the step's row."""

    def __init__(self, evaluation: Evaluation, stop: Stop, report: Report) -> None:
        self.evaluation, self.stop, self.report = evaluation, stop, report

    def finish(self, step: int, consumed: int) -> None:
        if self.stop.reason is None or step in self.evaluation.scores:
            return
        self.report.write({"step": step, **self.evaluation.score(step)})
