"""Bench: peak RSS per Dask worker against input size, for ingest, normalize, filter, fuzzy dedup
and encode of one JSONL file, beside a whole-file read of the same file with pandas.

    .venv/bin/python bench/memory.py [--sizes-mb 50 100 200] [--rounds 2] [--workers 2] [--limit-mb 1024]
                                     [--out bench/results/memory.txt]
    .venv/bin/python bench/memory.py --hostile-mb 512 [--document-mb 50]

`--hostile-mb N` measures hostile inputs instead: a `.warc.gz` whose one record expands to N MB,
a `.jsonl.gz` holding N MB without a newline, one JSONL line of N / 2 MB (all ingested with the
default --max-record-bytes, so each is a counted `too_large`), and a `--document-mb` document
through `tokenize train-tokenizer` (in the command's process) and `tokenize encode`; also a
text file of N MB of real paragraphs split by `--separator '\n\n'`, which ingest reads a chunk
at a time (`--ingest-only`: the ingest rows alone).

The input is one generated JSONL file per size: documents of 3-8 real paragraphs (WikiText-2 and
Shakespeare from ../shared/data/corpus) in a seeded random order, 5% of them repeated, so
dedup has work. Each stage runs through the command line (`--scheduler`) on a LocalCluster of
`--workers` single-threaded worker processes whose memory limit is `--limit-mb`: a worker that
went over it would be paused and killed by Dask, so finishing is part of the claim. The
workers are restarted before each stage, and each reports its peak resident memory after it (`VmHWM`):
the peak of that stage on that worker. The claim: the peak stays under `--limit-mb`
and does not grow with the input (largest / smallest size near 1), while a whole-file read
(`pandas.read_json(lines=True)`, in a subprocess) grows with it. A peak varies a little from
run to run (when Dask and Python collect garbage), so each size runs the chain and the
whole-file read interleaved, `--rounds` times each: the table gives each stage's highest peak
over the rounds, the report the largest spread of a peak over its rounds, and stage seconds are
medians (timing is not the claim: the machine's load is printed with them). The hostile inputs
are run once each: their claim is a bound (every peak under the workers' memory limit), which
one run over the bound disproves. Megatron-LM's
`tools/preprocess_data.py` is not compared: no Megatron-LM checkout exists on this project's
machines (megatron-core's wheel does not ship it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import check_load, interleaved, spread

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
STAGES = ("ingest", "normalize", "filter", "dedup", "encode")


def paragraphs() -> list[str]:
    corpus = SHARED / "corpus"
    found = []
    for name in ("wikitext2_valid.txt", "wikitext2_test.txt"):
        found += [line.strip() for line in (corpus / name).read_text().split("\n") if len(line.strip()) > 80]
    found += [block.strip() for block in (corpus / "tinyshakespeare.txt").read_text().split("\n\n") if block.strip()]
    return found


def write_jsonl(path: Path, size_bytes: int, seed: int = 0) -> int:
    """Documents of 3-8 random paragraphs until the file reaches `size_bytes`; returns their count."""
    rng = random.Random(seed)
    pool = paragraphs()
    written, docs, recent = 0, 0, []
    with path.open("w") as handle:
        while written < size_bytes:
            if recent and rng.random() < 0.05:
                text = rng.choice(recent)
            else:
                text = "\n\n".join(rng.choice(pool) for _ in range(rng.randint(3, 8)))
                recent = (recent + [text])[-1000:]
            line = json.dumps({"text": text}) + "\n"
            handle.write(line)
            written += len(line.encode())
            docs += 1
    return docs


def worker_peaks(client) -> list[float]:
    """Peak RSS (MiB) of each worker process since it started."""

    def peak() -> float:
        # VmHWM: the high-water mark of this process's own address space. (ru_maxrss would do on
        # its own, but Linux keeps it across execve, so a spawned worker starts at its parent's.)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    return sorted(client.run(peak).values())


def whole_file_peak(path: Path) -> float:
    """Peak RSS (MiB) of a process that reads the whole file with pandas, as a one-process
    script without streaming does."""
    code = (
        "import sys, pandas as pd\n"
        "frame = pd.read_json(sys.argv[1], lines=True)\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "print(int(status.split()[0]) / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def run_chain(workers: int, limit_mb: int, source: Path, work: Path, tokenizer: Path | None) -> dict[str, dict]:
    """Every stage on the output of the one before, each on fresh worker processes."""
    from distributed import Client, LocalCluster

    from tokenmill.cli import main

    def run(stage: str, argv: list[str]) -> dict:
        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=1, memory_limit=f"{limit_mb}MiB", dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            started = time.time()
            code = main([*argv, "--scheduler", cluster.scheduler_address, "--no-progress"])
            if code != 0:
                raise SystemExit(f"{stage} failed with exit code {code}")
            return {"seconds": time.time() - started, "peaks": worker_peaks(client)}

    results = {}
    previous = source
    for stage in STAGES[:-1]:
        output = work / stage
        options = ["--threshold", "0.8"] if stage == "dedup" else []
        results[stage] = run(stage, ["curate", stage, "--input", str(previous), "--output", str(output), *options])
        previous = output
    if tokenizer is None:
        tokenizer = work / "tokenizer.json"
        argv = ["tokenize", "train-tokenizer", "--input", str(previous), "--vocab-size", "8000"]
        if main([*argv, "--sample-docs", "5000", "--output", str(tokenizer)]) != 0:
            raise SystemExit("train-tokenizer failed")
    results["encode"] = run(
        "encode",
        [
            "tokenize",
            "encode",
            "--input",
            str(previous),
            "--tokenizer",
            str(tokenizer),
            "--output-prefix",
            str(work / "shard"),
        ],
    )
    results["tokenizer"] = tokenizer
    return results


def write_hostile_inputs(work: Path, hostile_mb: int) -> dict[str, Path]:
    """The decompression bombs and the huge line, written in 1 MB chunks."""
    import gzip
    import zlib

    mb = 1024 * 1024
    inputs = {
        name: work / name / file
        for name, file in (
            ("warc.gz bomb", "bomb.warc.gz"),
            ("jsonl.gz bomb", "bomb.jsonl.gz"),
            ("huge JSONL line", "line.jsonl"),
            ("separator-split text file", "book.txt"),
        )
    }
    for path in inputs.values():
        path.parent.mkdir()
    good = json.dumps({"text": "a document after the hostile one"}).encode() + b"\n"
    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"
    block_length = len(http) + hostile_mb * mb
    header = (
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000001>\r\n"
        "WARC-Date: 2024-05-01T10:00:00Z\r\nWARC-Target-URI: http://example.com/\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {block_length}\r\n\r\n"
    ).encode()
    with inputs["warc.gz bomb"].open("wb") as handle:
        compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # one gzip member, as WARC writers make
        handle.write(compressor.compress(header + http))
        for _ in range(hostile_mb):
            handle.write(compressor.compress(b" " * mb))
        handle.write(compressor.compress(b"\r\n\r\n") + compressor.flush())
    with gzip.open(inputs["jsonl.gz bomb"], "wb", compresslevel=9) as handle:
        for _ in range(hostile_mb):
            handle.write(b"{" * mb)
        handle.write(b"\n" + good)
    with inputs["huge JSONL line"].open("wb") as handle:
        handle.write(b'{"text": "')
        for _ in range(hostile_mb // 2):
            handle.write(b"x" * mb)
        handle.write(b'"}\n' + good)
    # Real paragraphs, one document each, split by --separator '\n\n' (SEPARATOR below).
    text = "\n\n".join(paragraphs()).encode() + b"\n\n"
    with inputs["separator-split text file"].open("wb") as handle:
        for _ in range(hostile_mb * mb // len(text)):
            handle.write(text)
        handle.write(text[: hostile_mb * mb % len(text)])
    return inputs


# How each hostile input is ingested beyond the defaults.
HOSTILE_OPTIONS = {"separator-split text file": ["--separator", "\n\n"]}


def document_rows(args: argparse.Namespace, scratch: Path, on_workers) -> list[tuple]:
    """train-tokenizer (in its own process) and encode on one `--document-mb` document."""
    rows = []
    docs = scratch / "document" / "docs"
    docs.mkdir(parents=True)
    pool = paragraphs()
    text = "\n".join(pool)
    text = (text * (args.document_mb * 1024 * 1024 // len(text) + 1))[: args.document_mb * 1024 * 1024]
    import pandas as pd

    pd.DataFrame({"id": ["long", "short"], "text": [text, pool[0]], "source": "bench"}).to_parquet(
        docs / "part-0.parquet"
    )
    tokenizer = scratch / "document" / "tokenizer.json"
    code = (
        "import sys\nfrom tokenmill.cli import main\n"
        "code = main(['tokenize', 'train-tokenizer', '--input', sys.argv[1], '--vocab-size', '8000', '--output', sys.argv[2]])\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "print(int(status.split()[0]) / 1024, code)\n"
    )
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code, str(docs), str(tokenizer)], capture_output=True, text=True, check=True
    )
    peak, code_text = out.stdout.split()
    if code_text != "0":
        raise SystemExit("train-tokenizer failed")
    rows.append(
        (
            f"train-tokenizer, one {args.document_mb} MB document (command process)",
            [float(peak)],
            time.time() - started,
            None,
        )
    )
    argv = ["tokenize", "encode", "--input", str(docs), "--tokenizer", str(tokenizer), "--output-prefix"]
    peaks, seconds = on_workers([*argv, str(scratch / "document" / "shard")])
    rows.append((f"encode, one {args.document_mb} MB document", peaks, seconds, None))
    return rows


def run_hostile(args: argparse.Namespace, scratch: Path) -> list[str]:
    """Peak memory per worker on hostile inputs, beside the bound (the worker's memory limit)."""
    from distributed import Client, LocalCluster

    from tokenmill.cli import main as tokenmill

    def on_workers(argv: list[str]) -> tuple[list[float], float]:
        with (
            LocalCluster(
                n_workers=args.workers, threads_per_worker=1, memory_limit=f"{args.limit_mb}MiB", dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            started = time.time()
            if tokenmill([*argv, "--scheduler", cluster.scheduler_address, "--no-progress"]) != 0:
                raise SystemExit(f"{' '.join(argv[:2])} failed")
            return worker_peaks(client), time.time() - started

    rows = []
    for name, path in write_hostile_inputs(scratch, args.hostile_mb).items():
        output = path.parent / "out"
        argv = ["curate", "ingest", "--input", str(path), "--output", str(output), *HOSTILE_OPTIONS.get(name, [])]
        peaks, seconds = on_workers(argv)
        counts = json.loads((output / "manifest.json").read_text())["counts"]
        path.unlink()  # the disk they take, before the next input is read
        rows.append(
            (
                f"ingest {name} ({args.hostile_mb // 2 if 'line' in name else args.hostile_mb} MB)",
                peaks,
                seconds,
                counts,
            )
        )
    if not args.ingest_only:
        rows += document_rows(args, scratch, on_workers)

    lines = [
        f"hostile inputs: peak RSS per process (MiB; {args.workers} single-threaded workers, memory limit"
        f" {args.limit_mb} MiB each: the bound; ingest with the default --max-record-bytes, 64 MiB)",
        "",
        f"{'input':<62}{'peak':>8}{'bound':>8}{'seconds':>9}  counts",
    ]
    for name, peaks, seconds, counts in rows:
        shown = f"in {counts['in']}, kept {counts['kept']}, rejected {counts['rejected']}" if counts else ""
        lines.append(f"{name:<62}{max(peaks):>8.0f}{args.limit_mb:>8}{seconds:>9.0f}  {shown}")
    worst = max(max(peaks) for _, peaks, _, _ in rows)
    lines.append(
        f"highest peak: {worst:.0f} MiB, {'within' if worst < args.limit_mb else 'OVER'} the {args.limit_mb} MiB bound"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved runs of each size's chain and whole-file read"
    )
    parser.add_argument("--limit-mb", type=int, default=1024, help="memory limit of each worker (the bound)")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--hostile-mb", type=int, default=None, help="measure the hostile inputs of this size instead")
    parser.add_argument("--document-mb", type=int, default=50, help="the long document's size (with --hostile-mb)")
    parser.add_argument(
        "--ingest-only", action="store_true", help="with --hostile-mb: only the ingest rows, not the long document's"
    )
    args = parser.parse_args()
    machine_load = check_load()
    if args.hostile_mb is not None:
        with tempfile.TemporaryDirectory(dir=args.work) as scratch:
            text = "\n".join(run_hostile(args, Path(scratch))) + "\n"
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as handle:
                handle.write("\n" + text)
        return

    lines = [
        machine_load,
        f"peak RSS per worker (MiB; {args.workers} single-threaded workers, memory limit {args.limit_mb} MiB each)",
        f"input: one JSONL file per size; stages chained: {' -> '.join(STAGES)}",
        "",
    ]
    table: dict[int, dict] = {}
    peak_spreads: list[tuple[float, str, int]] = []  # (spread of a peak over its rounds, stage, size)
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        tokenizer = None
        for size in args.sizes_mb:
            work = Path(scratch) / f"{size}mb"
            work.mkdir()
            source = work / "input.jsonl"
            docs = write_jsonl(source, size * 1024 * 1024)
            rounds: list[dict[str, dict]] = []

            def chain(work=work, source=source, rounds=rounds) -> None:
                nonlocal tokenizer
                results = run_chain(args.workers, args.limit_mb, source, work, tokenizer)
                tokenizer = results.pop("tokenizer")  # one tokenizer for every size and round
                rounds.append(results)
                for path in work.iterdir():  # keep the scratch space to one run at a time
                    if path not in (tokenizer, source):
                        shutil.rmtree(path) if path.is_dir() else path.unlink()

            whole_file: list[float] = []
            interleaved(
                {
                    "chain": chain,
                    "whole-file read": lambda peaks=whole_file, source=source: peaks.append(whole_file_peak(source)),
                },
                args.rounds,
            )
            results = {
                stage: {
                    "seconds": statistics.median(r[stage]["seconds"] for r in rounds),
                    "peaks": [max(max(r[stage]["peaks"]) for r in rounds)],
                }
                for stage in STAGES
            }
            results["whole-file read (pandas)"] = {"seconds": 0.0, "peaks": [max(whole_file)]}
            for stage in STAGES:
                peak_spreads.append((spread([max(r[stage]["peaks"]) for r in rounds]), stage, size))
            peak_spreads.append((spread(whole_file), "whole-file read", size))
            table[size] = {"docs": docs, **results}
            print(
                f"{size} MB ({docs} docs): " + ", ".join(f"{k} {max(v['peaks']):.0f}" for k, v in results.items()),
                flush=True,
            )
            source.unlink()

    sizes = list(table)
    rows = [k for k in table[sizes[0]] if k != "docs"]
    header = f"{'stage':<28}" + "".join(f"{f'{s} MB':>12}" for s in sizes) + f"{'largest/smallest':>18}"
    lines += [header, "-" * len(header)]
    worst = 0.0
    for row in rows:
        peaks = [max(table[s][row]["peaks"]) for s in sizes]
        lines.append(f"{row:<28}" + "".join(f"{p:>12.0f}" for p in peaks) + f"{peaks[-1] / peaks[0]:>18.2f}")
        if row in STAGES:
            worst = max(worst, *peaks)
    lines.append("")
    largest, stage, size = max(peak_spreads)
    lines.append(
        f"each peak: the highest of {args.rounds} interleaved rounds; the largest spread of a peak over its rounds:"
        f" {largest:.0%} ({stage}, {size} MB)"
    )
    lines.append(
        "stage seconds (medians): "
        + "; ".join(f"{s} MB: " + ", ".join(f"{st} {table[s][st]['seconds']:.0f}" for st in STAGES) for s in sizes)
    )
    lines.append("documents: " + ", ".join(f"{s} MB {table[s]['docs']}" for s in sizes))
    verdict = "within" if worst < args.limit_mb else "OVER"
    lines.append(
        f"highest worker peak over every stage and size: {worst:.0f} MiB, {verdict} the {args.limit_mb} MiB bound"
    )
    lines.append(check_load("after the run"))
    lines.append("Megatron-LM preprocess_data.py: not run (no Megatron-LM checkout or environment on this machine)")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
