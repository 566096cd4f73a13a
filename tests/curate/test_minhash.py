"""MinHash signatures against datasketch on real documents; hash kernels against hashlib and
xxhash; LSH parameters against datasketch's optimiser."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import xxhash
from datasketch import MinHash
from datasketch.lsh import _optimal_param

from tokenmill.curate.dedup import (
    LSHParams,
    MinHasher,
    ShingleConfig,
    jaccard,
    optimal_bands_rows,
    python_shingles,
    shingle_sets,
)
from tokenmill.curate.dedup.hashing import sha1_first4_le, xxh64
from tokenmill.curate.dedup.shingles import TextNormalization, encode_batch, uses_chars
from tokenmill.errors import ConfigError


def real_documents(shared_data, limit: int) -> list[str]:
    """Paragraphs of WikiText and speeches of Shakespeare, plus CJK and edge cases."""
    docs = []
    for name in ("wikitext2_valid.txt", "wikitext2_test.txt"):
        docs += [p.strip() for p in (shared_data / "corpus" / name).read_text().split("\n") if len(p.split()) > 3]
    docs += [s.strip() for s in (shared_data / "corpus" / "tinyshakespeare.txt").read_text().split("\n\n") if s.strip()]
    docs = docs[:limit]
    docs += [
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        "東京は日本の首都です。人口は約千四百万人です。",
        "",
        "one",
        "two words",
        "Ünïcödé façade naïve — “quotes” ‘and’ dashes…",
        "a" * 300,
    ]
    return docs


@pytest.mark.parametrize("scheme", ["legacy", "affine32"])
def test_signatures_equal_datasketch_on_real_documents(shared_data, scheme):
    docs = real_documents(shared_data, 1500)
    assert len(docs) >= 1000
    hasher = MinHasher(num_perm=128, seed=1, scheme=scheme)
    signatures = hasher.signatures(docs)
    config = ShingleConfig()
    mismatched = []
    for i, doc in enumerate(docs):
        reference = MinHash(num_perm=128, seed=1, scheme=scheme)
        reference.update_batch([s.encode("utf-8") for s in python_shingles(doc, config)])
        if not np.array_equal(reference.hashvalues.astype(np.uint64), signatures[i]):
            mismatched.append(i)
    assert mismatched == []


def test_other_seed_and_num_perm_and_char_shingles_equal_datasketch(shared_data):
    docs = real_documents(shared_data, 200)
    config = ShingleConfig(ngram=3, char_ngram=4, mode="char")
    hasher = MinHasher(num_perm=256, seed=42, shingles=config)
    signatures = hasher.signatures(docs)
    for i, doc in enumerate(docs):
        reference = MinHash(num_perm=256, seed=42, scheme="legacy")
        reference.update_batch([s.encode("utf-8") for s in python_shingles(doc, config)])
        assert np.array_equal(reference.hashvalues, signatures[i]), i


def test_hash_kernels_match_hashlib_and_xxhash():
    rng = np.random.default_rng(0)
    scratch = np.empty(80, np.uint64)
    for length in [0, 1, 3, 4, 7, 8, 31, 32, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 200, 1000]:
        data = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        buf = np.frombuffer(data + b"\0", dtype=np.uint8)
        assert sha1_first4_le(buf, 0, length, scratch) == struct.unpack("<I", hashlib.sha1(data).digest()[:4])[0]
        assert xxh64(buf, 0, length, np.uint64(5)) == xxhash.xxh64_intdigest(data, 5)


@pytest.mark.parametrize("threshold,num_perm", [(0.5, 128), (0.7, 128), (0.8, 128), (0.9, 128), (0.8, 256), (0.85, 64)])
def test_bands_rows_follow_datasketch(threshold, num_perm):
    assert optimal_bands_rows(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_reference_bands_rows_and_explicit_params():
    assert optimal_bands_rows(0.8, 128) == (9, 13)
    assert optimal_bands_rows(0.7, 128) == (14, 9)
    assert LSHParams.resolve(128, 0.8, 16, 8) == LSHParams(16, 8)
    with pytest.raises(ConfigError):
        LSHParams.resolve(128, 0.8, 16, None)
    with pytest.raises(ConfigError):
        LSHParams.resolve(128, 0.8, 20, 8)


def test_fast_scheme_estimates_jaccard(shared_data):
    docs = [p for p in real_documents(shared_data, 400) if len(p.split()) > 40][:50]
    rng = np.random.default_rng(1)
    edited = []
    for doc in docs:
        words = doc.split()
        for k in rng.choice(len(words), size=len(words) // 10, replace=False):
            words[k] = "zzz"
        edited.append(" ".join(words))
    fast = MinHasher(num_perm=256, scheme="fast")
    a, b = fast.signatures(docs), fast.signatures(edited)
    sets_a, sets_b = shingle_sets(docs, ShingleConfig()), shingle_sets(edited, ShingleConfig())
    errors = [abs(np.mean(a[i] == b[i]) - jaccard(sets_a[i], sets_b[i])) for i in range(len(docs))]
    # Standard error of the estimator is sqrt(J(1-J)/256) <= 0.031.
    assert np.mean(errors) < 0.03 and max(errors) < 0.15


def test_kernel_shingles_are_the_python_shingles(shared_data):
    docs = real_documents(shared_data, 300)
    config = ShingleConfig()
    sets = shingle_sets(docs, config)
    for doc, hashes in zip(docs, sets):
        expected = {xxhash.xxh64_intdigest(s.encode(), 0) for s in python_shingles(doc, config)}
        assert set(hashes.tolist()) == expected


@pytest.mark.parametrize(
    "normalization,mode",
    [
        (TextNormalization(), "auto"),
        (TextNormalization(lowercase=False, strip_punctuation=False), "auto"),
        (TextNormalization(unicode_nfkc=True), "char"),
    ],
)
def test_compiled_normalization_is_apply_on_every_code_point(shared_data, normalization, mode):
    """The kernel's class table against `TextNormalization.apply` + `uses_chars` on every code
    point (surrogates cannot be encoded), edge cases and real text."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(map(chr, points[i : i + 997])) for i in range(0, len(points), 997)]
    texts += real_documents(shared_data, 100) + ["  ", " a ", "İstanbul ǅ ß", "\x1c\x1dab\x85cd\u3000ef", "機 器 x"]
    config = ShingleConfig(mode=mode, normalization=normalization)
    batch = encode_batch(texts + [None], config)
    expected = [normalization.apply(t) for t in texts] + [""]
    chars = [uses_chars(t, config) for t in expected]
    assert batch.kinds.tolist() == [int(c) for c in chars]
    assert batch.texts == [t.replace(" ", "") if c else t for t, c in zip(expected, chars)]


def test_cjk_documents_get_character_shingles():
    config = ShingleConfig()
    shingles = python_shingles("机器学习 是人工智能", config)
    assert shingles[0] == "机器学习是" and len(shingles) == 5
    assert python_shingles("Hello, World! again and again here", config)[0] == "hello world again and again"
    raw = ShingleConfig(normalization=TextNormalization(lowercase=False, strip_punctuation=False))
    assert python_shingles("Hello, World!", raw) == ["Hello, World!"]


def test_bad_parameters_are_clear_errors():
    with pytest.raises(ConfigError, match="scheme"):
        MinHasher(scheme="md5")
    with pytest.raises(ConfigError, match="num_perm"):
        MinHasher(num_perm=1)
    with pytest.raises(ConfigError, match="n-gram"):
        ShingleConfig(ngram=0)


@pytest.mark.parametrize("scheme", ["affine32", "fast"])
def test_torch_signatures_equal_the_numba_ones_and_datasketch(shared_data, scheme):
    # Real text (WikiText and Shakespeare, CJK, empty and one-word documents); affine32 is
    # datasketch 2's default scheme, so the torch signatures are datasketch's too.
    docs = real_documents(shared_data, 600)
    numba_signatures, numba_counts = MinHasher(128, 1, scheme).signatures_with_counts(docs)
    torch_signatures, torch_counts = MinHasher(128, 1, scheme, device="cpu").signatures_with_counts(docs)
    assert torch_signatures.dtype == numba_signatures.dtype == np.uint64
    np.testing.assert_array_equal(torch_signatures, numba_signatures)
    np.testing.assert_array_equal(torch_counts, numba_counts)
    if scheme == "affine32":
        for i in range(0, len(docs), 7):
            reference = MinHash(num_perm=128, seed=1)  # datasketch 2's default: affine32
            reference.update_batch([s.encode("utf-8") for s in python_shingles(docs[i], ShingleConfig())])
            np.testing.assert_array_equal(torch_signatures[i], reference.hashvalues.astype(np.uint64), err_msg=str(i))


def test_torch_minhash_is_exact_at_the_32_bit_extremes():
    # Base hashes and multipliers near 2**32 (their product is past int64), checked against
    # Python integers.
    from tokenmill.curate.dedup.minhash_torch import affine32_min

    hashes = np.array([2**32 - 1, 2**32 - 3, 2**31 + 5, 0, 12345], dtype=np.uint64)
    a = np.array([2**32 - 1, 2**32 - 5, 3], dtype=np.uint64)
    b = np.array([2**32 - 1, 7, 0], dtype=np.uint64)
    counts = np.array([2, 0, 3], dtype=np.int64)
    got = affine32_min(hashes, counts, a, b, "cpu")
    values = (hashes[:, None].astype(object) * a.astype(object) + b.astype(object)) % 2**32
    want = np.array([values[:2].min(0), [2**32 - 1] * 3, values[2:].min(0)], dtype=np.uint32)
    np.testing.assert_array_equal(got, want)


def test_the_torch_device_refuses_the_legacy_scheme_in_one_line():
    from tokenmill.curate.dedup.options import DedupConfig

    with pytest.raises(ConfigError, match="legacy scheme .* numba only"):
        MinHasher(scheme="legacy", device="cpu")
    with pytest.raises(ConfigError, match=r"--minhash-device cpu: the legacy scheme"):
        DedupConfig(minhash_device="cpu")
    DedupConfig(minhash_device="cpu", scheme="affine32")
