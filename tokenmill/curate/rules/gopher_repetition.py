"""Gopher repetition rules (Rae et al. 2021, table A1), with datatrove's definitions:
paragraphs split at 2+ newlines, lines at 1+ newlines; fractions of characters are over the
whole text; a top n-gram's share is len(" ".join(gram)) * count; duplicated n-grams are
counted greedily left to right (an n-gram seen before adds its characters, joined without
spaces, and the scan jumps past it)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from tokenmill.curate.rules.base import Doc, RuleFamily

_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")

TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)


def duplicates(items: list[str]) -> tuple[int, int]:
    """(number of items equal to an earlier one, characters in those items)."""
    unique = set(items)
    return len(items) - len(unique), sum(map(len, items)) - sum(map(len, unique))


def top_ngram_chars(words: list[str], n: int) -> int:
    """Characters covered by the most frequent n-gram: len(" ".join(gram)) * count (the first
    one seen wins a tie)."""
    if len(words) < n:
        return 0
    gram, count = Counter(zip(*(words[i:] for i in range(n)))).most_common(1)[0]
    return (sum(map(len, gram)) + n - 1) * count


def duplicated_ngram_chars(words: list[str], n: int) -> int:
    """Characters (n-grams joined without spaces) in n-grams that repeat an earlier one,
    scanning left to right and jumping past each repeat."""
    if len(words) < n:
        return 0
    grams = list(map("".join, zip(*(words[i:] for i in range(n)))))
    if len(set(grams)) == len(grams):  # the common case: nothing repeats
        return 0
    seen: set[str] = set()
    repeated = 0
    index = 0
    end = len(grams)
    while index < end:
        gram = grams[index]
        if gram in seen:
            repeated += len(gram)
            index += n
        else:
            seen.add(gram)
            index += 1
    return repeated


@dataclass
class GopherRepetition(RuleFamily):
    max_dup_para_frac: float | None = 0.30
    max_dup_para_char_frac: float | None = 0.20
    max_dup_line_frac: float | None = 0.30
    max_dup_line_char_frac: float | None = 0.20
    max_top_2_gram: float | None = 0.20
    max_top_3_gram: float | None = 0.18
    max_top_4_gram: float | None = 0.16
    max_dup_5_gram: float | None = 0.15
    max_dup_6_gram: float | None = 0.14
    max_dup_7_gram: float | None = 0.13
    max_dup_8_gram: float | None = 0.12
    max_dup_9_gram: float | None = 0.11
    max_dup_10_gram: float | None = 0.10

    name: ClassVar[str] = "gopher_repetition"
    RULES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dup_para_frac": ("max_dup_para_frac",),
        "dup_para_char_frac": ("max_dup_para_char_frac",),
        "dup_line_frac": ("max_dup_line_frac",),
        "dup_line_char_frac": ("max_dup_line_char_frac",),
        **{f"top_{n}_gram": (f"max_top_{n}_gram",) for n in TOP_NGRAMS},
        **{f"dup_{n}_gram": (f"max_dup_{n}_gram",) for n in DUP_NGRAMS},
    }

    def apply(self, doc: Doc, stats: Counter) -> tuple[Doc, str | None]:
        return doc, self.check(doc)

    def check(self, doc: Doc) -> str | None:
        text = doc.text
        if not text:
            return "gopher_repetition.empty"
        n_chars = len(text)
        if self.max_dup_para_frac is not None or self.max_dup_para_char_frac is not None:
            paragraphs = _PARAGRAPHS.split(text.strip())
            n_dup, dup_chars = duplicates(paragraphs)
            if self.max_dup_para_frac is not None and n_dup / len(paragraphs) > self.max_dup_para_frac:
                return "gopher_repetition.dup_para_frac"
            if self.max_dup_para_char_frac is not None and dup_chars / n_chars > self.max_dup_para_char_frac:
                return "gopher_repetition.dup_para_char_frac"
        if self.max_dup_line_frac is not None or self.max_dup_line_char_frac is not None:
            lines = _LINES.split(text)
            n_dup, dup_chars = duplicates(lines)
            if self.max_dup_line_frac is not None and n_dup / len(lines) > self.max_dup_line_frac:
                return "gopher_repetition.dup_line_frac"
            if self.max_dup_line_char_frac is not None and dup_chars / n_chars > self.max_dup_line_char_frac:
                return "gopher_repetition.dup_line_char_frac"
        words = doc.words
        for n in TOP_NGRAMS:
            limit = getattr(self, f"max_top_{n}_gram")
            if limit is not None and top_ngram_chars(words, n) / n_chars > limit:
                return f"gopher_repetition.top_{n}_gram"
        for n in DUP_NGRAMS:
            limit = getattr(self, f"max_dup_{n}_gram")
            if limit is not None and duplicated_ngram_chars(words, n) / n_chars > limit:
                return f"gopher_repetition.dup_{n}_gram"
        return None
