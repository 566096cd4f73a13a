"""acc / acc_norm / perplexity and their standard errors, as the harness computes them."""

from __future__ import annotations

import math
import random

import pytest

from tokenmill.eval.metrics import aggregate, bootstrap_perplexity_stderr, multiple_choice_scores


def test_acc_and_acc_norm_of_one_doc() -> None:
    # acc picks the highest loglikelihood; acc_norm divides by the choice's length in characters.
    scores = multiple_choice_scores([-4.0, -6.0], ["ab", "abcdefgh"], gold=1)
    assert scores == {"acc": 0.0, "acc_norm": 1.0}
    # Ties go to the first choice, as np.argmax does.
    assert multiple_choice_scores([-1.0, -1.0], ["a", "b"], gold=0)["acc"] == 1.0


def test_mean_and_closed_form_stderr() -> None:
    value, stderr = aggregate("acc", [1.0, 0.0, 1.0, 1.0])
    assert value == 0.75
    # sample variance (n - 1) = 0.25, stderr = sqrt(0.25) / sqrt(4)
    assert stderr == pytest.approx(math.sqrt(0.25) / math.sqrt(4))
    assert aggregate("acc", [1.0])[1] is None


def test_perplexity_bootstrap_equals_harness() -> None:
    metrics = pytest.importorskip("lm_eval.api.metrics")
    rng = random.Random(3)
    lls = [-rng.uniform(0.5, 12.0) for _ in range(41)]
    value, stderr = aggregate("perplexity", lls, bootstrap_iters=3000)
    assert value == metrics.perplexity(lls)
    theirs = metrics._bootstrap_internal_no_mp(metrics.perplexity, lls, 3000)
    assert stderr == pytest.approx(metrics.sample_stddev(theirs), rel=1e-12)


def test_perplexity_bootstrap_is_deterministic_and_positive() -> None:
    lls = [-1.0, -2.0, -3.5, -0.5]
    a = bootstrap_perplexity_stderr(lls, 2000)
    assert a is not None and a > 0 and a == bootstrap_perplexity_stderr(lls, 2000)
    assert bootstrap_perplexity_stderr([-1.0], 2000) is None
