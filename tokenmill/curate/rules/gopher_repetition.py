"""Gopher repetition rules (Rae et al. 2021, table A1), with datatrove's definitions:
paragraphs split at 2+ newlines, lines at 1+ newlines; fractions of characters are over the
whole text; a top n-gram's share is len(" ".join(gram)) * count; duplicated n-grams are
counted greedily left to right (an n-gram seen before adds its characters, joined without
spaces, and the scan jumps past it). Two n-grams are equal when their words are equal
(datatrove compares the words joined without spaces, which also equates rare different splits
such as `ab|c` and `a|bc`). The n-gram work is done in NumPy, one level of n at a time, and
stops at the first rule that fires."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from itertools import count
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


class NgramLevels:
    """n-gram statistics of a word list, level by level (n = 2, 3, ...), in NumPy.

    Words get integer ids (the index of their first occurrence); the n-gram starting at i gets
    the code of the (n-1)-gram at i combined with the id of word i+n-1, renumbered as the
    position of its first occurrence. Two n-grams are the same when their words are the same."""

    def __init__(self, words: list[str]):
        import numpy as np  # loaded by a run: the filter's parser imports this module

        self.n_words = len(words)
        vocab: dict[str, int] = {}
        self.ids = np.fromiter(map(vocab.setdefault, words, count()), dtype=np.int64, count=self.n_words)
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=self.n_words)
        self.cumulative = np.concatenate(([0], np.cumsum(lengths)))
        self.n = 1
        self.codes = self.ids
        self.counts = None

    def advance(self) -> bool:
        """Move to the next n; False when there are fewer than n words."""
        import numpy as np

        n = self.n + 1
        m = self.n_words - n + 1
        if m <= 0:
            return False
        key = self.codes[:m] * (self.n_words + 1) + self.ids[n - 1 : n - 1 + m]
        # code of an n-gram = position of its first occurrence (a dict keeps the first)
        first: dict[int, int] = {}
        self.codes = np.fromiter(map(first.setdefault, key.tolist(), count()), dtype=np.int64, count=m)
        self.counts = np.bincount(self.codes, minlength=m)
        self.n = n
        return True

    def chars(self, start: int) -> int:
        """Characters of the current n-gram at `start`, its words joined without spaces."""
        return int(self.cumulative[start + self.n] - self.cumulative[start])

    def top_chars(self) -> int:
        """len(" ".join(gram)) * count for the most frequent n-gram (earliest first on a tie)."""
        top = self.counts.max()
        start = int((self.counts == top).argmax())
        return (self.chars(start) + self.n - 1) * int(top)

    def has_repeats(self) -> bool:
        return bool(self.counts.max() > 1)

    def duplicated_chars(self) -> int:
        """Characters in n-grams equal to an earlier visited one, scanning left to right and
        jumping n words past each repeat (positions jumped over are not visited)."""
        if not self.has_repeats():
            return 0
        n = self.n
        # only positions whose n-gram occurs more than once can branch; between them every
        # position is visited one by one
        events = (self.counts[self.codes] > 1).nonzero()[0]
        grams = self.codes[events].tolist()
        lengths = (self.cumulative[events + n] - self.cumulative[events]).tolist()
        seen: set[int] = set()
        repeated = 0
        next_visit = 0
        for position, gram, length in zip(events.tolist(), grams, lengths):
            if position < next_visit:
                continue
            if gram in seen:
                repeated += length
                next_visit = position + n
            else:
                seen.add(gram)
                next_visit = position + 1
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
    EXPLAIN: ClassVar[dict[str, str]] = {
        "dup_para_frac": "more than {max_dup_para_frac:.0%} of the paragraphs repeat an earlier paragraph",
        "dup_para_char_frac": "repeated paragraphs hold more than {max_dup_para_char_frac:.0%} of the characters",
        "dup_line_frac": "more than {max_dup_line_frac:.0%} of the lines repeat an earlier line",
        "dup_line_char_frac": "repeated lines hold more than {max_dup_line_char_frac:.0%} of the characters",
        **{
            f"top_{n}_gram": f"the most frequent {n}-word sequence covers more than {{max_top_{n}_gram:.0%}} of the characters"
            f" in words"
            for n in TOP_NGRAMS
        },
        **{
            f"dup_{n}_gram": f"{n}-word sequences that occur more than once cover more than {{max_dup_{n}_gram:.0%}} of the"
            f" characters in words"
            for n in DUP_NGRAMS
        },
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
        top_limits = [getattr(self, f"max_top_{n}_gram") for n in TOP_NGRAMS]
        dup_limits = [getattr(self, f"max_dup_{n}_gram") for n in DUP_NGRAMS]
        if all(limit is None for limit in (*top_limits, *dup_limits)):
            return None
        last = max(n for n, limit in zip((*TOP_NGRAMS, *DUP_NGRAMS), (*top_limits, *dup_limits)) if limit is not None)
        levels = NgramLevels(doc.words)
        while levels.n < last and levels.advance():
            n = levels.n
            if n in TOP_NGRAMS:
                limit = top_limits[n - TOP_NGRAMS[0]]
                if limit is not None and levels.top_chars() / n_chars > limit:
                    return f"gopher_repetition.top_{n}_gram"
            else:
                if not levels.has_repeats():
                    # no repeated n-gram: none for any larger n either
                    break
                limit = dup_limits[n - DUP_NGRAMS[0]]
                if limit is not None and levels.duplicated_chars() / n_chars > limit:
                    return f"gopher_repetition.dup_{n}_gram"
        return None
