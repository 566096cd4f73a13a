"""Bench: reading WARC files, FastWARC against warcio, on the shared WARCs.

    .venv/bin/python bench/warc_read.py [--repeat 20] [--out bench/results/warc_read.txt]

Both readers do the same work a WARC ingest does: iterate every record of every gzipped WARC in
../shared/data/web/warc (the truncated one left out: the readers differ in how they stop), parse
the HTTP headers of responses and read their payloads. Each reader runs in its own subprocess
(so peak RSS is its own), `--repeat` passes over the files; the figures are records and
compressed megabytes per CPU second of that process, and its peak RSS.
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

from measure import check_load

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
    compressed = repeat * sum(f.stat().st_size for f in files)
    return {
        "records": records,
        "payload_bytes": payload,
        "cpu_seconds": seconds,
        "records_per_s": records / seconds,
        "mb_per_s": compressed / seconds / 1e6,
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
    parser.add_argument("--repeat", type=int, default=20)
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
    results = {}
    for reader in READERS:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", reader, "--repeat", str(args.repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
        results[reader] = json.loads(done.stdout)
    from importlib.metadata import version

    lines = [
        machine_load,
        f"WARC reading: {len(files)} shared WARC files ({sum(f.stat().st_size for f in files) / 1e6:.2f} MB gzipped),"
        f" {args.repeat} passes, one process each; CPU seconds",
    ]
    for reader in READERS:
        r = results[reader]
        lines.append(
            f"  {reader} {version(reader):8s} {r['records']:7d} records  {r['records_per_s']:9.0f} records/s"
            f"  {r['mb_per_s']:6.1f} MB/s (gzipped)  payload {r['payload_bytes'] / 1e6:7.1f} MB"
            f"  peak RSS {r['peak_rss_mb']:.0f} MB"
        )
    if results["fastwarc"]["records"] != results["warcio"]["records"]:
        lines.append("  note: the readers counted different numbers of records")
    ratio = results["fastwarc"]["records_per_s"] / results["warcio"]["records_per_s"]
    lines.append(f"fastwarc / warcio: {ratio:.1f}x records per CPU second")
    write_result(lines, args.out)


if __name__ == "__main__":
    main()
