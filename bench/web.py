"""Bench: WARC -> extracted text documents per CPU second, tokenmill against datatrove.

    .venv/bin/python bench/web.py [--repeat 5] [--out bench/results/web.txt]

Input: the gzipped WARCs in ../shared/data/web/warc that both readers read in full (Common
Crawl, wget and the whirlwind page). Before timing, each side's reader counts the HTML documents
it finds in every shared WARC (truncated and ClueWeb ones included), so differences in what the
readers take from the same archive are printed too. Both sides turn every HTML response into text with
the same extractor, `trafilatura.extract` with datatrove's settings for it
(`favor_precision=True, include_comments=False, deduplicate=True`), and count the documents
with text.

- tokenmill: our WARC reading (`tokenmill.curate.webarchive.WarcFile`: FastWARC, HTTP decoding,
  charset) feeding `trafilatura.extract`, in this process.
- datatrove: its `WarcReader` (warcio, cchardet) feeding its `Trafilatura` extractor, run in
  datatrove's own virtual environment (`make bench-env`, `.venv-bench`, or
  `TOKENMILL_BENCH_PYTHON`) as a subprocess started by this script with `--datatrove-worker`.
  Its extractor runs trafilatura in a sandbox process (for its per-document timeout, raised
  here to 60 s so that no page times out); that process's CPU time is counted with its parent's. Without the environment the peer is skipped.

Each side is one process (one core); the figure is documents per CPU second (user + system,
children included) of the best of `--repeat` passes, which does not swing with the load of
other processes on a shared machine. Peak RSS is of the whole side.
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

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
BENCH_PYTHON = Path(os.environ.get("TOKENMILL_BENCH_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))
# trafilatura.extract's arguments in datatrove's Trafilatura extractor (its defaults).
PEER_TIMEOUT_S = 60
EXTRACT_KWARGS = {"favor_precision": True, "include_comments": False, "deduplicate": True}


def all_warc_files() -> list[Path]:
    return sorted((SHARED / "web" / "warc").glob("*.warc.gz"))


def warc_files() -> list[Path]:
    # datatrove reads nothing of the ClueWeb file (its empty WARC-Identified-Payload-Type fails the
    # text/html check) and both stop differently in the truncated one: timed on the others.
    return [p for p in all_warc_files() if not p.name.startswith(("truncated", "clueweb"))]


def tokenmill_counts() -> dict[str, int]:
    from tokenmill.curate.webarchive import WarcFile

    return {p.name: sum(len(o.kept) for o in WarcFile(str(p), "bench").run()) for p in all_warc_files()}


def datatrove_counts() -> dict[str, int]:
    from datatrove.pipeline.readers.warc import process_record
    from warcio.archiveiterator import ArchiveIterator

    counts = {}
    for path in all_warc_files():
        n = 0
        with open(path, "rb") as handle:
            try:
                for record in ArchiveIterator(handle):
                    n += process_record(record) is not None
            except Exception:  # warcio's error at a truncated archive: keep the count so far
                pass
        counts[path.name] = n
    return counts


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have finished."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def peak_rss_mb() -> float:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (self_kb + children_kb) / 1024


def best_pass(one_pass, repeat: int, reset=None) -> dict[str, float]:
    best: dict[str, float] | None = None
    for _ in range(repeat):
        if reset is not None:
            reset()
        started_cpu, started_wall = cpu_seconds(), time.perf_counter()
        responses, extracted, chars = one_pass()
        cpu, wall = cpu_seconds() - started_cpu, time.perf_counter() - started_wall
        if best is None or cpu < best["cpu_seconds"]:
            best = {"html_docs": responses, "extracted": extracted, "chars": chars, "cpu_seconds": cpu, "wall": wall}
    assert best is not None
    best["docs_per_cpu_s"] = best["extracted"] / best["cpu_seconds"]
    best["peak_rss_mb"] = peak_rss_mb()
    return best


def tokenmill_side(files: list[Path], repeat: int) -> dict[str, float]:
    import trafilatura

    from tokenmill.curate.webarchive import WarcFile

    def one_pass() -> tuple[int, int, int]:
        responses = extracted = chars = 0
        for path in files:
            for output in WarcFile(str(path), "bench").run():
                for html in output.kept["text"]:
                    responses += 1
                    text = trafilatura.extract(html, **EXTRACT_KWARGS)
                    if text:
                        extracted += 1
                        chars += len(text)
        return responses, extracted, chars

    # trafilatura's `deduplicate` remembers text across calls: each pass starts from fresh caches,
    # as datatrove's extractor does in the new sandbox process it starts for each pass.
    from trafilatura.meta import reset_caches

    return best_pass(one_pass, repeat, reset_caches)


def datatrove_side(files: list[Path], repeat: int) -> dict[str, float]:
    """Runs inside .venv-bench: datatrove's WarcReader + Trafilatura over the same files."""
    import shutil
    import tempfile

    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    folder = Path(tempfile.mkdtemp())
    try:
        for path in files:  # WarcReader reads a folder; links keep the bytes where they are
            (folder / path.name).symlink_to(path)

        def one_pass() -> tuple[int, int, int]:
            reader = WarcReader(str(folder), glob_pattern="*.warc.gz")
            # favour_precision=True, deduplicate=True as by default; its default 1 s timeout per
            # document is raised so that a loaded machine does not turn slow pages into timeouts
            # (which would cut its work, and restart its sandbox) -- both sides extract every page.
            extractor = Trafilatura(timeout=PEER_TIMEOUT_S)
            responses = extracted = chars = 0

            def counted():
                nonlocal responses
                for document in reader.run():
                    responses += 1
                    yield document

            for document in extractor.run(counted()):
                if document.text:
                    extracted += 1
                    chars += len(document.text)
            return responses, extracted, chars

        return best_pass(one_pass, repeat)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "web.txt")
    parser.add_argument("--datatrove-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    files = warc_files()
    if args.datatrove_worker:
        import logging

        logging.disable(logging.WARNING)
        from loguru import logger

        logger.remove()  # datatrove logs every step's stats
        timed = datatrove_side(files, args.repeat)
        started = cpu_seconds()  # after the timed passes: imports are warm, as on our side
        counts = datatrove_counts()
        read_cpu = cpu_seconds() - started
        print(json.dumps({**timed, "counts": counts, "read_cpu": read_cpu}))
        return
    if not files:
        sys.exit(f"no WARC files under {SHARED / 'web' / 'warc'}")
    from importlib.metadata import version

    ours = tokenmill_side(files, args.repeat)
    started = cpu_seconds()
    our_counts = tokenmill_counts()
    our_read_cpu = cpu_seconds() - started
    lines = [
        f"WARC -> extracted text: {len(files)} shared WARC files ({', '.join(p.name for p in files)}),"
        f" trafilatura {version('trafilatura')} extract({', '.join(f'{k}={v}' for k, v in EXTRACT_KWARGS.items())})"
        f" on both sides; best of {args.repeat} passes; one process (core) each; CPU seconds incl. children",
        f"  tokenmill (fastwarc {version('fastwarc')}): {ours['html_docs']} HTML documents, {ours['extracted']} with text"
        f" ({ours['chars']} chars) in {ours['cpu_seconds']:.2f} CPU s (wall {ours['wall']:.2f} s):"
        f" {ours['docs_per_cpu_s']:.1f} docs per CPU second, peak RSS {ours['peak_rss_mb']:.0f} MB",
    ]
    if not BENCH_PYTHON.exists():
        lines.append(f"  datatrove: skipped, no environment at {BENCH_PYTHON} (make bench-env)")
    else:
        done = subprocess.run(
            [str(BENCH_PYTHON), __file__, "--datatrove-worker", "--repeat", str(args.repeat)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if done.returncode != 0:
            sys.exit(f"datatrove worker failed:\n{done.stderr[-3000:]}")
        peer = json.loads(done.stdout.strip().splitlines()[-1])
        peer_versions = subprocess.run(
            [
                str(BENCH_PYTHON),
                "-c",
                "from importlib.metadata import version as v; print(v('datatrove'), v('warcio'))",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        lines.append(
            f"  datatrove {peer_versions[0]} (warcio {peer_versions[1]}, in {BENCH_PYTHON.parent.parent.name},"
            f" a subprocess): {peer['html_docs']} HTML documents, {peer['extracted']} with text ({peer['chars']} chars)"
            f" in {peer['cpu_seconds']:.2f} CPU s (wall {peer['wall']:.2f} s): {peer['docs_per_cpu_s']:.1f} docs per"
            f" CPU second, peak RSS {peer['peak_rss_mb']:.0f} MB"
        )
        lines.append(
            "HTML documents found per shared WARC (tokenmill / datatrove); reading alone (no extraction), all 6"
            f" files: {our_read_cpu:.3f} / {peer['read_cpu']:.3f} CPU s"
        )
        for name, n in our_counts.items():
            lines.append(f"  {name}: {n} / {peer['counts'].get(name)}")
        lines.append(
            f"tokenmill / datatrove: {ours['docs_per_cpu_s'] / peer['docs_per_cpu_s']:.2f}x documents with text per"
            f" CPU second ({ours['wall'] and peer['wall'] / ours['wall']:.2f}x wall)"
        )
    from warc_read import write_result  # bench/ is this script's directory, first on sys.path

    write_result(lines, args.out)


if __name__ == "__main__":
    main()
