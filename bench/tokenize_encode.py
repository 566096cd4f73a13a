"""Encode throughput: `tokenmill tokenize encode` against its ceiling and against datatrove.

- ceiling: the same texts, already in memory, through `tokenizers`' batched Rust encoder in one
  process (all cores): what encoding costs with no reading, writing or scheduling;
- ours: `encode_documents` on a LocalCluster of --workers processes, reading Parquet and writing
  the Megatron shard (warm: a cluster already up, as in a pipeline; cold: including its start);
- datatrove: `DocumentTokenizer` (datatrove's ParquetReader -> DocumentTokenizer, no shuffle) on
  the same files with the same tokenizer and workers, run in its own virtual environment
  (`.venv-bench/`, skipped when absent).
The load is checked first; the contenders run interleaved (ceiling, ours warm, ours cold,
datatrove, and again), --rounds times each. Each line prints the median tokens/s of its rounds
with their spread, the ratio of medians to the ceiling (wall time, and CPU seconds of the
process tree), and the highest peak resident memory of the process tree over the rounds.
Corpora: WikiText-2 (valid + test) and Tiny Shakespeare from ../shared/data, one document per
paragraph, repeated --repeat times (ids made unique) to make the run long enough to time.

Usage: python bench/tokenize_encode.py [--repeat 4] [--rounds 3] [--workers 2] [--vocab-size 8192]
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
import threading
from pathlib import Path

from measure import Timing, check_load, interleaved

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"


class ProcessTreeMeter:
    """Peak total RSS and CPU seconds of a process and its descendants, sampled every 100 ms.

    CPU time matters here because the benchmark machine may be shared: wall time then measures
    the neighbours too, CPU seconds per token does not."""

    def __init__(self, pid: int | None = None, skip_children: bool = False) -> None:
        """`skip_children`: leave out the children there now (a warm cluster idle beside the
        contender measured)."""
        import psutil

        self.root = psutil.Process(pid or os.getpid())
        self._skipped = {child.pid for child in self.root.children(recursive=True)} if skip_children else set()
        self.peak = 0
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, first: bool = False) -> None:
        import psutil

        total = 0
        try:
            procs = [self.root, *(c for c in self.root.children(recursive=True) if c.pid not in self._skipped)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                with proc.oneshot():
                    total += proc.memory_info().rss
                    times = proc.cpu_times()
                    cpu = times.user + times.system
            except psutil.Error:
                continue
            key = (proc.pid, proc.create_time())
            if first:
                self._cpu_start[key] = cpu
            self._cpu_last[key] = cpu
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.1)

    def __enter__(self) -> ProcessTreeMeter:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mib(self) -> float:
        return self.peak / 2**20

    @property
    def cpu_seconds(self) -> float:
        return sum(last - self._cpu_start.get(key, 0.0) for key, last in self._cpu_last.items())


def paragraphs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    blocks = re.split(r"\n\s*\n", text) if "shakespeare" in path.name else text.split("\n")
    return [b.strip() for b in blocks if b.strip() and not re.fullmatch(r"=.*=", b.strip())]


def write_corpus(out: Path, repeat: int, files: int) -> tuple[int, int]:
    import pandas as pd

    from tokenmill.curate.documents import write_documents

    rows = []
    for name in ("wikitext2_valid.txt", "wikitext2_test.txt", "tinyshakespeare.txt"):
        docs = paragraphs(DATA / "corpus" / name)
        for r in range(repeat):
            rows.extend((f"{Path(name).stem}-{r}-{i}", text, Path(name).stem) for i, text in enumerate(docs))
    frame = pd.DataFrame(rows, columns=["id", "text", "source"])
    per_file = -(-len(frame) // files)
    for f in range(files):
        write_documents(frame.iloc[f * per_file : (f + 1) * per_file], out / f"docs-{f:03d}.parquet")
    return len(frame), int(frame["text"].str.len().sum())


DATATROVE_SCRIPT = textwrap.dedent(
    """
    import sys, time, json
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    docs, tokenizer, out, workers, files = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    if __name__ == "__main__":
        started = time.perf_counter()
        LocalPipelineExecutor(
            pipeline=[
                ParquetReader(docs, text_key="text", id_key="id"),
                DocumentTokenizer(out, tokenizer_name_or_path=tokenizer, eos_token="<|endoftext|>", shuffle_documents=False),
            ],
            tasks=files, workers=workers, logging_dir=out + "/logs", skip_completed=False,
        ).run()
        print(json.dumps({"seconds": time.perf_counter() - started}))
    """
)


def run_datatrove(docs: Path, tokenizer: Path, work: Path, workers: int, files: int) -> dict | None:
    if not BENCH_PYTHON.exists():
        return None
    script = work / "datatrove_run.py"
    script.write_text(DATATROVE_SCRIPT)
    out = work / "datatrove_out"
    shutil.rmtree(out, ignore_errors=True)  # a fresh output per round
    proc = subprocess.Popen(
        [str(BENCH_PYTHON), str(script), str(docs), str(tokenizer), str(out), str(workers), str(files)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with ProcessTreeMeter(proc.pid) as meter:
        stdout, stderr = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        return {"error": f"datatrove exited with {proc.returncode}"}
    seconds = json.loads(stdout.strip().splitlines()[-1])["seconds"]
    token_bytes = sum(p.stat().st_size for p in out.rglob("*.ds"))
    return {"seconds": seconds, "tokens": token_bytes // 2, "meter": meter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=4, help="copies of the corpus")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each contender; the median counts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--output", default=str(REPO / "bench" / "results" / "tokenize_encode.txt"))
    args = parser.parse_args()
    machine_load = check_load()

    import pyarrow.parquet as pq

    from tokenmill.infra.cluster import dask_client
    from tokenmill.tokenize.encode import encode_documents
    from tokenmill.tokenize.tokenizer import load_tokenizer, train_tokenizer

    lines: list[str] = [machine_load]

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        work = Path(tmp)
        n_docs, n_chars = write_corpus(work / "docs", args.repeat, args.files)
        tokenizer_path = train_tokenizer(work / "docs", args.vocab_size, work / "tokenizer.json", sample_docs=20000)
        report(
            f"corpus: WikiText-2 valid+test + Tiny Shakespeare, paragraphs x{args.repeat}: {n_docs} documents, "
            f"{n_chars / 1e6:.1f} M characters in {args.files} Parquet files; byte-level BPE vocab {args.vocab_size}; "
            f"{os.cpu_count()} cores, {args.workers} workers"
        )

        texts = [
            t for f in sorted((work / "docs").glob("*.parquet")) for t in pq.read_table(f).column("text").to_pylist()
        ]
        tokenizer = load_tokenizer(tokenizer_path)
        tokenizer.encode_batch_fast(texts[:2000], add_special_tokens=False)  # warm the thread pool
        outputs = iter(range(10**6))  # a fresh output per run

        def ceiling() -> tuple[int, ProcessTreeMeter]:
            """In-memory batched Rust encoding of the same texts (all cores)."""
            with ProcessTreeMeter(skip_children=True) as meter:
                tokens = sum(len(e) + 1 for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False))
            return tokens, meter

        def ours(client=None) -> tuple[int, ProcessTreeMeter]:
            """A warm cluster's encode (the steady state of a pipeline) or, without `client`, a cold
            one (one command, its cluster's start included)."""
            output = work / f"ours-{next(outputs)}"
            with ProcessTreeMeter(skip_children=client is None) as meter:
                meta = encode_documents(
                    work / "docs", tokenizer_path, output, client=client, workers=args.workers, progress=False
                )
            for path in output.parent.glob(f"{output.name}*"):  # the shard's disk, before the next run
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            return meta["tokens"], meter

        def datatrove() -> tuple[int, ProcessTreeMeter]:
            result = run_datatrove(work / "docs", tokenizer_path, work, args.workers, args.files)
            if "error" in result:
                raise SystemExit(f"datatrove: {result['error']}")
            return result["tokens"], result["meter"]

        names = {
            "ceiling": "ceiling   tokenizers.encode_batch_fast, texts in memory",
            "warm": f"tokenmill encode, warm {args.workers}-worker LocalCluster (Parquet -> .bin/.idx/.json)",
            "cold": "tokenmill encode, cold (cluster start included)",
            "datatrove": f"datatrove DocumentTokenizer, {args.workers} workers x {args.files} tasks, no shuffle",
        }
        with dask_client(workers=args.workers) as client:
            ours(client)  # warm the workers' imports and tokenizer cache
            meters: dict[str, list[ProcessTreeMeter]] = {name: [] for name in names}
            tokens: dict[str, int] = {}

            def timed(name: str, run) -> None:
                tokens[name], meter = run()
                meters[name].append(meter)

            contenders = {
                "ceiling": lambda: timed("ceiling", ceiling),
                "warm": lambda: timed("warm", lambda: ours(client)),
                "cold": lambda: timed("cold", ours),
            }
            if BENCH_PYTHON.exists():
                contenders["datatrove"] = lambda: timed("datatrove", datatrove)
            walls, _ = interleaved(contenders, args.rounds)
        assert tokens["warm"] == tokens["cold"] == tokens["ceiling"], tokens

        def cpu(name: str) -> Timing:
            return Timing([meter.cpu_seconds for meter in meters[name]])

        rates = {name: tokens[name] / walls[name].median for name in walls}
        cpu_rates = {name: tokens[name] / cpu(name).median for name in walls}
        for name in walls:
            report(
                f"{names[name]}: {tokens[name]} tokens, {rates[name]:,.0f} tokens/s (x{rates[name] / rates['ceiling']:.2f}"
                f" of ceiling; {walls[name]}); {cpu_rates[name]:,.0f} tokens per CPU-second"
                f" (x{cpu_rates[name] / cpu_rates['ceiling']:.2f} of ceiling); peak"
                f" {max(meter.mib for meter in meters[name]):,.0f} MiB"
            )
        if "datatrove" not in walls:
            report(f"datatrove: skipped (no environment at {BENCH_PYTHON})")
        else:
            report(
                f"ours/datatrove (ratios of the medians): warm x{rates['warm'] / rates['datatrove']:.2f} wall,"
                f" x{cpu_rates['warm'] / cpu_rates['datatrove']:.2f} per CPU-second; cold"
                f" x{rates['cold'] / rates['datatrove']:.2f} wall, x{cpu_rates['cold'] / cpu_rates['datatrove']:.2f}"
                " per CPU-second"
            )
            if tokens["datatrove"] != tokens["ceiling"]:
                report(f"  note: datatrove wrote {tokens['datatrove']} tokens, the ceiling counted {tokens['ceiling']}")
        report(
            f"medians of {args.rounds} interleaved rounds; spread: (slowest - fastest) / median of a contender's rounds"
        )

    report(check_load("after the run"))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
