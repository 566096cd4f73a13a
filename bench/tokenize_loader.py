"""Sample loading: random-access throughput of a blended dataset, and index build time for a
shard of one billion tokens, against Megatron-Core's `GPTDataset` (in `.venv-megatron/`, when
present).

1. Two real shards (WikiText-2 valid+test and Tiny Shakespeare, one document per paragraph,
   encoded with a byte-level BPE trained on them) blended 0.7/0.3; samples of --seq-len + 1
   tokens read in a random order: samples/s and tokens/s, and the same through SampleStream
   global batches (the trainer's path, torch tensors included).
2. Synthetic shards of 1e9 and 1e10 tokens (a real .idx of ~1M / ~11M documents with log-normal
   lengths and a sparse .bin): time to build the document / sample / shuffle indices and write
   them to a fresh cache, with ours (numba) and with Megatron's GPTDataset (C++ helpers, in a
   server process that builds on request), interleaved, the median of --repeats each with its
   spread (the load is checked first: a busy machine is said so); that the indices
   are equal; and that a fresh process's first build loads the compiled kernels from numba's
   cache instead of compiling them.

Usage: python bench/tokenize_loader.py [--tokens 1e9,1e10] [--seq-len 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from measure import Timing, check_load

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
MEGATRON_PYTHON = Path(os.environ.get("TOKENMILL_MEGATRON_PYTHON", REPO / ".venv-megatron" / "bin" / "python"))

MEGATRON_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, logging, warnings
    warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
    import numpy
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tok:
        def __init__(self):
            self.vocab_size, self.eod, self.pad = 50257, 0, 1
            self.unique_identifiers = {"class": "Tok"}

    # One request per line (prefix seq_len num_samples seed cache out access), one JSON answer
    # per line: the parent interleaves these builds with its own.
    for line in sys.stdin:
        prefix, seq_len, num_samples, seed, cache, out, access = line.split()
        seq_len, num_samples, seed, access = int(seq_len), int(num_samples), int(seed), int(access)
        config = GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=([prefix], None), split="1,0,0",
            path_to_cache=cache, tokenizer=Tok(), reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
            create_attention_mask=False)
        started = time.perf_counter()
        train = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, config).build()[0]
        seconds = time.perf_counter() - started
        numpy.save(out + "_sample_index.npy", train.sample_index)
        numpy.save(out + "_shuffle_index.npy", train.shuffle_index)
        rate = 0.0
        if access:
            order = numpy.random.default_rng(0).integers(0, len(train), size=access)
            t = time.perf_counter()
            for i in order:
                train[int(i)]
            rate = len(order) / (time.perf_counter() - t)
        print(json.dumps({"build_seconds": seconds, "samples": len(train), "getitem_per_s": rate}), flush=True)
    """
)

# A fresh process's first index build: whether numba loaded the kernels from its cache.
FIRST_CALL_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    from tokenmill.tokenize import gpt_dataset
    imported = time.perf_counter()
    gpt_dataset.GPTDataset(sys.argv[1], seq_len=16, num_samples=10, seed=0, split_ratios="1", cache=False)
    done = time.perf_counter()
    kernels = (gpt_dataset._sample_index_kernel, gpt_dataset._mt_shuffle)
    print(json.dumps({"import": imported - started, "first_build": done - imported,
        "cache_hits": sum(sum(k.stats.cache_hits.values()) for k in kernels),
        "cache_misses": sum(sum(k.stats.cache_misses.values()) for k in kernels)}))
    """
)


def paragraphs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    blocks = re.split(r"\n\s*\n", text) if "shakespeare" in path.name else text.split("\n")
    return [b.strip() for b in blocks if b.strip() and not re.fullmatch(r"=.*=", b.strip())]


def real_shards(work: Path) -> list[str]:
    import pandas as pd

    from tokenmill.curate.documents import write_documents
    from tokenmill.tokenize.encode import encode_documents
    from tokenmill.tokenize.tokenizer import train_tokenizer

    dirs = []
    for name, files in (
        ("wiki", ("wikitext2_valid.txt", "wikitext2_test.txt")),
        ("shakespeare", ("tinyshakespeare.txt",)),
    ):
        docs = [d for f in files for d in paragraphs(DATA / "corpus" / f)]
        frame = pd.DataFrame({"id": [f"{name}-{i}" for i in range(len(docs))], "text": docs, "source": name})
        write_documents(frame, work / name / "docs.parquet")
        dirs.append(work / name)
    tokenizer = train_tokenizer(dirs, 8192, work / "tokenizer.json", sample_docs=20000)
    prefixes = []
    for d in dirs:
        encode_documents(d, tokenizer, work / f"{d.name}_shard", workers=1, progress=False)
        prefixes.append(str(work / f"{d.name}_shard"))
    return prefixes


def synthetic_shard(prefix: Path, tokens: int, seed: int = 0) -> int:
    """A Megatron .idx for `tokens` tokens in log-normal documents (median ~600, mean ~1000),
    and a sparse .bin of the matching size (zeros; no disk space used)."""
    from tokenmill.tokenize.indexed import bin_path, idx_path, write_index

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=6.4, sigma=1.0, size=int(tokens / 900) + 1000), 8, 200_000).astype(np.int64)
    ends = np.cumsum(lengths)
    n_docs = int(np.searchsorted(ends, tokens)) + 1
    lengths = lengths[:n_docs]
    lengths[-1] -= int(ends[n_docs - 1] - tokens)
    write_index(idx_path(prefix), np.dtype(np.uint16), lengths.astype(np.int32), np.arange(n_docs + 1))
    with open(bin_path(prefix), "wb") as f:
        f.truncate(int(lengths.sum()) * 2)
    return n_docs


def first_call(prefix: Path, cache_dir: Path) -> dict:
    """A fresh process's first (small) index build with numba's cache in `cache_dir`, and the
    cache hits and misses (a miss is a compile) of the index kernels in it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "NUMBA_CACHE_DIR": str(cache_dir)}
    result = subprocess.run(
        [sys.executable, "-c", FIRST_CALL_SCRIPT, str(prefix)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def report_first_calls(work: Path, report) -> Path:
    """Two fresh processes in turn on one empty numba cache folder: the first compiles the
    kernels and stores them, the second must load them. Returns the small shard used."""
    small = work / "small"
    synthetic_shard(small, 1_000_000)
    for label in ("first process (empty cache)", "second process"):
        run = first_call(small, work / "numba-cache")
        report(
            f"{label}: first index build {run['first_build']:.2f}s (import {run['import']:.2f}s); numba cache "
            f"hits {run['cache_hits']}, misses {run['cache_misses']}"
        )
    return small


def build_ours(prefix: Path, seq_len: int, num_samples: int):
    """Our GPTDataset built and written to a fresh cache (as Megatron's timing includes its own)."""
    from tokenmill.tokenize.gpt_dataset import GPTDataset

    shutil.rmtree(f"{prefix}.cache", ignore_errors=True)
    started = time.perf_counter()
    dataset = GPTDataset(prefix, seq_len=seq_len, num_samples=num_samples, seed=1234, split_ratios="1")
    return time.perf_counter() - started, dataset


def index_builds(args, work: Path, report) -> None:
    """Our index build against Megatron's, per shard size, interleaved round by round."""
    from tokenmill.tokenize.gpt_dataset import GPTDataset

    megatron = None
    if MEGATRON_PYTHON.exists():
        script = work / "megatron_build.py"
        script.write_text(MEGATRON_SCRIPT)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        megatron = subprocess.Popen(
            [str(MEGATRON_PYTHON), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
    else:
        report(f"megatron-core: skipped (no environment at {MEGATRON_PYTHON}; make megatron-env)")
    small = report_first_calls(work, report)
    GPTDataset(small, seq_len=16, num_samples=10, seed=0, split_ratios="1", cache=False)  # kernels loaded here too
    for tokens in (int(float(t)) for t in args.tokens.split(",")):
        prefix = work / f"synthetic{tokens:.0e}"
        n_docs = synthetic_shard(prefix, tokens)
        num_samples = tokens // args.seq_len
        report(
            f"synthetic shard: {tokens:,} tokens in {n_docs:,} documents; seq_len {args.seq_len}, {num_samples:,} samples, split 1,0,0"
        )
        ours_times, meg_times, meg = [], [], None
        for round_ in range(args.repeats):
            seconds, ours = build_ours(prefix, args.seq_len, num_samples)
            ours_times.append(seconds)
            if megatron is not None:
                access = 2000 if round_ == 0 else 0
                request = (
                    f"{prefix} {args.seq_len} {num_samples} 1234 {work / f'mcache{round_}'} {work / 'meg'} {access}\n"
                )
                megatron.stdin.write(request)
                megatron.stdin.flush()
                meg = json.loads(megatron.stdout.readline())
                meg_times.append(meg["build_seconds"])
                shutil.rmtree(work / f"mcache{round_}", ignore_errors=True)
                if round_ == 0:
                    meg_access = meg["getitem_per_s"]
        mine = Timing(ours_times)
        report(
            f"tokenmill GPTDataset index build + .npy cache writes (numba): {mine} "
            f"({', '.join(f'{t:.3f}' for t in ours_times)}) for {len(ours):,} samples"
        )
        if megatron is None:
            continue
        same = all(
            np.array_equal(np.load(work / f"meg_{name}.npy"), getattr(ours, name))
            and np.load(work / f"meg_{name}.npy").dtype == getattr(ours, name).dtype
            for name in ("sample_index", "shuffle_index")
        )
        theirs = Timing(meg_times)
        speed = theirs.median / mine.median
        report(
            f"megatron-core GPTDataset build (C++ helpers, includes its .npy cache writes): {theirs} "
            f"({', '.join(f'{t:.3f}' for t in meg_times)}); speed ours/megatron = {speed:.2f}x of the medians "
            f"({'aim >= 1.0x met' if speed >= 1.0 else 'aim >= 1.0x NOT met'}); indices (values and dtypes) equal: {same}"
        )
        t = time.perf_counter()
        picks = np.random.default_rng(0).integers(0, len(ours), size=2000)
        for i in picks:
            ours[int(i)]
        our_access = len(picks) / (time.perf_counter() - t)
        report(
            f"random access on the {tokens:.0e}-token shard (sparse .bin), seq_len {args.seq_len}: ours {our_access:,.0f} samples/s, "
            f"megatron __getitem__ (torch tensors, loss mask, position ids; no attention mask) {meg_access:,.0f} samples/s"
        )
    if megatron is not None:
        megatron.stdin.close()
        megatron.wait(timeout=60)


def measure_access(args: argparse.Namespace, work: Path, report) -> None:
    """1. Random access from a real blend, and the trainer's stream of global batches."""
    from tokenmill.tokenize.loader import SampleStream, build_dataset

    prefixes = real_shards(work)
    blend = [{"prefix": prefixes[0], "weight": 0.7}, {"prefix": prefixes[1], "weight": 0.3}]
    started = time.perf_counter()
    dataset = build_dataset(blend, seq_len=args.access_seq_len, num_samples=args.samples, seed=1234, split_ratios="1")
    build = time.perf_counter() - started
    order = np.random.default_rng(0).permutation(len(dataset))[: args.samples]
    dataset[0]
    started = time.perf_counter()
    for i in order:
        dataset[int(i)]
    seconds = time.perf_counter() - started
    rate = len(order) / seconds
    report(
        f"blend 0.7 wiki / 0.3 shakespeare, seq_len {args.access_seq_len}: {len(dataset)} samples (indices built in {build:.2f}s); "
        f"random access {rate:,.0f} samples/s = {rate * (args.access_seq_len + 1) / 1e6:,.1f} M tokens/s (one process)"
    )
    import torch  # noqa: F401  (imported before the clock starts)

    SampleStream(dataset, dp_rank=0, dp_size=1).next_global_batch(64)
    stream = SampleStream(dataset, dp_rank=0, dp_size=1)
    started = time.perf_counter()
    batches = 0
    while stream.consumed_samples + 64 <= min(len(dataset), args.samples):
        stream.next_global_batch(64)
        batches += 1
    seconds = time.perf_counter() - started
    rate = batches * 64 / seconds
    report(
        f"SampleStream global batches of 64 (torch.LongTensor): {rate:,.0f} samples/s = {rate * (args.access_seq_len + 1) / 1e6:,.1f} M tokens/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1e9,1e10", help="comma list of shard sizes for the index builds")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved index builds per side (the median counts)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--access-seq-len", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=20000, help="random reads from the blended dataset")
    parser.add_argument("--index-only", action="store_true", help="only the index builds (part 2)")
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "tokenize_loader.txt"))
    args = parser.parse_args()

    lines: list[str] = [check_load()]

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory(prefix="tokenmill-loader-") as tmp:
        work = Path(tmp)
        if args.index_only:
            index_builds(args, work, report)
        else:
            measure_access(args, work, report)
            # 2. Index builds for 1e9- and 1e10-token shards, interleaved with Megatron's.
            index_builds(args, work, report)
    load = os.getloadavg()
    report(f"load average during the run: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on {os.cpu_count()} cores")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
