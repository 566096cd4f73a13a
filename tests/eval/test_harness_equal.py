"""Shown equal to lm-evaluation-harness: same requests, scores and stderrs; loglikelihoods to rounding.

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

from .conftest import close_ll  # noqa: E402
from .harness_ref import per_request, run_harness, write_reference_tasks  # noqa: E402

LIMIT = 16
BATCH = 8


@pytest.mark.slow
@pytest.mark.parametrize("shots", [0, 3])
def test_same_numbers_as_lm_eval(shots: int, tiny_model_dir: Path, tiny_model, eval_dir: Path, tmp_path: Path) -> None:
    """Prompts, greedy flags, per-document scores, accuracies and stderrs exactly; loglikelihoods to
    float32 rounding (the harness projects every position to the vocabulary, tokenmill only the
    continuation's, so the matrix products round differently)."""
    names = write_reference_tasks(eval_dir, tmp_path / "harness_tasks")
    reference = run_harness(
        tiny_model_dir, tmp_path / "harness_tasks", [t for t, _ in names.values()], shots, LIMIT, BATCH
    )
    worst = 0.0
    for ours, (theirs, data_dir) in names.items():
        task = get_task(ours)
        data = load_task_data(task, data_dir, LIMIT, need_pool=shots > 0)
        result = evaluate_task(tiny_model, task, shots, data, batch_size=BATCH, progress=False)
        ref = per_request(reference["samples"][theirs])
        ref_scores = {s["doc_id"]: s for s in reference["samples"][theirs]}
        assert [doc_id for doc_id, _, _ in ref] == list(range(LIMIT))
        for sample, (doc_id, args, resps) in zip(result.samples, ref, strict=True):
            assert sample.requests == args, f"{ours} doc {sample.doc_index}: prompts differ"
            for ll, greedy, (ref_ll, ref_greedy) in zip(sample.loglikelihoods, sample.is_greedy, resps, strict=True):
                assert ll == close_ll(ref_ll), f"{ours} doc {sample.doc_index}: {ll} vs {ref_ll}"
                assert greedy == ref_greedy
                worst = max(worst, abs(ll - ref_ll) / max(abs(ref_ll), 1e-30))
            for metric, value in sample.scores.items():
                if metric == "perplexity":  # per document, the loglikelihood itself
                    assert value == close_ll(ref_scores[doc_id][metric])
                else:
                    assert value == ref_scores[doc_id][metric], f"{ours} doc {doc_id} {metric}"
        got = {row["metric"]: row for row in result.rows}
        harness = reference["results"][theirs]
        for metric, row in got.items():
            if metric == "perplexity":
                assert row["value"] == pytest.approx(harness["perplexity,none"], rel=1e-5)
                assert row["stderr"] == pytest.approx(harness[f"{metric}_stderr,none"], rel=1e-5)
            else:
                assert row["value"] == harness[f"{metric},none"], f"{ours} {metric}"
                assert row["stderr"] == pytest.approx(harness[f"{metric}_stderr,none"], rel=1e-12, abs=0)
    print(f"worst relative loglikelihood difference at {shots} shots: {worst:.2e}")
