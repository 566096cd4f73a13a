"""End-to-end fuzzy dedup: tokenmill on Dask (1 and 2 workers) vs datasketch's MinHashLSH
pipeline in one process, on a corpus grown from real text with planted near-duplicates.

    python bench/dedup.py [--docs 20000] [--rounds 3] [--verify] [--out DIR]

The corpus: documents made of 3-6 random paragraphs of the WikiText articles
(../shared/data/corpus), plus planted copies edited at known rates (substitutions,
insertions, deletions, shuffled paragraphs). Reported: wall time, peak RSS per worker
(ru_maxrss of each worker process of a fresh LocalCluster), precision of the predicted pairs
(exact Jaccard >= 0.8) and recall of planted pairs with true Jaccard >= 0.9, and agreement
with the peer. On this shared 2-core machine the default is 20,000 documents; pass --docs
200000 where there is room. The load is checked first; the three contenders (1 worker, 2
workers, datasketch) run interleaved, --rounds times each, and each is reported as the median
wall time of its rounds with their spread, the speed-ups as ratios of the medians, and peak RSS
as the highest of its rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.append(str(Path(__file__).resolve().parents[1]))  # `bench.synthetic`

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bench.measure import Timing, check_load, interleaved  # noqa: E402

DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def grow_corpus(n_docs: int, seed: int = 0):
    from bench.synthetic import plant_near_duplicates, wikitext_articles

    corpus = DATA / "corpus"
    articles = wikitext_articles(corpus / "wikitext2_valid.txt") + wikitext_articles(corpus / "wikitext2_test.txt")
    paragraphs = [p for a in articles for p in a.split("\n\n") if len(p.split()) >= 20]
    rng = np.random.default_rng(seed)
    n_base = int(n_docs * 0.9)
    base = [
        "\n\n".join(paragraphs[j] for j in rng.choice(len(paragraphs), size=rng.integers(3, 7), replace=False))
        for _ in range(n_base)
    ]
    rates = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
    per_rate = max(1, (n_docs - n_base) // len(rates))
    return plant_near_duplicates(base, rates=rates, copies_per_rate=per_rate, seed=seed)


def quality(frame: pd.DataFrame, planted, texts: dict[str, str]) -> dict[str, float]:
    from bench.synthetic import cluster_pairs
    from tokenmill.curate.dedup import ShingleConfig, jaccard, shingle_sets

    predicted = cluster_pairs(frame)
    ids = sorted({i for pair in predicted for i in pair})
    sets = dict(zip(ids, shingle_sets([texts[i] for i in ids], ShingleConfig())))
    good = sum(jaccard(sets[a], sets[b]) >= 0.8 for a, b in predicted)
    high = planted.pairs[planted.pairs["jaccard"] >= 0.9]
    found = sum(tuple(sorted(p)) in predicted for p in zip(high["original"], high["copy"]))
    return {
        "pairs": len(predicted),
        "precision": good / max(1, len(predicted)),
        "recall_j090": found / max(1, len(high)),
    }


class PeakRSS:
    """Samples this process's resident set size every 50 ms in a thread (ru_maxrss would report
    a forked worker's parent peak)."""

    def __init__(self):
        import threading

        import psutil

        self.peak = 0
        self._stop = threading.Event()
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._process.memory_info().rss) / 2**20


def _start_sampler(dask_worker=None):
    dask_worker._bench_peak = PeakRSS()


def _stop_sampler(dask_worker=None):
    return dask_worker._bench_peak.stop()


def run_tokenmill(src: Path, out: Path, workers: int, verify: bool, scheme: str) -> dict:
    from tokenmill.curate.dedup import DedupConfig, run_dedup
    from tokenmill.infra.cluster import dask_client

    with dask_client(workers=workers) as client:
        client.run(_start_sampler)
        t0 = time.perf_counter()
        manifest = run_dedup(
            src, out, DedupConfig(threshold=0.8, verify=verify, scheme=scheme), client=client, progress=False
        )
        wall = time.perf_counter() - t0
        peaks = client.run(_stop_sampler)
    return {"wall": wall, "peak_mb": list(peaks.values()), "manifest": manifest}


def peer(src: Path, out_file: Path) -> None:
    """datasketch MinHash + MinHashLSH, one process: insert all, query all, union-find, keep first."""
    from datasketch import MinHash, MinHashLSH

    from tokenmill.curate.dedup import ShingleConfig, python_shingles

    sampler = PeakRSS()
    docs = pd.concat([pd.read_parquet(f) for f in sorted(src.glob("*.parquet"))], ignore_index=True)
    config = ShingleConfig()
    t0 = time.perf_counter()
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    sketches = []
    for doc_id, text in zip(docs["id"], docs["text"]):
        m = MinHash(num_perm=128, seed=1, scheme="legacy")
        m.update_batch([s.encode() for s in python_shingles(text, config)])
        lsh.insert(doc_id, m)
        sketches.append(m)
    parent = {i: i for i in docs["id"]}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for doc_id, m in zip(docs["id"], sketches):
        for other in lsh.query(m):
            a, b = find(doc_id), find(other)
            if a != b:
                parent[b] = a
    # Keep the first document (input order) of each cluster.
    position = {d: i for i, d in enumerate(docs["id"])}
    roots = [find(d) for d in docs["id"]]
    first: dict[str, str] = {}
    for d, r in zip(docs["id"], roots):
        if r not in first or position[d] < position[first[r]]:
            first[r] = d
    rejected = [d for d, r in zip(docs["id"], roots) if first[r] != d]
    wall = time.perf_counter() - t0
    out_file.write_text(json.dumps({"wall": wall, "peak_mb": sampler.stop(), "rejected": rejected}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each contender; the median counts")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--scheme", default="legacy")
    parser.add_argument("--out", default=None)
    parser.add_argument("--peer-only", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_only:
        peer(Path(args.peer_only[0]), Path(args.peer_only[1]))
        return 0
    check_load()
    from tokenmill.curate.documents import write_documents

    work = Path(args.out or tempfile.mkdtemp(prefix="bench-dedup-"))
    shutil.rmtree(work / "in", ignore_errors=True)
    planted = grow_corpus(args.docs)
    docs = planted.documents
    for i in range(args.files):
        write_documents(docs.iloc[i :: args.files], work / "in" / f"part-{i:03d}.parquet")
    texts = dict(zip(docs["id"], docs["text"]))
    words = int(docs["text"].str.split().str.len().sum())
    print(
        f"corpus: {len(docs)} documents ({words / 1e6:.1f} M words) in {args.files} files, {len(planted.pairs)} planted copies;"
        f" threshold 0.8, 128 permutations, scheme {args.scheme}, verify={args.verify}"
    )
    runs: dict[str, list[dict]] = {"1": [], "2": [], "datasketch": []}

    def ours(workers: int) -> None:
        out = work / f"out-{workers}"
        shutil.rmtree(out, ignore_errors=True)  # each round dedups from scratch
        runs[str(workers)].append(run_tokenmill(work / "in", out, workers, args.verify, args.scheme))

    def datasketch() -> None:
        peer_file = work / "peer.json"
        subprocess.run([sys.executable, __file__, "--peer-only", str(work / "in"), str(peer_file)], check=True)
        runs["datasketch"].append(json.loads(peer_file.read_text()))

    interleaved({"1": lambda: ours(1), "2": lambda: ours(2), "datasketch": datasketch}, args.rounds)
    # Each run times its own dedup (the LocalCluster's start and the peer's imports left out).
    walls = {name: Timing([r["wall"] for r in done]) for name, done in runs.items()}
    rejected = {}
    for workers in (1, 2):
        r = runs[str(workers)][-1]
        out = work / f"out-{workers}"
        frame = pd.concat([pd.read_parquet(out / "kept"), pd.read_parquet(out / "rejected")], ignore_index=True)
        found = quality(frame, planted, texts)
        rejected[workers] = set(pd.read_parquet(out / "rejected", columns=["id"])["id"])
        wall = walls[str(workers)]
        peaks = [max(run["peak_mb"][i] for run in runs[str(workers)]) for i in range(workers)]
        phases = {
            k: np.median([run["manifest"]["timings"]["phases"][k] for run in runs[str(workers)]])
            for k in r["manifest"]["timings"]["phases"]
        }
        print(
            f"tokenmill {workers} worker(s): {wall.median:.1f} s wall ({wall}), {len(docs) / wall.median:.0f} docs/s, "
            f"peak RSS per worker {', '.join(f'{m:.0f}' for m in peaks)} MB, rejected {len(rejected[workers])}, "
            f"pairs {found['pairs']}, precision {found['precision']:.3f}, recall(J>=0.9) {found['recall_j090']:.3f}"
        )
        print("   phases (s, medians): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    assert rejected[1] == rejected[2], "1 and 2 workers disagree"
    peer_wall = walls["datasketch"]
    theirs = set(runs["datasketch"][-1]["rejected"])
    print(
        f"datasketch MinHashLSH (1 process): {peer_wall.median:.1f} s wall ({peer_wall}), {len(docs) / peer_wall.median:.0f}"
        f" docs/s, peak RSS {max(run['peak_mb'] for run in runs['datasketch']):.0f} MB, rejected {len(theirs)}"
    )
    ours_rejected = rejected[1]
    print(
        f"speed (ratios of the medians): 1 worker {peer_wall.median / walls['1'].median:.2f}x, 2 workers"
        f" {peer_wall.median / walls['2'].median:.2f}x datasketch; rejected-set agreement with datasketch (Jaccard of sets)"
        f" {len(ours_rejected & theirs) / max(1, len(ours_rejected | theirs)):.3f}"
    )
    print(f"medians of {args.rounds} interleaved rounds; spread: (slowest - fastest) / median of a contender's rounds")
    check_load("after the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
