"""The model-based quality filter of GPT-3 and MT-NLG: a fastText classifier trained on
reference-quality documents (positives, `__label__hq`) against raw documents (negatives,
`__label__lq`), then used to score every document and keep it by a threshold or by GPT-3's
Pareto rule.

    train_classifier(["wiki/"], ["crawl/"], "quality.bin")      # writes quality.bin + quality.json
    run_stage(ClassifyStage("quality.bin", pareto_alpha=9), "filtered/", "classified/")

Training holds out a fraction of each class (chosen by a hash of the document id, so the split
does not depend on file order) and reports the held-out accuracy, stored in `MODEL.json`
beside the model together with the settings and the text preprocessing, which `classify`
reuses. The fastText model is loaded lazily once per worker process and never pickled.

Pareto rule (GPT-3, appendix A): keep a document when `pareto(alpha) > 1 - score`. The Pareto
draw of each document comes from its id: `u = xxh64(id, seed)` mapped to (0, 1], and
`u ** (-1 / alpha) - 1` (the inverse CDF of the Lomax distribution that `np.random.pareto`
samples), so a document's fate is the same on every run, worker count and partitioning.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from tokenmill.curate.documents import read_documents
from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.curate.text import single_line
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.atomic import atomic_path, atomic_write_text
from tokenmill.infra.document_dirs import input_list, resolve_input_files
from tokenmill.infra.outputs import OutputKind, claim_output

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

log = logging.getLogger(__name__)

LABEL_HQ = "__label__hq"
LABEL_LQ = "__label__lq"


def preprocess(text: str, lowercase: bool = True) -> str:
    """One line of text for fastText: whitespace runs (newlines included) become one space."""
    line = single_line(text)
    return line.lower() if lowercase else line


# What train-classifier's output may replace: an earlier model, MODEL.json beside it.
CLASSIFIER_OUTPUT = OutputKind("a classifier model", ("{stem}.json",), layout="file")


def metadata_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(".json")


def _id_hash(doc_id: str, seed: int) -> int:
    return xxhash.xxh64_intdigest(str(doc_id).encode("utf-8"), seed=seed)


def _read_texts(inputs: list[str | Path], max_docs: int | None, seed: int) -> tuple[list[str], list[str]]:
    """(ids, texts) of every document in `inputs`; with `max_docs`, the documents whose id hash
    is smallest (a deterministic sample that does not depend on file order)."""
    import numpy as np

    ids: list[str] = []
    texts: list[str] = []
    for path in resolve_input_files(list(inputs)):
        frame = read_documents(path, columns=["id", "text"])
        keep = frame["text"].map(lambda t: isinstance(t, str) and bool(t.strip()))
        ids.extend(frame["id"][keep].astype(str).tolist())
        texts.extend(frame["text"][keep].tolist())
    if max_docs is not None and len(ids) > max_docs:
        order = np.argsort(np.array([_id_hash(i, seed) for i in ids], dtype=np.uint64), kind="stable")[:max_docs]
        order.sort()
        ids = [ids[i] for i in order]
        texts = [texts[i] for i in order]
    return ids, texts


def _load_fasttext():
    try:
        import fasttext
    except ImportError:  # pragma: no cover - a dependency of the package
        raise TokenmillError("fastText is not installed (pip install fasttext-numpy2)") from None
    # fastText prints a warning on load_model; keep worker logs quiet
    fasttext.FastText.eprint = lambda *args, **kwargs: None
    return fasttext


def predict_hq(model, lines: list[str]) -> np.ndarray:
    """Probability of `__label__hq` for each one-line text."""
    import numpy as np

    if not lines:
        return np.zeros(0, dtype=np.float64)
    labels, probs = model.predict(lines, k=-1)
    scores = np.empty(len(lines), dtype=np.float64)
    for i, (doc_labels, doc_probs) in enumerate(zip(labels, probs)):
        score = None
        for label, prob in zip(doc_labels, doc_probs):
            if label == LABEL_HQ:
                score = float(prob)
                break
        if score is None:  # only the other label came back
            score = 1.0 - float(doc_probs[0]) if len(doc_probs) else 0.0
        scores[i] = min(1.0, max(0.0, score))
    return scores


# glibc's mallopt parameter: malloc fills each block it takes from its heap with this byte
# XOR 0xff (and free fills freed blocks with the byte itself).
_M_PERTURB = -6


@contextmanager
def _zero_filled_allocations() -> Iterator[None]:
    """While fastText trains, the C library hands out zero-filled memory.

    fastText allocates its input matrix (a row per word and per n-gram bucket) uninitialized
    and fills only `thread` tenths of it with random values (it splits the matrix into ten
    blocks, one per thread); the other rows are trained from what the memory held. A fresh
    process gets that memory from the kernel, zeroed, but a process that freed large blocks
    before (a `tokenmill run` after other steps, a test session) can get them back from its
    heap with their old bytes, and the training then diverges at every learning rate or learns
    nothing. Only glibc is told (its M_PERTURB); other C libraries are left as they are.
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        yield
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(_M_PERTURB, 0xFF)
    try:
        yield
    finally:
        # What the process started with (glibc reads MALLOC_PERTURB_ at start-up).
        mallopt(_M_PERTURB, int(os.environ.get("MALLOC_PERTURB_", "0") or 0))


# A diverged training (fastText's "Encountered NaN") is retried at half the learning rate, at
# most this many times in all: at lr 0.5 it happens now and then on small or repetitive corpora.
LR_ATTEMPTS = 5


def _train_supervised(fasttext, *, lr: float, **settings: Any) -> tuple[Any, float]:
    """`fasttext.train_supervised`, retried at half the learning rate while it diverges.
    Returns the model and the learning rate that trained it."""
    attempt_lr = lr
    for attempt in range(1, LR_ATTEMPTS + 1):
        try:
            with _zero_filled_allocations():
                return fasttext.train_supervised(lr=attempt_lr, **settings), attempt_lr
        except RuntimeError as error:
            if "nan" not in str(error).lower():
                raise
            if attempt == LR_ATTEMPTS:
                break
            log.warning(
                "fastText training diverged (NaN) at lr %g (attempt %d of %d); retrying at lr %g",
                attempt_lr,
                attempt,
                LR_ATTEMPTS,
                attempt_lr / 2,
            )
            attempt_lr /= 2
    raise TokenmillError(
        f"fastText training diverged (NaN) at every learning rate tried, from {lr:g} down to "
        f"{attempt_lr:g}; pass a smaller --lr"
    )


def train_classifier(
    positive: str | Path | list,
    negative: str | Path | list,
    output: str | Path,
    *,
    holdout: float = 0.1,
    epoch: int = 5,
    lr: float = 0.5,
    word_ngrams: int = 2,
    dim: int = 64,
    min_count: int = 1,
    bucket: int = 200_000,
    seed: int = 0,
    max_docs: int | None = None,
    lowercase: bool = True,
    threads: int = 1,
) -> dict[str, Any]:
    """Train the quality classifier; write `output` (fastText .bin) and `output` with a .json
    suffix (settings, counts, held-out accuracy). Returns that metadata."""
    if not 0 <= holdout < 1:
        raise ConfigError(f"--holdout must be in [0, 1), got {holdout}")
    fasttext = _load_fasttext()
    started = time.time()
    positive, negative = input_list(positive), input_list(negative)
    # Refused before the documents are read: an output that is not an earlier model, one
    # among the inputs, or one another process is writing.
    with claim_output(output, CLASSIFIER_OUTPUT, flag="--output", inputs=[*positive, *negative]):
        classes = {
            label: _labelled_lines(label, inputs, holdout, max_docs, seed, lowercase)
            for label, inputs in ((LABEL_HQ, positive), (LABEL_LQ, negative))
        }
        _warn_of_shared_texts(classes)
        train_lines, test_items = _split(classes, seed)

        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        # fastText trains from a file: a scratch one, gone once the model is trained
        with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as tmp:
            train_file = Path(tmp) / "train.txt"
            train_file.write_text("\n".join(train_lines) + "\n", encoding="utf-8")
            model, lr_used = _train_supervised(
                fasttext,
                input=str(train_file),
                epoch=epoch,
                lr=lr,
                wordNgrams=word_ngrams,
                dim=dim,
                minCount=min_count,
                bucket=bucket,
                seed=seed,
                thread=threads,
                verbose=0,
                loss="softmax",
            )
        metrics = _holdout_metrics(model, test_items)
        if metrics["n"] and metrics["accuracy"] <= metrics["majority_rate"]:
            log.warning(
                f"held-out accuracy {metrics['accuracy']:.4f} is not above the majority-class rate"
                f" {metrics['majority_rate']:.4f}: the classifier does no better than always answering the larger class"
            )
        metadata = {
            "model": str(output.name),
            "labels": {"positive": LABEL_HQ, "negative": LABEL_LQ},
            "positive": [str(p) for p in positive],
            "negative": [str(p) for p in negative],
            "counts": {
                "positive": len(classes[LABEL_HQ][0]),
                "negative": len(classes[LABEL_LQ][0]),
                "train": len(train_lines),
                "holdout": len(test_items),
            },
            "holdout": metrics,
            "holdout_accuracy": metrics.get("accuracy"),
            "preprocess": {"single_line": True, "lowercase": lowercase},
            "config": {
                "holdout": holdout,
                "epoch": epoch,
                "lr": lr_used,
                "lr_requested": lr,
                "word_ngrams": word_ngrams,
                "dim": dim,
                "min_count": min_count,
                "bucket": bucket,
                "seed": seed,
                "max_docs": max_docs,
                "threads": threads,
            },
            "versions": {"fasttext-numpy2": _fasttext_version()},
            "seconds": round(time.time() - started, 3),
        }
        # The metadata first: the model beside it marks a finished one, and a run killed in
        # between leaves no model without its MODEL.json (which a rerun would refuse to replace).
        atomic_write_text(metadata_path(output), json.dumps(metadata, indent=2) + "\n")
        with atomic_path(output) as tmp_model:
            model.save_model(str(tmp_model))
        return metadata


def _labelled_lines(
    label: str, inputs: list, holdout: float, max_docs: int | None, seed: int, lowercase: bool
) -> tuple[list[str], np.ndarray]:
    """fastText lines (`LABEL text`) of one class, and which of them are held out: chosen by a
    hash of the document id, so the split does not depend on file order."""
    import numpy as np

    ids, texts = _read_texts(inputs, max_docs, seed)
    if not texts:
        raise TokenmillError(f"no documents with text in {', '.join(map(str, inputs))}")
    held = np.array([_id_hash(i, seed + 1) % 1_000_000 < holdout * 1_000_000 for i in ids], dtype=bool)
    return [f"{label} {preprocess(t, lowercase)}" for t in texts], held


def _warn_of_shared_texts(classes: dict[str, tuple[list[str], np.ndarray]]) -> None:
    """Warn when positives and negatives share texts (as the classifier reads them): each
    shared one is taught as both classes, and the held-out accuracy cannot reach 1."""
    positives = [line.split(" ", 1)[1] for line in classes[LABEL_HQ][0]]
    negatives = {line.split(" ", 1)[1] for line in classes[LABEL_LQ][0]}
    shared = sum(text in negatives for text in positives)
    if shared:
        log.warning(
            f"{shared} of {len(positives)} positive documents have the same text as a negative one"
            " (after preprocessing); the classifier learns each of them as both classes"
        )


def _split(classes: dict[str, tuple[list[str], np.ndarray]], seed: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The training lines (classes interleaved) and the held-out (label, line) pairs."""
    import numpy as np

    train_lines = [line for lines, held in classes.values() for line, h in zip(lines, held) if not h]
    test_items = [(label, line) for label, (lines, held) in classes.items() for line, h in zip(lines, held) if h]
    if not train_lines:
        raise TokenmillError("no training documents left after the hold-out split")
    # fastText reads its file in order; shuffle so that the classes are interleaved
    rng = np.random.default_rng(seed)
    return [train_lines[i] for i in rng.permutation(len(train_lines))], test_items


def _holdout_metrics(model, test_items: list[tuple[str, str]]) -> dict[str, Any]:
    """Accuracy and the majority-class rate it must beat, per-class recall and mean score of the model on
    the held-out documents."""
    import numpy as np

    metrics: dict[str, Any] = {"n": len(test_items)}
    if test_items:
        scores = predict_hq(model, [line.split(" ", 1)[1] for _, line in test_items])
        truth = np.array([label == LABEL_HQ for label, _ in test_items])
        predicted = scores >= 0.5
        metrics.update(
            accuracy=float(np.mean(predicted == truth)),
            # what always answering the larger class scores: the bar the accuracy must clear
            majority_rate=float(max(truth.sum(), (~truth).sum()) / len(truth)),
            hq_recall=float(np.mean(predicted[truth])) if truth.any() else None,
            lq_recall=float(np.mean(~predicted[~truth])) if (~truth).any() else None,
            mean_score_hq=float(scores[truth].mean()) if truth.any() else None,
            mean_score_lq=float(scores[~truth].mean()) if (~truth).any() else None,
        )
    return metrics


def _fasttext_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fasttext-numpy2")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


# One loaded model per worker process, keyed by the file's fingerprint (path, size, mtime).
_MODELS: dict[tuple[str, int, str], Any] = {}


def load_model(path: str | Path):
    path = Path(path)
    if not path.exists():
        raise TokenmillError(f"quality model not found: {path}")
    key = storage.fingerprint(path)
    model = _MODELS.get(key)
    if model is None:
        model = _load_fasttext().load_model(str(path))
        labels = set(model.get_labels())
        if LABEL_HQ not in labels:
            raise TokenmillError(
                f"{path} is not a quality model: its labels are {sorted(labels)}, not {LABEL_HQ}/{LABEL_LQ}"
            )
        _MODELS.clear()
        _MODELS[key] = model
    return model


def pareto_draws(ids: list[str], alpha: float, seed: int = 0) -> np.ndarray:
    """One Lomax(alpha) draw per document id (the distribution of `np.random.pareto(alpha)`),
    a pure function of the id and `seed`."""
    import numpy as np

    hashes = np.fromiter((_id_hash(i, seed) for i in ids), dtype=np.uint64, count=len(ids))
    # the top 53 bits, mapped to (0, 1]
    uniform = ((hashes >> np.uint64(11)).astype(np.float64) + 1.0) / float(1 << 53)
    return uniform ** (-1.0 / alpha) - 1.0


@dataclass
class ClassifyStage(StageOptions):
    """Add `quality_score` (probability of high quality) and keep by threshold or Pareto rule.

    Exactly one of `threshold` and `pareto_alpha`; with neither, `threshold=0.5`."""

    model: str = option("", path=True, cli={"required": True}, help="MODEL.bin from train-classifier")
    threshold: float | None = option(None, exclusive="rule", help="keep quality_score >= T (default 0.5)")
    pareto_alpha: float | None = option(
        None,
        exclusive="rule",
        help="GPT-3's rule: keep when pareto(alpha) > 1 - quality_score (alpha 9 in GPT-3), drawn per document id",
    )
    seed: int = option(0, help="seed of the per-document Pareto draws")
    lowercase: bool | None = option(
        None,
        cli=False,
        help="lowercase the text before scoring (default: as the model was trained, from MODEL.json)",
    )

    name = "classify"

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("classify needs --model MODEL.bin (train one with `tokenmill curate train-classifier`)")
        if self.threshold is not None and self.pareto_alpha is not None:
            raise ConfigError("give either --threshold or --pareto-alpha, not both")
        if self.threshold is None and self.pareto_alpha is None:
            self.threshold = 0.5
        if self.pareto_alpha is not None and self.pareto_alpha <= 0:
            raise ConfigError(f"--pareto-alpha must be positive, got {self.pareto_alpha}")
        self.model = str(Path(self.model).resolve())
        if not Path(self.model).is_file():
            raise TokenmillError(f"quality model not found: {self.model}")
        if self.lowercase is None:
            meta = metadata_path(self.model)
            self.lowercase = True
            if meta.exists():
                self.lowercase = bool(json.loads(meta.read_text()).get("preprocess", {}).get("lowercase", True))

    def versions(self) -> dict[str, str]:
        meta = metadata_path(self.model)
        info = {"quality_model": self.model}
        if meta.exists():
            data = json.loads(meta.read_text())
            info["quality_model_holdout_accuracy"] = str(data.get("holdout_accuracy"))
        return info

    def score(self, texts: list[Any]) -> np.ndarray:
        model = load_model(self.model)
        lines = [preprocess(t, self.lowercase) if isinstance(t, str) else "" for t in texts]
        return predict_hq(model, lines)

    def process(self, docs: pd.DataFrame) -> Batch:
        import numpy as np

        scores = self.score(docs["text"].tolist())
        docs = docs.assign(quality_score=scores)
        if self.pareto_alpha is not None:
            keep = pareto_draws(docs["id"].astype(str).tolist(), self.pareto_alpha, self.seed) > 1.0 - scores
            reason = "classify.pareto"
        else:
            keep = scores >= self.threshold
            reason = "classify.below_threshold"
        stats: dict[str, int] = {}
        bins = np.minimum((scores * 10).astype(int), 9)
        for b, n in zip(*np.unique(bins, return_counts=True)):
            stats[f"quality_score.{b / 10:.1f}-{(b + 1) / 10:.1f}"] = int(n)
        return Batch(n_in=len(docs), kept=docs[keep], rejected=reject(docs[~keep], reason), stats=stats)


REASONS = {
    "classify.below_threshold": "quality_score below {threshold}",
    "classify.pareto": "GPT-3's Pareto draw (alpha {pareto_alpha}) was not above 1 - quality_score",
}


@dataclass
class TrainClassifierOptions:
    """`tokenmill curate train-classifier` and a recipe's `classifiers[].options`."""

    positive: list[str] = option(
        recipe=False, cli={"required": True, "nargs": "+"}, help="reference-quality documents (stage dirs / Parquet)"
    )
    negative: list[str] = option(
        recipe=False, cli={"required": True, "nargs": "+"}, help="raw documents (stage dirs / Parquet)"
    )
    output: str = option(
        recipe=False, cli={"required": True}, help="the model file, MODEL.bin (MODEL.json is written beside it)"
    )
    holdout: float = option(0.1, help="fraction of each class held out (default 0.1)")
    epoch: int = option(5, help="fastText training epochs (default 5)")
    lr: float = option(0.5, help="fastText learning rate (default 0.5)")
    word_ngrams: int = option(2, help="longest word n-gram used as a feature (default 2)")
    dim: int = option(64, help="size of the word vectors (default 64)")
    min_count: int = option(1, help="ignore words seen fewer times than this (default 1)")
    bucket: int = option(200_000, help="hash buckets for word n-grams (model size)")
    seed: int = option(0, help="seed of fastText and of the held-out split (default 0)")
    max_docs: int | None = option(None, help="at most this many documents per class (a hash sample)")
    threads: int = option(1, help="fastText threads (1 = reproducible)")
    lowercase: bool = option(True, flag="--keep-case", help="do not lowercase the text")


def _run_train_classifier(options: TrainClassifierOptions) -> dict[str, Any]:
    return train_classifier(**asdict(options))


def _report_train(meta: dict[str, Any], args: Any) -> None:
    counts = meta["counts"]
    accuracy = meta["holdout_accuracy"]
    log.info(
        f"train-classifier: {counts['positive']} positive, {counts['negative']} negative documents; "
        f"trained on {counts['train']}, held out {counts['holdout']} in {meta['seconds']:.1f}s -> {args.output}"
    )
    if accuracy is None:
        log.info("  held-out accuracy: n/a (--holdout 0)")
    else:
        majority = meta["holdout"]["majority_rate"]
        log.info(
            f"  held-out accuracy: {accuracy:.4f}, majority-class rate {majority:.4f}"
            f" (written to {metadata_path(args.output)})"
        )


STAGES = (
    Stage(
        "train-classifier",
        TrainClassifierOptions,
        run=_run_train_classifier,
        io="none",
        in_recipes=False,
        report=_report_train,
        help="train the fastText quality classifier (positives vs negatives); prints held-out accuracy",
        description="Train a fastText classifier that tells reference-quality documents (__label__hq) from raw ones"
        " (__label__lq), as GPT-3 and MT-NLG did. A hash-chosen fraction of each class is held out; the held-out"
        " accuracy is printed and written to MODEL.json beside the model.",
    ),
    Stage(
        "classify",
        ClassifyStage,
        help="score documents with the quality classifier; keep by --threshold or --pareto-alpha",
        description="Add quality_score (the probability of __label__hq) to every document and keep it when"
        " quality_score >= --threshold, or by GPT-3's Pareto rule with --pareto-alpha (reason classify.below_threshold"
        " or classify.pareto). The decision for a document depends only on its id, text and --seed.",
    ),
)
