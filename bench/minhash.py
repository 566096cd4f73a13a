"""MinHash throughput per core: tokenmill's batched kernels vs `datasketch.MinHash.update_batch`.

    python bench/minhash.py [--docs 3000] [--num-perm 128] [--repeats 5]

The same real documents (WikiText articles and Shakespeare, ../shared/data/corpus) and
parameters for both. datasketch gets its shingles ready-made (only `update_batch` is timed);
tokenmill is timed from raw text (normalization and shingling included), so the ratios are
conservative. Every ratio is against `MinHash(num_perm, seed)` as datasketch users create it,
i.e. its default scheme (affine32 since 2.0), except the one line that compares the legacy
scheme with itself. Signatures are asserted equal (affine32 and legacy). The torch rows run
the affine32 and fast permutations on `--torch-device` (default: cuda when there is one, else
cpu; `--minhash-device` of the dedup stage), their signatures asserted equal to the numba
ones. Single process, one thread: numbers are per core (the torch rows' device aside). The load is checked first (a busy machine is said so);
contenders run interleaved, --repeats rounds, each reported as its median with the spread of
its rounds. The time of normalization + encoding alone is printed as a profile.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # `bench.synthetic`

import argparse
import os

import numpy as np
from datasketch import MinHash

from bench.measure import check_load, interleaved
from bench.synthetic import wikitext_articles
from tokenmill.curate.dedup import MinHasher, ShingleConfig, python_shingles
from tokenmill.curate.dedup.shingles import encode_batch

DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def documents(n: int) -> list[str]:
    corpus = DATA / "corpus"
    docs = wikitext_articles(corpus / "wikitext2_valid.txt") + wikitext_articles(corpus / "wikitext2_test.txt")
    docs += [s for s in (corpus / "tinyshakespeare.txt").read_text().split("\n\n") if len(s.split()) > 20]
    # Paragraph-sized pieces of the articles too, so that document lengths vary as in a crawl.
    docs += [p for a in docs[:240] for p in a.split("\n\n") if len(p.split()) > 30]
    out = []
    while len(out) < n:
        out.extend(docs)
    return out[:n]


def datasketch_run(shingles: list[list[bytes]], num_perm: int, scheme: str | None):
    """datasketch as its users call it; scheme None is its default (affine32 since 2.0)."""
    options = {} if scheme is None else {"scheme": scheme}

    def run() -> np.ndarray:
        sigs = []
        for s in shingles:
            m = MinHash(num_perm=num_perm, seed=1, **options)
            m.update_batch(s)
            sigs.append(m.hashvalues)
        return np.array(sigs, dtype=np.uint64)

    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch-device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)
    import torch

    device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_load()
    docs = documents(args.docs)
    config = ShingleConfig()
    shingles = [[s.encode("utf-8") for s in python_shingles(d, config)] for d in docs]
    n_shingles = sum(len(s) for s in shingles)
    print(f"{len(docs)} documents, {n_shingles} word 5-gram shingles, num_perm={args.num_perm}, 1 core")
    assert MinHash(num_perm=args.num_perm).scheme == "affine32", "datasketch's default scheme changed"

    hashers = {scheme: MinHasher(args.num_perm, 1, scheme) for scheme in ("legacy", "affine32", "fast")}
    torch_hashers = {s: MinHasher(args.num_perm, 1, s, device=device) for s in ("affine32", "fast")}
    for hasher in [*hashers.values(), *torch_hashers.values()]:
        hasher.signatures(docs)  # compile (or load) the kernels and fill the code point table
    contenders = {
        "datasketch default (affine32)": datasketch_run(shingles, args.num_perm, None),
        "datasketch legacy": datasketch_run(shingles, args.num_perm, "legacy"),
        **{f"tokenmill {s}": (lambda h=h: h.signatures(docs)) for s, h in hashers.items()},
        **{f"tokenmill {s} torch {device}": (lambda h=h: h.signatures(docs)) for s, h in torch_hashers.items()},
        "tokenmill normalize + encode only": lambda: encode_batch(docs, config),
    }
    timings, results = interleaved(contenders, args.repeats)
    times = {name: timing.median for name, timing in timings.items()}
    assert np.array_equal(results["datasketch default (affine32)"], results["tokenmill affine32"]), "affine32 differs"
    assert np.array_equal(results["datasketch legacy"], results["tokenmill legacy"]), "legacy differs"
    for scheme in torch_hashers:
        assert np.array_equal(results[f"tokenmill {scheme} torch {device}"], results[f"tokenmill {scheme}"]), scheme

    default = times["datasketch default (affine32)"]
    print(f"{'':36s} {'docs/s':>9s} {'shingles/s':>12s} {'vs datasketch default':>22s} {'spread':>7s}")
    for name, t in times.items():
        if name.endswith("only"):
            continue
        row = f"{name:36s} {len(docs) / t:9.0f} {n_shingles / t / 1e6:10.2f} M {default / t:21.1f}x"
        print(f"{row} {timings[name].spread:7.0%}")
    encode = times["tokenmill normalize + encode only"]
    print(
        "where tokenmill's time goes (normalize + encode is shared by every scheme; the rest is hashing"
        " and the permutation minimum):"
    )
    for scheme in hashers:
        total = times[f"tokenmill {scheme}"]
        print(
            f"  {scheme:9s} {total:.3f}s: normalize + encode {encode:.3f}s ({encode / total:.0%}), "
            f"shingle hashing + minimum {total - encode:.3f}s ({1 - encode / total:.0%})"
        )
    fast, affine = default / times["tokenmill fast"], default / times["tokenmill affine32"]
    print(
        f"fast (xxh64, not datasketch-compatible) vs datasketch default: {fast:.1f}x (aim >= 10x: "
        f"{'met' if fast >= 10 else 'NOT met'})"
    )
    print(
        f"affine32 (bit-identical) vs datasketch default: {affine:.1f}x (aim >= 5x: {'met' if affine >= 5 else 'NOT met'})"
    )
    print(
        f"legacy (bit-identical) vs datasketch legacy, the same scheme: "
        f"{times['datasketch legacy'] / times['tokenmill legacy']:.1f}x"
    )
    print("signatures equal to datasketch: yes (affine32, legacy)")
    print(f"torch signatures on {device} equal to numba's: yes (affine32, fast)")
    print(f"medians of {args.repeats} interleaved rounds; spread: (slowest - fastest) / median of a contender's rounds")
    check_load("after the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
