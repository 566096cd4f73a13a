"""Language identification with fastText (lid.176 by default).

The official lid.176 model (938 KB, CC BY-SA 3.0, see `models/NOTICE.md`) ships inside
tokenmill, so nothing is ever downloaded and no second fastText build competes with the one
the quality classifier trains with. `--model PATH` takes any fastText language model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import TokenmillError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# fastText looks at the start of a document; longer texts cost time and change nothing.
MAX_CHARS = 2_000

_MODELS: dict[str, object] = {}


def default_model_path() -> Path:
    path = Path(__file__).with_name("models") / "lid.176.ftz"
    if not path.exists():
        raise TokenmillError(
            f"the bundled language model is missing ({path}); reinstall tokenmill or pass --model PATH"
        )
    return path


def load_fasttext(path: str | Path):
    """Load a fastText model once per process (workers cache it; it is never pickled)."""
    key = os.fspath(path)
    if key not in _MODELS:
        if not Path(key).exists():
            raise TokenmillError(f"fastText model not found: {key}")
        import fasttext

        try:
            _MODELS[key] = fasttext.load_model(key)
        except ValueError as error:
            raise TokenmillError(f"cannot load fastText model {key}: {error}") from None
    return _MODELS[key]


def predict(model, texts: list[str], k: int = 1) -> tuple[list[str], np.ndarray]:
    """Top label (without `__label__`) and its probability for each text."""
    import numpy as np

    lines = [" ".join(text[:MAX_CHARS].split()) for text in texts]
    labels, probabilities = model.predict(lines, k=k)
    top_labels = [(label[0] if len(label) else "__label__unknown").removeprefix("__label__") for label in labels]
    top_scores = np.array([float(p[0]) if len(p) else 0.0 for p in probabilities], dtype=np.float32)
    return top_labels, top_scores


REASONS = {
    "langid.language": "its language is not one of {languages}",
    "langid.low_score": "the most likely language has a probability below {min_score}",
}


@dataclass
class LangIdStage(StageOptions):
    """Adds `lang` and `lang_score`; keeps `languages` (all when empty) scored >= `min_score`."""

    languages: list[str] = option(
        default_factory=lambda: ["en"],
        cli={"default": "en"},
        parse=lambda value: parse_languages(value),
        help="comma-separated ISO codes to keep; 'all' keeps any (default: en)",
    )
    min_score: float = option(0.65, help="minimum probability of the top language (default 0.65)")
    model: str | None = option(None, path=True, help="fastText language model (default: the bundled lid.176)")

    name = "langid"

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 1.0:
            raise TokenmillError(f"--min-score must lie in [0, 1], got {self.min_score}")
        self.model = str(self.model) if self.model else str(default_model_path())
        if not Path(self.model).exists():
            raise TokenmillError(f"fastText model not found: {self.model}")

    def versions(self) -> dict[str, str]:
        return {"langid_model": Path(self.model).name}

    def process(self, docs: pd.DataFrame) -> Batch:
        import numpy as np

        labels, scores = predict(load_fasttext(self.model), docs["text"].tolist())
        docs = docs.assign(lang=labels, lang_score=scores)
        low_score = docs["lang_score"].to_numpy() < self.min_score
        wrong_language = ~docs["lang"].isin(self.languages).to_numpy() if self.languages else np.zeros(len(docs), bool)
        # A document in another language is rejected as such even when the score is low too.
        reasons = np.where(wrong_language, "langid.language", np.where(low_score, "langid.low_score", ""))
        rejected_mask = reasons != ""
        stats = {f"lang.{lang}": int(n) for lang, n in docs["lang"].value_counts().items()}
        return Batch(
            n_in=len(docs),
            kept=docs[~rejected_mask],
            rejected=reject(docs[rejected_mask], reasons[rejected_mask]),
            stats=stats,
        )


def parse_languages(value: str) -> list[str]:
    """`en,de` -> ["en", "de"]; `all` -> [] (any language)."""
    return [] if value.strip() == "all" else [x.strip() for x in value.split(",") if x.strip()]


STAGES = (
    Stage(
        "langid",
        LangIdStage,
        help="identify the language (fastText lid.176) and keep chosen languages",
        description="Identify each document's language with fastText (the bundled lid.176 model), add lang and"
        " lang_score, and reject documents in other languages (langid.language) or identified with a low"
        " score (langid.low_score).",
    ),
)
