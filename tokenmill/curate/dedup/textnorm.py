"""Compiled (numba) text normalization over a batch's UTF-8 bytes: punctuation or whitespace runs
to single spaces, ends stripped, word or character shingles chosen per document.

Why compiled: `TextNormalization.apply` runs two regular expressions per document in Python,
which took most of the time of fast MinHash (its hashing is a few ns per byte). Here Python
only lower-cases (`str.lower`, C speed) and encodes; the kernel decodes code points and looks
each one up in a per-process class table. The table is filled lazily from the same regular
expressions `apply` uses (`shingles.code_point_classes`), so the two agree by construction.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Shingle kinds, per document (the compiled kernels branch on them).
WORD = 0
CHAR = 1

# Class bits of a code point; UNKNOWN marks a code point not classified yet.
IS_WORD = 1  # matched by \w
IS_SPACE = 2  # matched by \s
IS_NO_SPACE_SCRIPT = 4  # CJK, kana, Thai, ... (scripts written without spaces)
UNKNOWN = 255
N_CODE_POINTS = 0x110000

# ShingleConfig.mode as an integer for the kernel.
MODE_CODES = {"auto": 0, "word": 1, "char": 2}


@njit(cache=True, inline="always")
def _decode(buf, p):
    """(code point, byte length) of the UTF-8 sequence at p (well-formed: Python encoded it)."""
    b0 = np.int64(buf[p])
    if b0 < 0x80:
        return b0, 1
    if b0 < 0xE0:
        return ((b0 & 0x1F) << 6) | (np.int64(buf[p + 1]) & 0x3F), 2
    if b0 < 0xF0:
        return ((b0 & 0x0F) << 12) | ((np.int64(buf[p + 1]) & 0x3F) << 6) | (np.int64(buf[p + 2]) & 0x3F), 3
    return (
        ((b0 & 0x07) << 18)
        | ((np.int64(buf[p + 1]) & 0x3F) << 12)
        | ((np.int64(buf[p + 2]) & 0x3F) << 6)
        | (np.int64(buf[p + 3]) & 0x3F)
    ), 4


@njit(cache=True)
def unknown_code_points(buf, classes):
    """The distinct code points of buf whose class is still UNKNOWN (int64, ascending order of
    first appearance). Reads `classes` only, so concurrent batches never see a half-filled entry."""
    seen = np.zeros(N_CODE_POINTS, dtype=np.uint8)
    size = buf.shape[0]
    # Sized for the worst case up front (np.empty touches no page): growing it in the loop made
    # numba count references on every iteration, 10x slower.
    found = np.empty(min(size, N_CODE_POINTS), dtype=np.int64)
    n = 0
    p = 0
    while p < size:
        if buf[p] < 0x80:  # ASCII is classified when the table is made
            p += 1
            continue
        cp, length = _decode(buf, p)
        p += length
        if classes[cp] == UNKNOWN and seen[cp] == 0:
            seen[cp] = 1
            found[n] = cp
            n += 1
    return found[:n]


@njit(cache=True)
def _normalize_document(buf, start, end, classes, strip_punctuation, out, o):
    """Writes the normalized bytes of buf[start:end] at out[o:]; returns (new o, code points
    written excluding spaces, of which in no-space scripts)."""
    pending = False
    n_chars = 0
    n_no_space = 0
    p = start
    while p < end:
        cp, length = _decode(buf, p)
        cls = classes[cp]
        # A separator is a non-word character (punctuation stripped) or whitespace (only
        # collapsed); a run of them becomes one space, none at the ends (strip()).
        is_separator = (cls & IS_WORD) == 0 if strip_punctuation else (cls & IS_SPACE) != 0
        if is_separator:
            pending = n_chars > 0
        else:
            if pending:
                out[o] = 32
                o += 1
                pending = False
            for k in range(length):
                out[o + k] = buf[p + k]
            o += length
            n_chars += 1
            if cls & IS_NO_SPACE_SCRIPT:
                n_no_space += 1
        p += length
    return o, n_chars, n_no_space


@njit(cache=True)
def normalize_batch(buf, offsets, classes, strip_punctuation, mode, no_space_fraction):
    """Normalized UTF-8 of every document (uint8, offsets int64[n + 1]) and its shingle kind
    (int8[n]): `shingles.uses_chars`'s rule, and a CHAR document loses its spaces."""
    n_docs = offsets.shape[0] - 1
    out = np.empty(max(1, offsets[n_docs] - offsets[0]), dtype=np.uint8)
    out_offsets = np.zeros(n_docs + 1, dtype=np.int64)
    kinds = np.empty(n_docs, dtype=np.int8)
    o = 0
    for d in range(n_docs):
        begin = o
        o, n_chars, n_no_space = _normalize_document(
            buf, offsets[d], offsets[d + 1], classes, strip_punctuation, out, o
        )
        if mode == 0:
            # `n_chars` excludes the spaces: len(normalized) - normalized.count(" ").
            chars = n_no_space > 0 and n_no_space >= no_space_fraction * n_chars
        else:
            chars = mode == 2
        kinds[d] = CHAR if chars else WORD
        if chars:
            q = begin
            for p in range(begin, o):
                if out[p] != 32:
                    out[q] = out[p]
                    q += 1
            o = q
        out_offsets[d + 1] = o
    return out, out_offsets, kinds
