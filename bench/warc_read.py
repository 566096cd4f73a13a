"""Bench: reading WARC files, FastWARC against warcio, on the shared WARCs.

    .venv/bin/python bench/warc_read.py [--repeat 20] [--rounds 5] [--out bench/results/warc_read.txt]

Both readers do the same work a WARC ingest does: iterate every record of every gzipped WARC in
../shared/data/web/warc (the truncated one left out: the readers differ in how they stop), parse
the HTTP headers of responses and read their payloads. Each reader runs in its own subprocess
(so peak RSS is its own), `--repeat` passes over the files; the figures are records and
compressed megabytes per CPU second of that process, and its peak RSS. The load is checked
first; the readers run interleaved (fastwarc, warcio, fastwarc, ...), `--rounds` subprocesses
each, and each is reported as the median of its rounds' CPU seconds with their spread; the
ratio is that of the medians, the peak RSS the highest of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from measure import Timing, check_load, interleaved

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
READERS = ("fastwarc", "warcio")


def _files() -> list[Path]:
    files = sorted((SHARED / "web" / "warc").glob("*.warc.gz"))
    return [f for f in files if not f.name.startswith("truncated")]


def _read_fastwarc(path: Path) -> tuple[int, int]:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    records = payload = 0
    for record in ArchiveIterator(str(path), record_types=WarcRecordType.any_type, quirks_mode=True, fsspec_args=False):
        records += 1
        if record.record_type == WarcRecordType.response:
            record.parse_http(quirks_mode=True)
            payload += len(record.reader.read())
    return records, payload


def _read_warcio(path: Path) -> tuple[int, int]:
    from warcio.archiveiterator import ArchiveIterator

    records = payload = 0
    with open(path, "rb") as handle:
        for record in ArchiveIterator(handle):
            records += 1
            if record.rec_type == "response":
                payload += len(record.content_stream().read())
    return records, payload


def worker(reader: str, repeat: int) -> dict[str, float]:
    read = {"fastwarc": _read_fastwarc, "warcio": _read_warcio}[reader]
    files = _files()
    read(files[0])  # imports and first-touch costs stay out of the timing
    records = payload = 0
    started = time.process_time()
    for _ in range(repeat):
        for path in files:
            n, size = read(path)
            records += n
            payload += size
    seconds = time.process_time() - started
    return {
        "records": records,
        "payload_bytes": payload,
        "cpu_seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def write_result(lines: list[str], out: Path) -> None:
    """Print a bench's result and store it where bench/results/ keeps it."""
    text = "\n".join(lines)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="passes over the files in one process")
    parser.add_argument("--rounds", type=int, default=5, help="processes per reader, interleaved; the median counts")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "warc_read.txt")
    parser.add_argument("--worker", choices=READERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.repeat)))
        return
    files = _files()
    if not files:
        sys.exit(f"no WARC files under {SHARED / 'web' / 'warc'}")
    machine_load = check_load()
    rounds: dict[str, list[dict[str, float]]] = {reader: [] for reader in READERS}

    def run(reader: str) -> None:
        command = [sys.executable, __file__, "--worker", reader, "--repeat", str(args.repeat)]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        rounds[reader].append(json.loads(done.stdout))

    interleaved({reader: (lambda reader=reader: run(reader)) for reader in READERS}, args.rounds)
    # Each worker times its own CPU seconds (interpreter start and imports left out).
    cpu = {reader: Timing([r["cpu_seconds"] for r in rounds[reader]]) for reader in READERS}
    from importlib.metadata import version

    compressed = args.repeat * sum(f.stat().st_size for f in files)
    lines = [
        machine_load,
        f"WARC reading: {len(files)} shared WARC files ({sum(f.stat().st_size for f in files) / 1e6:.2f} MB gzipped),"
        f" {args.repeat} passes in one process per round, {args.rounds} rounds interleaved; CPU seconds",
    ]
    for reader in READERS:
        r, t = rounds[reader][-1], cpu[reader]
        lines.append(
            f"  {reader} {version(reader):8s} {r['records']:7d} records  {r['records'] / t.median:9.0f} records/s"
            f"  {compressed / t.median / 1e6:6.1f} MB/s (gzipped)  payload {r['payload_bytes'] / 1e6:7.1f} MB"
            f"  peak RSS {max(x['peak_rss_mb'] for x in rounds[reader]):.0f} MB  ({t})"
        )
    if rounds["fastwarc"][-1]["records"] != rounds["warcio"][-1]["records"]:
        lines.append("  note: the readers counted different numbers of records")
    ratio = cpu["warcio"].median / cpu["fastwarc"].median
    lines.append(f"fastwarc / warcio: {ratio:.1f}x records per CPU second (ratio of the medians)")
    lines.append(check_load("after the run"))
    write_result(lines, args.out)


if __name__ == "__main__":
    main()
