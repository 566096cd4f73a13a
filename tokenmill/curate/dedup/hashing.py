"""Compiled hash kernels (numba): SHA-1 and XXH64 over byte spans, shingle spans of normalized
text, and MinHash min-reduction.

Why compiled: datasketch hashes each shingle with `hashlib.sha1` from Python and applies the
permutations with NumPy uint64 `%`, which is a slow division. Here a document batch is one
UTF-8 buffer; the kernel finds the shingle spans, hashes each span in place (no Python object
per shingle) and reduces `(a*h + b) mod (2**61 - 1)` with the Mersenne-prime identity
`x mod P = (x & P) + (x >> 61)` (one conditional subtraction), which is exact for every uint64
`x` and therefore bit-identical to NumPy's `%` after the same uint64 wrap-around.

All arithmetic is on uint64 so that numba wraps modulo 2**64 as NumPy does; literal constants
are typed uint64 to keep numba from promoting to float.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tokenmill.curate.dedup.shingles import WORD  # shingle kinds, constants in the kernels

U64 = np.uint64
MASK32 = U64(0xFFFFFFFF)
MERSENNE_61 = U64((1 << 61) - 1)
MAX_HASH_32 = U64((1 << 32) - 1)

# Signature schemes (see minhash.py).
LEGACY = 0  # datasketch 1.x, and 2.x with scheme="legacy": SHA-1, (a*h+b) mod 2**61-1, & 2**32-1
AFFINE32 = 1  # datasketch 2.x default: SHA-1, MurmurHash3 fmix32, (a*h+b) mod 2**32
FAST = 2  # XXH64 + multiply-shift; not datasketch-compatible

_PRIME64_1 = U64(0x9E3779B185EBCA87)
_PRIME64_2 = U64(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = U64(0x165667B19E3779F9)
_PRIME64_4 = U64(0x85EBCA77C2B2AE63)
_PRIME64_5 = U64(0x27D4EB2F165667C5)


@njit(cache=True, inline="always")
def _rotl32(x, n):
    return ((x << U64(n)) | (x >> U64(32 - n))) & MASK32


@njit(cache=True, inline="always")
def _rotl64(x, n):
    return (x << U64(n)) | (x >> U64(64 - n))


@njit(cache=True, inline="always")
def _sha1_compress(w, h0, h1, h2, h3, h4):
    """One SHA-1 block whose 16 big-endian words are in w[0:16] (w: uint64[80] scratch, 32-bit
    values); returns the new state. The schedule lives in a scratch array the caller owns (no
    allocation per block)."""
    for t in range(16, 80):
        w[t] = _rotl32(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1)
    a = h0
    b = h1
    c = h2
    d = h3
    e = h4
    for group in range(4):
        for t in range(20 * group, 20 * group + 20):
            # The round function of rounds 0-19, 20-39, 40-59, 60-79; branches that depend on
            # the outer loop's counter only, which LLVM predicts (or unswitches) well.
            if group == 0:
                f = (d ^ (b & (c ^ d))) + U64(0x5A827999)
            elif group == 2:
                f = ((b & c) | (d & (b | c))) + U64(0x8F1BBCDC)
            else:
                f = (b ^ c ^ d) + (U64(0x6ED9EBA1) if group == 1 else U64(0xCA62C1D6))
            temp = (_rotl32(a, 5) + f + e + w[t]) & MASK32
            e = d
            d = c
            c = _rotl32(b, 30)
            b = a
            a = temp
    return (h0 + a) & MASK32, (h1 + b) & MASK32, (h2 + c) & MASK32, (h3 + d) & MASK32, (h4 + e) & MASK32


@njit(cache=True, inline="always")
def _padded_byte(buf, pos, rest, i):
    """Byte i of the last message block(s): data, then 0x80, then zeros (length added apart)."""
    if i < rest:
        return U64(buf[pos + i])
    return U64(0x80) if i == rest else U64(0)


@njit(cache=True)
def sha1_first4_le(buf, start, end, w):
    """datasketch's base hash: the first 4 bytes of SHA-1(buf[start:end]) read little-endian.

    `w` (uint64[80]) is scratch reused across calls. Words are read from `buf` in place; only
    the padded tail is assembled byte by byte."""
    h0 = U64(0x67452301)
    h1 = U64(0xEFCDAB89)
    h2 = U64(0x98BADCFE)
    h3 = U64(0x10325476)
    h4 = U64(0xC3D2E1F0)
    pos = start
    while end - pos >= 64:
        for t in range(16):
            p = pos + 4 * t
            w[t] = (
                (U64(buf[p]) << U64(24)) | (U64(buf[p + 1]) << U64(16)) | (U64(buf[p + 2]) << U64(8)) | U64(buf[p + 3])
            )
        h0, h1, h2, h3, h4 = _sha1_compress(w, h0, h1, h2, h3, h4)
        pos += 64
    rest = end - pos
    # rest + 1 (0x80) + 8 (length) bytes need a second block when rest >= 56.
    n_tail = 2 if rest >= 56 else 1
    bits = U64(end - start) * U64(8)
    for blk in range(n_tail):
        base = blk * 64
        for t in range(16):
            i = base + 4 * t
            if i + 4 <= rest:
                p = pos + i
                w[t] = (
                    (U64(buf[p]) << U64(24))
                    | (U64(buf[p + 1]) << U64(16))
                    | (U64(buf[p + 2]) << U64(8))
                    | U64(buf[p + 3])
                )
            else:
                w[t] = (
                    (_padded_byte(buf, pos, rest, i) << U64(24))
                    | (_padded_byte(buf, pos, rest, i + 1) << U64(16))
                    | (_padded_byte(buf, pos, rest, i + 2) << U64(8))
                    | _padded_byte(buf, pos, rest, i + 3)
                )
        if blk == n_tail - 1:
            w[14] = bits >> U64(32)
            w[15] = bits & MASK32
        h0, h1, h2, h3, h4 = _sha1_compress(w, h0, h1, h2, h3, h4)
    # Digest byte 0..3 are h0 big-endian; read them little-endian = byte-swap.
    return (
        ((h0 & U64(0xFF)) << U64(24))
        | ((h0 & U64(0xFF00)) << U64(8))
        | ((h0 >> U64(8)) & U64(0xFF00))
        | (h0 >> U64(24))
    )


@njit(cache=True, inline="always")
def _read64(buf, p):
    v = U64(0)
    for i in range(8):
        v |= U64(buf[p + i]) << U64(8 * i)
    return v


@njit(cache=True, inline="always")
def _read32(buf, p):
    v = U64(0)
    for i in range(4):
        v |= U64(buf[p + i]) << U64(8 * i)
    return v


@njit(cache=True, inline="always")
def _xxh_round(acc, lane):
    acc = acc + lane * _PRIME64_2
    acc = _rotl64(acc, 31)
    return acc * _PRIME64_1


@njit(cache=True, inline="always")
def _xxh_merge(acc, val):
    acc = acc ^ _xxh_round(U64(0), val)
    return acc * _PRIME64_1 + _PRIME64_4


@njit(cache=True)
def xxh64(buf, start, end, seed):
    """XXH64 of buf[start:end] (equal to `xxhash.xxh64_intdigest(bytes, seed)`)."""
    length = end - start
    p = start
    if length >= 32:
        v1 = seed + _PRIME64_1 + _PRIME64_2
        v2 = seed + _PRIME64_2
        v3 = seed
        v4 = seed - _PRIME64_1
        limit = end - 32
        while p <= limit:
            v1 = _xxh_round(v1, _read64(buf, p))
            v2 = _xxh_round(v2, _read64(buf, p + 8))
            v3 = _xxh_round(v3, _read64(buf, p + 16))
            v4 = _xxh_round(v4, _read64(buf, p + 24))
            p += 32
        acc = _rotl64(v1, 1) + _rotl64(v2, 7) + _rotl64(v3, 12) + _rotl64(v4, 18)
        acc = _xxh_merge(acc, v1)
        acc = _xxh_merge(acc, v2)
        acc = _xxh_merge(acc, v3)
        acc = _xxh_merge(acc, v4)
    else:
        acc = seed + _PRIME64_5
    acc = acc + U64(length)
    while p + 8 <= end:
        acc = acc ^ _xxh_round(U64(0), _read64(buf, p))
        acc = _rotl64(acc, 27) * _PRIME64_1 + _PRIME64_4
        p += 8
    if p + 4 <= end:
        acc = acc ^ (_read32(buf, p) * _PRIME64_1)
        acc = _rotl64(acc, 23) * _PRIME64_2 + _PRIME64_3
        p += 4
    while p < end:
        acc = acc ^ (U64(buf[p]) * _PRIME64_5)
        acc = _rotl64(acc, 11) * _PRIME64_1
        p += 1
    acc = acc ^ (acc >> U64(33))
    acc = acc * _PRIME64_2
    acc = acc ^ (acc >> U64(29))
    acc = acc * _PRIME64_3
    acc = acc ^ (acc >> U64(32))
    return acc


@njit(cache=True)
def shingle_spans(buf, start, end, kind, n, starts_out, ends_out):
    """Byte spans of the shingles of one normalized document buf[start:end].

    WORD: the text is words separated by single spaces; a shingle is n consecutive words with
    their separating spaces, i.e. exactly `" ".join(words[i:i+n])`. CHAR: the text has no
    whitespace; a shingle is n consecutive code points. A document shorter than n units is one
    shingle (itself); an empty document has none. Returns the number of spans written."""
    if end <= start:
        return 0
    m = 0
    if kind == WORD:
        # Word starts: position 0 and after each space.
        nw = 0
        ws = starts_out  # reuse as scratch for word starts, ends_out for word ends
        we = ends_out
        s = start
        for i in range(start, end):
            if buf[i] == 32:
                ws[nw] = s
                we[nw] = i
                nw += 1
                s = i + 1
        ws[nw] = s
        we[nw] = end
        nw += 1
        if nw < n:
            starts_out[0] = start
            ends_out[0] = end
            return 1
        # In place: span i = [ws[i], we[i+n-1]); reading index >= writing index, so safe.
        m = nw - n + 1
        for i in range(m):
            starts_out[i] = ws[i]
            ends_out[i] = we[i + n - 1]
        return m
    # CHAR: code point starts are bytes that are not UTF-8 continuation bytes.
    nc = 0
    for i in range(start, end):
        if (buf[i] & 0xC0) != 0x80:
            starts_out[nc] = i
            nc += 1
    if nc < n:
        starts_out[0] = start
        ends_out[0] = end
        return 1
    m = nc - n + 1
    for i in range(m):
        ends_out[i] = starts_out[i + n] if i + n < nc else end
    return m


@njit(cache=True, inline="always")
def _fmix32(h):
    """MurmurHash3's fmix32 finalizer, in 32 bits (datasketch 2.x's affine32 scheme)."""
    h ^= h >> U64(16)
    h = (h * U64(0x85EBCA6B)) & MASK32
    h ^= h >> U64(13)
    h = (h * U64(0xC2B2AE35)) & MASK32
    h ^= h >> U64(16)
    return h


@njit(cache=True)
def _span_buffers(offsets):
    """Shingle start/end buffers large enough for the longest document of a batch."""
    max_len = 1
    for d in range(offsets.shape[0] - 1):
        max_len = max(max_len, offsets[d + 1] - offsets[d] + 1)
    return np.empty(max_len, dtype=np.int64), np.empty(max_len, dtype=np.int64)


@njit(cache=True)
def minhash_batch(buf, offsets, kinds, n_word, n_char, a, b, scheme, seed, out, n_shingles):
    """MinHash signatures of a batch of normalized documents.

    buf: uint8 UTF-8 of all documents; document d is buf[offsets[d]:offsets[d+1]].
    kinds: WORD/CHAR per document. a, b: uint64 permutation parameters (num_perm each).
    scheme LEGACY: SHA-1 first 4 bytes, (a*h+b) mod 2**61-1 after uint64 wrap, & 2**32-1.
    AFFINE32: SHA-1 first 4 bytes, fmix32, (a*h+b) mod 2**32. FAST: XXH64 base hash and
    multiply-shift permutations ((a*h+b) >> 32, wrapping), not datasketch-compatible. out: uint64[n_docs, num_perm], filled here.
    n_shingles: int64[n_docs], the shingle count of each document."""
    num_perm = a.shape[0]
    n_docs = offsets.shape[0] - 1
    starts, ends = _span_buffers(offsets)
    w = np.empty(80, dtype=np.uint64)
    for d in range(n_docs):
        sig = out[d]
        for j in range(num_perm):
            sig[j] = MAX_HASH_32
        n = n_word if kinds[d] == WORD else n_char
        m = shingle_spans(buf, offsets[d], offsets[d + 1], kinds[d], n, starts, ends)
        n_shingles[d] = m
        # Inner loops are branch-free (min instead of if) so that LLVM vectorizes them.
        for i in range(m):
            if scheme == FAST:
                h = xxh64(buf, starts[i], ends[i], seed)
                for j in range(num_perm):
                    sig[j] = min(sig[j], (a[j] * h + b[j]) >> U64(32))
            elif scheme == AFFINE32:
                h = _fmix32(sha1_first4_le(buf, starts[i], ends[i], w))
                for j in range(num_perm):
                    sig[j] = min(sig[j], (a[j] * h + b[j]) & MASK32)
            else:
                h = sha1_first4_le(buf, starts[i], ends[i], w)
                for j in range(num_perm):
                    x = a[j] * h + b[j]
                    x = (x & MERSENNE_61) + (x >> U64(61))
                    # x < 2P here; x - P wraps to a huge value when x < P, so min picks x mod P.
                    x = min(x, x - MERSENNE_61)
                    sig[j] = min(sig[j], x & MAX_HASH_32)


@njit(cache=True)
def minhash_batch32(buf, offsets, kinds, n_word, n_char, a, b, scheme, seed, out, n_shingles):
    """AFFINE32 and FAST in 32-bit lanes: a, b, out are uint32, so the permutation loop is
    `min(sig, a*h + b)` in uint32 (wrapping mod 2**32), which LLVM vectorizes 8 lanes per AVX2
    instruction; 64-bit multiplies have no AVX2 form. FAST folds XXH64 to 32 bits and applies
    the same affine map (datasketch 2.x's scheme with XXH64 in place of SHA-1 + fmix32)."""
    num_perm = a.shape[0]
    n_docs = offsets.shape[0] - 1
    starts, ends = _span_buffers(offsets)
    w = np.empty(80, dtype=np.uint64)
    for d in range(n_docs):
        sig = out[d]
        for j in range(num_perm):
            sig[j] = np.uint32(0xFFFFFFFF)
        n = n_word if kinds[d] == WORD else n_char
        m = shingle_spans(buf, offsets[d], offsets[d + 1], kinds[d], n, starts, ends)
        n_shingles[d] = m
        for i in range(m):
            h32 = np.uint32(_base_hash32(buf, starts[i], ends[i], scheme, seed, w))
            for j in range(num_perm):
                sig[j] = min(sig[j], np.uint32((a[j] * h32 + b[j]) & MASK32))


@njit(cache=True, inline="always")
def _base_hash32(buf, start, end, scheme, seed, w):
    """The 32-bit hash of one shingle that AFFINE32 and FAST permute: fmix32 of SHA-1's first
    4 bytes, or XXH64 folded to 32 bits."""
    if scheme == FAST:
        h64 = xxh64(buf, start, end, seed)
        return (h64 ^ (h64 >> U64(32))) & MASK32
    return _fmix32(sha1_first4_le(buf, start, end, w))


@njit(cache=True)
def base_hashes32_batch(buf, offsets, kinds, n_word, n_char, scheme, seed, n_shingles):
    """The 32-bit base hash (`_base_hash32`) of every shingle of a batch, documents one after
    the other (uint64[total], values < 2**32); n_shingles: int64[n_docs], filled here. What a
    device permutes in place of `minhash_batch32`'s loop (`minhash_torch`)."""
    n_docs = offsets.shape[0] - 1
    hashes = np.empty(offsets[n_docs] - offsets[0] + n_docs + 1, dtype=np.uint64)
    starts, ends = _span_buffers(offsets)
    w = np.empty(80, dtype=np.uint64)
    k = 0
    for d in range(n_docs):
        n = n_word if kinds[d] == WORD else n_char
        m = shingle_spans(buf, offsets[d], offsets[d + 1], kinds[d], n, starts, ends)
        n_shingles[d] = m
        for i in range(m):
            hashes[k] = _base_hash32(buf, starts[i], ends[i], scheme, seed, w)
            k += 1
    return hashes[:k]


@njit(cache=True)
def shingle_hashes_batch(buf, offsets, kinds, n_word, n_char, seed):
    """XXH64 of every shingle of a batch (for exact Jaccard verification and n-gram matching).

    Returns (hashes uint64[total], doc_offsets int64[n_docs+1], span starts/ends int64[total])."""
    n_docs = offsets.shape[0] - 1
    total_bytes = offsets[n_docs] - offsets[0]
    cap = total_bytes + n_docs + 1
    hashes = np.empty(cap, dtype=np.uint64)
    span_start = np.empty(cap, dtype=np.int64)
    span_end = np.empty(cap, dtype=np.int64)
    doc_offsets = np.zeros(n_docs + 1, dtype=np.int64)
    starts, ends = _span_buffers(offsets)
    k = 0
    for d in range(n_docs):
        n = n_word if kinds[d] == WORD else n_char
        m = shingle_spans(buf, offsets[d], offsets[d + 1], kinds[d], n, starts, ends)
        for i in range(m):
            hashes[k] = xxh64(buf, starts[i], ends[i], seed)
            span_start[k] = starts[i]
            span_end[k] = ends[i]
            k += 1
        doc_offsets[d + 1] = k
    return hashes[:k], doc_offsets, span_start[:k], span_end[:k]


@njit(cache=True)
def band_keys(sig_bytes, bands, rows):
    """One 64-bit key per (document, band): XXH64 of the band's r uint64 values, seeded by the
    band index so that keys of different bands never meet in one group-by (up to 2**-64).

    datasketch keys a band by its raw bytes; a 64-bit digest keeps the shuffled table small and
    fixed-width at the price of a 2**-64 chance of a spurious candidate (which verification or
    the Jaccard threshold then rejects)."""
    n_docs = sig_bytes.shape[0]
    out = np.empty((n_docs, bands), dtype=np.uint64)
    for d in range(n_docs):
        row = sig_bytes[d]
        for band in range(bands):
            out[d, band] = xxh64(row, band * rows * 8, (band + 1) * rows * 8, U64(band))
    return out
