"""Text normalization and shingling shared by exact dedup, fuzzy dedup and decontamination.

A document is normalized once (lower-casing, punctuation to spaces, whitespace collapsed to
single spaces: `TextNormalization.apply` in Python, the reference, and `textnorm`'s compiled
kernel for batches), then the compiled kernels in `hashing` cut shingles out of the UTF-8 bytes
without creating a Python object per shingle. With whitespace collapsed, the
bytes of a word n-gram are exactly `" ".join(words[i:i+n])`, which is what a datasketch user
would feed to `MinHash.update_batch`.

Text without spaces between words (Chinese, Japanese, Thai, ...) has no useful word n-grams:
such documents are shingled by character n-grams of the text with whitespace removed, chosen
per document (`shingle="auto"`) or for every document (`"word"` / `"char"`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tokenmill.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

# Shingle kinds, per document (the compiled kernels branch on them); the values live in
# `textnorm` (compiled, loaded lazily) and are repeated here for numba-free importers.
WORD = 0
CHAR = 1

# Punctuation and symbols (anything that is neither a word character nor whitespace).
_PUNCT = re.compile(r"[^\w\s]+")
_WS = re.compile(r"\s+")
# Runs of non-word characters: punctuation to spaces and whitespace collapsed in one pass
# (same result as _PUNCT then _WS). Batches are normalized by `textnorm`'s kernel, whose code
# point classes come from these same expressions.
_NON_WORD = re.compile(r"[^\w]+")


@functools.cache
def _no_space_script() -> re.Pattern[str]:
    """Scripts written without spaces between words: CJK ideographs, kana, Thai, Lao, Myanmar,
    Khmer. Compiled on first use: its ranges take milliseconds to compile, and the command line
    imports this module to build dedup's parser."""
    return re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]")


ShingleMode = Literal["auto", "word", "char"]


@dataclass(frozen=True)
class TextNormalization:
    """How text is normalized before hashing. Whitespace is always collapsed."""

    lowercase: bool = True
    strip_punctuation: bool = True
    unicode_nfkc: bool = False

    def apply(self, text: str) -> str:
        if self.unicode_nfkc:
            text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.strip_punctuation:
            return _NON_WORD.sub(" ", text).strip()
        return _WS.sub(" ", text).strip()


def parse_normalization(spec: str) -> TextNormalization:
    """`--normalize`: comma list of lower, punct, nfkc; `none` or `whitespace` for neither
    (whitespace is always collapsed)."""
    items = {s.strip() for s in spec.split(",") if s.strip()}
    unknown = items - {"lower", "punct", "nfkc", "none", "whitespace"}
    if unknown:
        raise ConfigError(f"unknown --normalize item(s) {', '.join(sorted(unknown))}; use lower, punct, nfkc or none")
    return TextNormalization(
        lowercase="lower" in items, strip_punctuation="punct" in items, unicode_nfkc="nfkc" in items
    )


@dataclass(frozen=True)
class ShingleConfig:
    """Word n-grams (default 5) or character n-grams (for text without spaces)."""

    ngram: int = 5
    char_ngram: int = 5
    mode: ShingleMode = "auto"
    # In "auto", a document is shingled by characters when at least this fraction of its
    # non-space characters belong to scripts written without spaces.
    no_space_fraction: float = 0.3
    normalization: TextNormalization = TextNormalization()

    def __post_init__(self) -> None:
        if self.ngram < 1 or self.char_ngram < 1:
            raise ConfigError(f"n-gram sizes must be >= 1 (got ngram={self.ngram}, char_ngram={self.char_ngram})")
        if self.mode not in ("auto", "word", "char"):
            raise ConfigError(f"shingle mode must be auto, word or char, not {self.mode!r}")


def uses_chars(normalized: str, config: ShingleConfig) -> bool:
    if config.mode != "auto":
        return config.mode == "char"
    if not normalized:
        return False
    n_no_space = len(_no_space_script().findall(normalized))
    if n_no_space == 0:
        return False
    return n_no_space >= config.no_space_fraction * (len(normalized) - normalized.count(" "))


@dataclass
class EncodedBatch:
    """A batch of normalized documents as one UTF-8 buffer for the kernels."""

    buf: np.ndarray  # uint8
    offsets: np.ndarray  # int64[n_docs + 1]
    kinds: np.ndarray  # int8[n_docs], WORD or CHAR

    @property
    def n_docs(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def texts(self) -> list[str]:
        """The normalized texts (CHAR documents without spaces), decoded on demand."""
        data = self.buf.tobytes()
        return [data[self.offsets[i] : self.offsets[i + 1]].decode("utf-8") for i in range(self.n_docs)]


@functools.cache
def code_point_classes() -> np.ndarray:
    """uint8 class bits per code point (textnorm.IS_WORD, IS_SPACE, IS_NO_SPACE_SCRIPT), filled
    lazily by `classify_code_points` as batches meet new code points; ASCII up front."""
    import numpy as np

    from tokenmill.curate.dedup import textnorm

    classes = np.full(textnorm.N_CODE_POINTS, textnorm.UNKNOWN, dtype=np.uint8)
    classify_code_points(classes, np.arange(128))
    return classes


def classify_code_points(classes: np.ndarray, code_points: np.ndarray) -> None:
    """Classes from the very regular expressions `TextNormalization.apply` and `uses_chars` use."""
    import numpy as np

    from tokenmill.curate.dedup import textnorm

    no_space = _no_space_script()
    values = np.empty(len(code_points), dtype=np.uint8)
    for i, cp in enumerate(code_points.tolist()):
        c = chr(cp)
        values[i] = (
            (0 if _NON_WORD.match(c) else textnorm.IS_WORD)
            | (textnorm.IS_SPACE if _WS.match(c) else 0)
            | (textnorm.IS_NO_SPACE_SCRIPT if no_space.match(c) else 0)
        )
    # Thread-safe without a lock: an entry goes from UNKNOWN to its final value in one byte
    # write, and a batch that finds it UNKNOWN classifies it itself before normalizing.
    classes[code_points] = values


def encode_batch(texts, config: ShingleConfig) -> EncodedBatch:
    """Normalize and encode a batch: NFKC and lower-casing by Python's str methods, the rest
    (punctuation, whitespace, word or character shingles) by the compiled kernel."""
    import numpy as np

    from tokenmill.curate.dedup import textnorm

    norm = config.normalization
    encoded = []
    for text in texts:
        t = text if isinstance(text, str) else ""
        if norm.unicode_nfkc:
            t = unicodedata.normalize("NFKC", t)
        if norm.lowercase:
            t = t.lower()
        encoded.append(t.encode("utf-8"))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    raw = np.frombuffer(b"".join(encoded), dtype=np.uint8) if encoded else np.zeros(0, np.uint8)
    classes = code_point_classes()
    missing = textnorm.unknown_code_points(raw, classes)
    if missing.size:
        classify_code_points(classes, missing)
    buf, out_offsets, kinds = textnorm.normalize_batch(
        raw, offsets, classes, norm.strip_punctuation, textnorm.MODE_CODES[config.mode], config.no_space_fraction
    )
    # numba wants a non-empty array to index safely; normalize_batch never returns an empty one.
    return EncodedBatch(buf=buf, offsets=out_offsets, kinds=kinds)


def python_shingles(text: str, config: ShingleConfig) -> list[str]:
    """The shingles of one document in plain Python: the reference the kernels are tested
    against, and what a datasketch user would hash."""
    t = config.normalization.apply(text)
    if uses_chars(t, config):
        t = t.replace(" ", "")
        if not t:
            return []
        n = config.char_ngram
        return [t] if len(t) < n else [t[i : i + n] for i in range(len(t) - n + 1)]
    words = t.split(" ") if t else []
    n = config.ngram
    if not words:
        return []
    if len(words) < n:
        return [" ".join(words)]
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
