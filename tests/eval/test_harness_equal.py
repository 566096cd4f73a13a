"""Shown equal to lm-evaluation-harness: same requests, per-example loglikelihoods, accuracy, stderr.

One small random GPT-2 (saved locally with its own tokenizer) is evaluated zero- and few-shot on
every task with data in ../shared/data/eval, by `lm_eval.simple_evaluate` (offline, the harness's
own task YAMLs pointed at local JSON) and by tokenmill.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from tokenmill.eval.evaluator import evaluate_task, load_task_data  # noqa: E402
from tokenmill.eval.tasks import get_task  # noqa: E402

from .harness_ref import per_request, run_harness, write_reference_tasks  # noqa: E402

LIMIT = 16
BATCH = 8


@pytest.mark.slow
@pytest.mark.parametrize("shots", [0, 3])
def test_same_numbers_as_lm_eval(shots: int, tiny_model_dir: Path, tiny_model, eval_dir: Path, tmp_path: Path) -> None:
    names = write_reference_tasks(eval_dir, tmp_path / "harness_tasks")
    reference = run_harness(tiny_model_dir, tmp_path / "harness_tasks", list(names.values()), shots, LIMIT, BATCH)
    for ours, theirs in names.items():
        task = get_task(ours)
        data = load_task_data(task, eval_dir, LIMIT, need_pool=shots > 0)
        result = evaluate_task(tiny_model, task, shots, data, batch_size=BATCH, progress=False)
        ref = per_request(reference["samples"][theirs])
        assert [doc_id for doc_id, _, _ in ref] == list(range(LIMIT))
        for sample, (_, args, resps) in zip(result.samples, ref, strict=True):
            assert sample.requests == args, f"{ours} doc {sample.doc_index}: prompts differ"
            for ll, greedy, (ref_ll, ref_greedy) in zip(sample.loglikelihoods, sample.is_greedy, resps, strict=True):
                assert abs(ll - ref_ll) <= 1e-4, f"{ours} doc {sample.doc_index}: {ll} vs {ref_ll}"
                assert greedy == ref_greedy
        got = {row["metric"]: row for row in result.rows}
        harness = reference["results"][theirs]
        for metric, row in got.items():
            if metric == "perplexity":
                assert row["value"] == pytest.approx(harness["perplexity,none"], rel=1e-6)
            else:
                assert row["value"] == harness[f"{metric},none"], f"{ours} {metric}"
            assert row["stderr"] == pytest.approx(harness[f"{metric}_stderr,none"], rel=1e-6)
