"""Zero/one/few-shot evaluation, scored as lm-evaluation-harness 0.4.x scores it.

`evaluate(model_path, tasks, shots, data_dir, limit, batch_size)` returns one row per
(task, shots, metric); `tokenmill eval` is its command line. `evaluate` is imported lazily so
that `tokenmill --help` does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmill.eval.evaluator import evaluate


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from tokenmill.eval.evaluator import evaluate

        return evaluate
    raise AttributeError(f"module 'tokenmill.eval' has no attribute {name!r}")


__all__ = ["evaluate"]
