"""The eval step: held-out perplexity from the trained run, and benchmark tasks through
`tokenmill.eval` (each task on its own, so one task without data does not stop the others)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from tokenmill.eval.evaluator import evaluate
from tokenmill.eval.models import load_model
from tokenmill.eval.results import markdown_table
from tokenmill.eval.tasks import MissingDataError
from tokenmill.infra.atomic import atomic_dir
from tokenmill.infra.cpu import set_torch_threads
from tokenmill.pipelines.step_graph import StepRef

log = logging.getLogger(__name__)


def heldout_perplexity(run_dir: Path) -> dict[str, Any] | None:
    """Perplexity on the blend's validation split, which training never sees (last val_loss)."""
    from tokenmill.train.metrics import read_metrics

    records = [m for m in read_metrics(run_dir) if isinstance(m.get("val_loss"), (int, float))]
    if not records:
        return None
    last = records[-1]
    return {
        "task": "heldout",
        "shots": 0,
        "metric": "perplexity",
        "value": math.exp(min(last["val_loss"], 50.0)),
        "stderr": None,
        "n": None,
        "step": last.get("step"),
        "split": "valid",
        "loss": last["val_loss"],
    }


def run_eval(ctx: Any, step: Any, spec: Any) -> dict[str, Any]:
    run_dir = ctx.steps[StepRef.train()].output / "run"
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    if spec.perplexity:
        ppl = heldout_perplexity(run_dir)
        if ppl is None:
            skipped.append(
                {
                    "task": "heldout",
                    "reason": "training logged no val_loss (set logging.eval_interval in the training config)",
                }
            )
        else:
            results.append(ppl)
    if spec.tasks:
        # Torch threads as `tokenmill eval` chooses them; training ran in processes of its own.
        set_torch_threads()
        data_dir = str(ctx.recipe.resolve(spec.data_dir)) if spec.data_dir else None
        model = load_model(run_dir)  # once for every task
        for task in spec.tasks:
            for shots in spec.shots:
                log.info(f"  eval {task} {shots}-shot")
                try:
                    results.extend(
                        evaluate(
                            model,
                            [task],
                            [shots],
                            data_dir=data_dir,
                            limit=spec.limit,
                            batch_size=spec.batch_size,
                            progress=ctx.progress,
                        )
                    )
                except MissingDataError as error:
                    if not spec.skip_missing:
                        raise
                    skipped.append({"task": task, "reason": str(error)})
                    log.info(f"  skipped {task}: {error}")
                    break
    if not any(r.get("task") != "heldout" for r in results):
        log.info(
            "  no benchmark scores: "
            + ("no task had its data" if spec.tasks else "no benchmark tasks in the recipe")
            + "; held-out perplexity only (the demo: pass --eval-data DIR with piqa_valid.jsonl, ...)"
        )
    payload = {"results": results, "skipped": skipped}
    with atomic_dir(step.output) as tmp:
        (tmp / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
        (tmp / "results.md").write_text(markdown_table(results))
    return payload
