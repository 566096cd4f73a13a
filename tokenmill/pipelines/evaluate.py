"""The eval step: held-out perplexity from the trained run, and benchmark tasks through
`tokenmill.eval` (each task on its own, so one task without data does not stop the others)."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from tokenmill.errors import TokenmillError

# Where the eval package's entry point may live (the first found is used).
EVALUATE_CANDIDATES = (
    ("tokenmill.eval.evaluator", "evaluate"),
    ("tokenmill.eval.evaluate", "evaluate"),
    ("tokenmill.eval.runner", "evaluate"),
    ("tokenmill.eval.harness", "evaluate"),
    ("tokenmill.eval", "evaluate"),
)


def find_evaluate() -> Callable[..., Any] | None:
    for module_name, attr in EVALUATE_CANDIDATES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        fn = getattr(module, attr, None)
        if callable(fn) and not inspect.ismodule(fn):
            return fn
    return None


def heldout_perplexity(run_dir: Path) -> dict[str, Any] | None:
    """Perplexity on the blend's validation split, which training never sees (last val_loss)."""
    from tokenmill.pipelines.runner import read_metrics

    records = [m for m in read_metrics(run_dir) if isinstance(m.get("val_loss"), (int, float))]
    if not records:
        return None
    last = records[-1]
    return {"task": "heldout", "shots": 0, "metric": "perplexity", "value": math.exp(min(last["val_loss"], 50.0)),
            "stderr": None, "n": None, "step": last.get("step"), "split": "valid", "loss": last["val_loss"]}


def _call_evaluate(fn: Callable[..., Any], model: Any, task: str, shots: int, spec: Any, data_dir: str | None,
                   progress: bool) -> list[dict[str, Any]]:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    for name, value in (("data_dir", data_dir), ("limit", spec.limit), ("batch_size", spec.batch_size), ("progress", progress)):
        if name in params:
            kwargs[name] = value
    out = fn(model, [task], [shots], **kwargs)
    if isinstance(out, dict):
        out = out.get("results", [out])
    return list(out)


def run_eval(ctx: Any, step: Any, spec: Any) -> dict[str, Any]:
    run_dir = ctx.steps["train"].output / "run"
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    if spec.perplexity:
        ppl = heldout_perplexity(run_dir)
        if ppl is None:
            skipped.append({"task": "heldout", "reason": "training logged no val_loss (set eval_interval in train.config)"})
        else:
            results.append(ppl)
    if spec.tasks:
        fn = find_evaluate()
        if fn is None:
            raise TokenmillError("benchmark tasks need tokenmill.eval's `evaluate`, which is not installed")
        data_dir = str(ctx.recipe.resolve(spec.data_dir)) if spec.data_dir else None
        try:
            from tokenmill.eval.tasks import MissingDataError
        except ImportError:  # pragma: no cover - the eval package ships both
            MissingDataError = TokenmillError  # type: ignore[misc,assignment]
        model: Any = str(run_dir)
        try:  # load the checkpoint once for every task, when the eval package allows it
            from tokenmill.eval.models import load_model

            model = load_model(run_dir)
        except ImportError:
            pass
        for task in spec.tasks:
            for shots in spec.shots:
                print(f"  eval {task} {shots}-shot", flush=True)
                try:
                    results.extend(_call_evaluate(fn, model, task, shots, spec, data_dir, ctx.progress))
                except MissingDataError as error:
                    if not spec.skip_missing:
                        raise
                    skipped.append({"task": task, "reason": str(error)})
                    break
    tmp = step.output.with_name(f".{step.output.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    payload = {"results": results, "skipped": skipped}
    (tmp / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (tmp / "results.md").write_text(results_table(results) + "\n")
    if step.output.exists():
        import shutil

        shutil.rmtree(step.output)
    tmp.rename(step.output)
    return payload


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def results_table(results: list[dict[str, Any]]) -> str:
    lines = ["| task | shots | metric | value | stderr | n |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.get('task')} | {r.get('shots', '')} | {r.get('metric')} | {_fmt(r.get('value'))} | "
                     f"{_fmt(r.get('stderr'))} | {_fmt(r.get('n'))} |")
    return "\n".join(lines)
