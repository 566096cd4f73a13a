"""The fastText quality classifier: WikiText paragraphs (positives) against the same paragraphs
with their words shuffled (negatives), then the classify stage by threshold and Pareto rule."""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tokenmill.cli import main
from tokenmill.curate.classifier import ClassifyStage, pareto_draws, train_classifier
from tokenmill.curate.documents import write_documents
from tokenmill.curate.stage import run_stage
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra.document_dirs import read_manifest


def paragraphs(corpus, split: str, limit: int) -> list[str]:
    lines = (corpus / f"wikitext2_{split}.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if len(line.split()) >= 40 and not line.strip().startswith("=")][:limit]


def shuffled(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture(scope="module")
def quality_model(tmp_path_factory, shared_data):
    """A classifier trained on 1,400 WikiText-2 validation paragraphs vs their shuffled copies."""
    root = tmp_path_factory.mktemp("quality")
    good = paragraphs(shared_data / "corpus", "valid", 1400)
    rng = random.Random(0)
    write_documents(
        pd.DataFrame({"id": [f"wiki-{i}" for i in range(len(good))], "text": good, "source": "wiki"}),
        root / "positive" / "part.parquet",
    )
    write_documents(
        pd.DataFrame(
            {
                "id": [f"shuf-{i}" for i in range(len(good))],
                "text": [shuffled(t, rng) for t in good],
                "source": "shuffled",
            }
        ),
        root / "negative" / "part.parquet",
    )
    model = root / "quality.bin"
    # In this process, after whatever the tests before it freed (a `tokenmill run` trains after
    # its other steps the same way).
    meta = train_classifier(root / "positive", root / "negative", model, holdout=0.1, epoch=5, seed=0)
    return root, model, meta


# A process whose heap keeps what it freed: glibc serves blocks up to 32 MiB from the heap and
# never gives freed memory back, so the next large allocation gets the old bytes.
_KEEPS_FREED_MEMORY = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"
_TRAIN_AFTER_FREED_FLOATS = """
import json, sys
import numpy as np
from tokenmill.curate.classifier import train_classifier
freed = [np.full(30 * 2**20 // 4, 3e38, np.float32) for _ in range(4)]
del freed
print(json.dumps(train_classifier(sys.argv[1], sys.argv[2], sys.argv[3], holdout=0.1, epoch=5, seed=0)))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap is set up through glibc's tunables")
def test_training_reads_nothing_an_earlier_user_of_the_memory_left(quality_model, tmp_path):
    """fastText leaves most rows of its input matrix uninitialized (all but `thread` tenths);
    after 120 MiB of 3e38s were freed in the process, the model is byte for byte the one
    trained without them, not a training that diverges at every learning rate."""
    root, model, meta = quality_model
    again = tmp_path / "again.bin"
    done = subprocess.run(
        [sys.executable, "-c", _TRAIN_AFTER_FREED_FLOATS, str(root / "positive"), str(root / "negative"), str(again)],
        capture_output=True,
        text=True,
        env={**os.environ, "GLIBC_TUNABLES": _KEEPS_FREED_MEMORY},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["holdout"] == meta["holdout"]
    assert again.read_bytes() == model.read_bytes()


def test_train_classifier_reports_high_held_out_accuracy(quality_model):
    root, model, meta = quality_model
    assert model.exists()
    stored = json.loads(model.with_suffix(".json").read_text())
    assert stored == meta
    counts = meta["counts"]
    assert counts["positive"] == counts["negative"] == 1400
    assert counts["train"] + counts["holdout"] == 2800 and 180 < counts["holdout"] < 380
    # Word order alone separates real paragraphs from shuffled ones (fastText word bigrams).
    assert meta["holdout_accuracy"] >= 0.9
    assert meta["holdout"]["mean_score_hq"] > 0.8 > 0.2 > meta["holdout"]["mean_score_lq"]
    print(f"held-out accuracy {meta['holdout_accuracy']:.4f} on {counts['holdout']} documents")


def test_classify_by_threshold_on_unseen_documents(quality_model, tmp_path, shared_data, dask_client):
    _, model, _ = quality_model
    unseen = paragraphs(shared_data / "corpus", "test", 300)  # the test split: never trained on
    rng = random.Random(1)
    docs = pd.DataFrame(
        {
            "id": [f"good-{i}" for i in range(len(unseen))] + [f"bad-{i}" for i in range(len(unseen))],
            "text": unseen + [shuffled(t, rng) for t in unseen],
            "source": ["wiki"] * len(unseen) + ["shuffled"] * len(unseen),
        }
    )
    for i in range(3):
        write_documents(docs.iloc[i::3], tmp_path / "in" / f"part-{i}.parquet")
    manifest = run_stage(
        ClassifyStage(model=str(model), threshold=0.5),
        tmp_path / "in",
        tmp_path / "out",
        client=dask_client,
        progress=False,
    )
    counts = manifest["counts"]
    assert counts["in"] == 600 and counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    assert set(counts["rejected"]) == {"classify.below_threshold"}
    kept = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / "kept").glob("*.parquet"))
    rejected = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / "rejected").glob("*.parquet"))
    assert (kept["quality_score"] >= 0.5).all() and (rejected["quality_score"] < 0.5).all()
    good_kept = (kept["source"] == "wiki").sum() / 300
    bad_kept = (kept["source"] == "shuffled").sum() / 300
    assert good_kept > 0.9 and bad_kept < 0.1
    assert sum(v for k, v in manifest["stats"].items() if k.startswith("quality_score.")) == 600
    assert manifest["versions"]["quality_model"] == str(model.resolve())


def test_pareto_rule_is_deterministic_per_id_and_favours_high_scores(quality_model):
    _, model, _ = quality_model
    ids = [f"doc-{i}" for i in range(4000)]
    draws = pareto_draws(ids, alpha=9)
    assert np.array_equal(draws, pareto_draws(list(reversed(ids)), alpha=9)[::-1])  # order does not matter
    assert not np.array_equal(draws, pareto_draws(ids, alpha=9, seed=1))
    # the draws follow np.random.pareto(9): Lomax with mean 1 / (alpha - 1)
    reference = np.random.default_rng(0).pareto(9, 200_000)
    assert abs(draws.mean() - 1 / 8) < 0.01
    assert np.allclose(np.quantile(draws, [0.25, 0.5, 0.9]), np.quantile(reference, [0.25, 0.5, 0.9]), atol=0.01)

    stage = ClassifyStage(model=str(model), pareto_alpha=9)
    scores = {"high": 0.95, "mid": 0.8, "low": 0.3}
    kept_share = {}
    for name, score in scores.items():
        keep = draws > 1 - score
        kept_share[name] = keep.mean()
    assert kept_share["high"] > kept_share["mid"] > kept_share["low"]
    # through the stage: same documents in, same decisions out, regardless of partitioning
    frame = pd.DataFrame({"id": ids[:300], "text": ["the river runs past the mill ."] * 300, "source": "x"})
    first = stage.process(frame)
    second = pd.concat([stage.process(frame.iloc[:100]).kept, stage.process(frame.iloc[100:]).kept])
    assert list(first.kept["id"]) == list(second["id"])
    assert set(first.rejected["reason"]) <= {"classify.pareto"}
    # real paragraphs are kept more often than shuffled ones under the Pareto rule
    text = "the lobster is a species of crustacean found in the eastern atlantic ocean and the mediterranean sea ."
    rng = random.Random(3)
    real = pd.DataFrame({"id": ids[:500], "text": [text] * 500, "source": "x"})
    fake = pd.DataFrame({"id": ids[:500], "text": [shuffled(text, rng) for _ in range(500)], "source": "x"})
    assert len(stage.process(real).kept) > len(stage.process(fake).kept)


def test_classify_options_are_checked(quality_model, tmp_path):
    _, model, _ = quality_model
    with pytest.raises(ConfigError, match="either"):
        ClassifyStage(model=str(model), threshold=0.5, pareto_alpha=9)
    assert ClassifyStage(model=str(model)).threshold == 0.5
    with pytest.raises(ConfigError, match="positive"):
        ClassifyStage(model=str(model), pareto_alpha=0)


def test_classifier_cli(quality_model, tmp_path, curate_cli, capsys):
    root, _, _ = quality_model
    model = tmp_path / "cli.bin"
    assert (
        main(
            [
                "curate",
                "train-classifier",
                "--positive",
                str(root / "positive"),
                "--negative",
                str(root / "negative"),
                "--output",
                str(model),
                "--epoch",
                "10",
                "--max-docs",
                "600",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().err
    assert "held-out accuracy: " in printed and "WARNING" not in printed
    meta = json.loads(model.with_suffix(".json").read_text())
    assert meta["counts"]["positive"] == meta["counts"]["negative"] == 600
    majority = meta["holdout"]["majority_rate"]
    assert f"held-out accuracy: {meta['holdout_accuracy']:.4f}, majority-class rate {majority:.4f}" in printed
    assert meta["holdout_accuracy"] >= 0.9 and 0.5 <= majority < 0.7
    assert (
        curate_cli("classify", root / "positive", tmp_path / "scored", "--model", str(model), "--pareto-alpha", "9")
        == 0
    )
    manifest = read_manifest(tmp_path / "scored")
    assert manifest["counts"]["in"] == 1400 and manifest["config"]["pareto_alpha"] == 9
    # the Pareto rule (alpha 9) keeps a document with score s with probability (2 - s) ** -9:
    # most real paragraphs, almost no shuffled ones
    assert manifest["counts"]["kept"] / 1400 > 0.5
    assert (
        curate_cli("classify", root / "negative", tmp_path / "scored-neg", "--model", str(model), "--pareto-alpha", "9")
        == 0
    )
    assert read_manifest(tmp_path / "scored-neg")["counts"]["kept"] / 1400 < 0.1
    assert curate_cli("classify", root / "positive", tmp_path / "x", "--model", str(tmp_path / "missing.bin")) == 1
    assert "not found" in capsys.readouterr().err


def test_diverged_training_retries_at_a_lower_learning_rate(quality_model, tmp_path, caplog):
    # lr 80 reliably hits fastText's "Encountered NaN" on this text; a few halvings train
    root, _, _ = quality_model
    model = tmp_path / "retried.bin"
    with caplog.at_level("WARNING", logger="tokenmill.curate.classifier"):
        meta = train_classifier(root / "positive", root / "negative", model, lr=80, max_docs=300, seed=0)
    warnings = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert len(warnings) >= 1
    assert warnings == [
        f"fastText training diverged (NaN) at lr {80 / 2**i:g} (attempt {i + 1} of 5); retrying at lr {80 / 2 ** (i + 1):g}"
        for i in range(len(warnings))
    ]
    assert meta["config"]["lr_requested"] == 80
    assert meta["config"]["lr"] == 80 / 2 ** len(warnings)
    assert json.loads(model.with_suffix(".json").read_text())["config"]["lr"] == meta["config"]["lr"]
    assert meta["holdout_accuracy"] >= 0.8


def test_training_that_diverges_at_every_attempt_is_a_clear_error(quality_model, tmp_path):
    root, _, _ = quality_model
    model = tmp_path / "never.bin"
    with pytest.raises(
        TokenmillError, match=r"diverged \(NaN\) at every learning rate tried, from 1e\+06 down to 62500"
    ):
        train_classifier(root / "positive", root / "negative", model, lr=1e6, max_docs=300, seed=0)
    assert not model.exists() and not model.with_suffix(".json").exists()
    assert list(tmp_path.iterdir()) == []


def test_shared_texts_and_an_accuracy_at_the_majority_rate_are_warned_about(tmp_path, shared_data, capsys):
    """Negatives that hold every positive's text, and as many other real paragraphs: nothing
    tells the classes apart, the held-out accuracy does not beat always answering "negative",
    and train-classifier says both, one warning line each, with the majority-class rate."""
    texts = paragraphs(shared_data / "corpus", "valid", 600)
    positives, others = texts[:300], texts[300:]
    for name, class_texts in (("positive", positives), ("negative", positives + others)):
        frame = pd.DataFrame({"id": [f"{name}-{i}" for i in range(len(class_texts))], "text": class_texts})
        write_documents(frame.assign(source=name), tmp_path / name / "part.parquet")
    model = tmp_path / "muddled.bin"
    command = ["curate", "train-classifier", "--positive", str(tmp_path / "positive")]
    assert main([*command, "--negative", str(tmp_path / "negative"), "--output", str(model)]) == 0
    printed = capsys.readouterr().err
    meta = json.loads(model.with_suffix(".json").read_text())
    accuracy, majority = meta["holdout_accuracy"], meta["holdout"]["majority_rate"]
    assert accuracy <= majority and majority > 0.6
    warnings = [line for line in printed.splitlines() if line.startswith("tokenmill: WARNING: ")]
    assert warnings == [
        "tokenmill: WARNING: 300 of 300 positive documents have the same text as a negative one (after"
        " preprocessing); the classifier learns each of them as both classes",
        f"tokenmill: WARNING: held-out accuracy {accuracy:.4f} is not above the majority-class rate {majority:.4f}:"
        " the classifier does no better than always answering the larger class",
    ]
    assert f"held-out accuracy: {accuracy:.4f}, majority-class rate {majority:.4f}" in printed
