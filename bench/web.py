"""Bench: WARC -> extracted text documents per CPU second, tokenmill against datatrove.

    .venv/bin/python bench/web.py [--repeat 3] [--cycles 5] [--out bench/results/web.txt]

Input: the gzipped WARCs in ../shared/data/web/warc that both readers read in full (Common
Crawl, wget and the whirlwind page). Before timing, each side's reader counts the HTML documents
it finds in every shared WARC (truncated and ClueWeb ones included), so differences in what the
readers take from the same archive are printed too. Two comparisons:

(a) the same extractor: both sides call `trafilatura.extract(html, include_comments=False)`
    (our `trafilatura` extractor; datatrove's `Trafilatura(favour_precision=False,
    deduplicate=False)`, which then passes exactly those arguments).
(b) the defaults: our `lean` extractor against datatrove's `Trafilatura()` (favour_precision and
    deduplicate on).

- tokenmill: the stages' own code, `WarcFile` (what ingest runs per archive: FastWARC, HTTP
  decoding, charset) feeding each batch to `ExtractStage.process` (what the extract stage runs
  per partition: its checks, then every page through its extractor child process).
- datatrove: its `WarcReader` (warcio, cchardet) feeding its `Trafilatura` extractor, run in
  datatrove's own virtual environment (`make bench-env`, `.venv-bench`, or
  `TOKENMILL_BENCH_PYTHON`) as a subprocess started by this script with `--datatrove-worker`.
  Its extractor runs trafilatura in a sandbox process (for its per-document timeout, raised
  here to 60 s so that no page times out); that process's CPU time is counted with its parent's.
  Without the environment the peer is skipped.

Each side is one process (one core); the figure is documents per CPU second (user + system,
children included) of the median of `--repeat` passes, with their spread; CPU time swings less
with the load of other processes on a shared machine than wall time. Peak RSS is of the whole side. A pass reads the files
`--cycles` times over, as a worker reads many archives: the one-off start of an extractor
process is then paid once per pass on both sides, not once per few dozen pages.

Beside each comparison, the extractor alone: the same extractor function called in this process
on the same decoded pages, nothing else. With the same extractor on both sides, that is the floor
of any pipeline's CPU time, so it bounds the ratio any reader + stage code around it can reach
against datatrove (printed as "at most").
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

from measure import Timing, check_load

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
BENCH_PYTHON = Path(os.environ.get("TOKENMILL_BENCH_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))
PEER_TIMEOUT_S = 60
# datatrove's Trafilatura extractor calls trafilatura.extract(html, favor_precision=...,
# include_comments=False, deduplicate=...). "same": both off, so that it makes exactly the call our
# `trafilatura` extractor makes (trafilatura.extract(html, include_comments=False)); "default":
# datatrove's defaults (both on).
PEER_SETTINGS = {
    "same": {"favour_precision": False, "deduplicate": False},
    "default": {"favour_precision": True, "deduplicate": True},
}


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


def median_pass(one_pass, repeat: int, reset=None) -> dict[str, float]:
    """`repeat` passes: the counts of the last, the median CPU seconds (children included) with
    their spread, and the median wall seconds."""
    cpu, wall = [], []
    for _ in range(repeat):
        if reset is not None:
            reset()
        started_cpu, started_wall = cpu_seconds(), time.perf_counter()
        responses, extracted, chars = one_pass()
        cpu.append(cpu_seconds() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    timing = Timing(cpu)
    return {
        "html_docs": responses,
        "extracted": extracted,
        "chars": chars,
        "cpu_seconds": timing.median,
        "spread": timing.spread,
        "wall": Timing(wall).median,
        "docs_per_cpu_s": extracted / timing.median,
        "peak_rss_mb": peak_rss_mb(),
    }


def tokenmill_side(files: list[Path], repeat: int, extractor: str, cycles: int) -> dict[str, float]:
    """The stages' own code: `WarcFile` (what ingest runs per archive) feeding each batch to
    `ExtractStage.process` (what the extract stage runs per partition: its checks, then each page
    through its extractor child process), without the Parquet writing between them."""
    from tokenmill.curate.extract.stage import ExtractStage, _close_processes
    from tokenmill.curate.webarchive import WarcFile

    stage = ExtractStage(extractor=extractor, timeout=PEER_TIMEOUT_S)

    def one_pass() -> tuple[int, int, int]:
        responses = extracted = chars = 0
        for path in [p for _ in range(cycles) for p in files]:
            for output in WarcFile(str(path), "bench").run():
                responses += len(output.kept)
                result = stage.process(output.kept)
                extracted += len(result.kept)
                chars += int(result.kept["text"].str.len().sum())
        # The child exits here, so its CPU time is counted with this pass, and the next pass
        # starts a fresh one, as datatrove starts a fresh sandbox per pass.
        _close_processes()
        return responses, extracted, chars

    return median_pass(one_pass, repeat)


def extractor_alone(files: list[Path], repeat: int, extractor: str, cycles: int) -> dict[str, float]:
    """The extractor function alone, in this process, on the pages `WarcFile` decodes from the same
    files: the CPU time no pipeline around this extractor can go below."""
    from tokenmill.curate.extract.html_text import EXTRACTORS
    from tokenmill.curate.extract.stage import is_html_type
    from tokenmill.curate.webarchive import WarcFile

    pages = []
    for path in files:
        for output in WarcFile(str(path), "bench").run():
            pages += [
                html for html, kind in zip(output.kept["text"], output.kept["content_type"]) if is_html_type(kind)
            ]
    extract = EXTRACTORS[extractor]
    extract(pages[0])  # lazy imports and first-use set-up, as the stage's child does before timing

    def one_pass() -> tuple[int, int, int]:
        extracted = chars = 0
        for _ in range(cycles):
            for html in pages:
                text = (extract(html) or "").strip()
                extracted += bool(text)
                chars += len(text)
        return len(pages) * cycles, extracted, chars

    return median_pass(one_pass, repeat)


def child_start_cpu(extractor: str, repeat: int) -> float:
    """CPU seconds of starting the stage's extractor child (a fresh interpreter importing the
    extractor) and extracting one tiny page: the fixed part of each pass, paid in a real run once
    per worker and per `recycle_after` pages."""
    from tokenmill.curate.extract.html_text import ExtractorProcess

    seconds = []
    for _ in range(repeat):
        started = cpu_seconds()
        process = ExtractorProcess(extractor, timeout=PEER_TIMEOUT_S, recycle_after=1)
        process.extract("<html><body><p>One short paragraph of text.</p></body></html>")
        process.close()
        seconds.append(cpu_seconds() - started)
    return Timing(seconds).median


def datatrove_side(files: list[Path], repeat: int, settings: str, cycles: int) -> dict[str, float]:
    """Runs inside .venv-bench: datatrove's WarcReader + Trafilatura over the same files."""
    import shutil
    import tempfile

    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    folder = Path(tempfile.mkdtemp())
    try:
        for cycle in range(cycles):  # WarcReader reads a folder; links keep the bytes where they are
            for path in files:
                (folder / f"{cycle}-{path.name}").symlink_to(path)

        def one_pass() -> tuple[int, int, int]:
            reader = WarcReader(str(folder), glob_pattern="*.warc.gz")
            # Its default 1 s timeout per document is raised so that a loaded machine does not turn
            # slow pages into timeouts (which would cut its work, and restart its sandbox) -- both
            # sides extract every page.
            extractor = Trafilatura(timeout=PEER_TIMEOUT_S, **PEER_SETTINGS[settings])
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

        return median_pass(one_pass, repeat)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# (title, our extractor, datatrove's settings) of each comparison.
COMPARISONS = (
    ("(a) same extractor: trafilatura.extract(html, include_comments=False) on both sides", "trafilatura", "same"),
    ("(b) defaults: our ingest + extract (lean) against datatrove's WarcReader + Trafilatura()", "lean", "default"),
)


def run_peer(settings: str, repeat: int, cycles: int) -> dict:
    done = subprocess.run(
        [str(BENCH_PYTHON), __file__, "--datatrove-worker", settings, "--repeat", str(repeat), "--cycles", str(cycles)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        sys.exit(f"datatrove worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe(name: str, side: dict) -> str:
    return (
        f"  {name}: {side['html_docs']} HTML documents, {side['extracted']} with text ({side['chars']} chars) in"
        f" {side['cpu_seconds']:.2f} CPU s (spread {side['spread']:.0%}; wall {side['wall']:.2f} s):"
        f" {side['docs_per_cpu_s']:.1f} docs per CPU"
        f" second, peak RSS {side['peak_rss_mb']:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=5, help="times each pass reads the files (default 5)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "web.txt")
    parser.add_argument("--datatrove-worker", choices=list(PEER_SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    files = warc_files()
    if args.datatrove_worker:
        import logging

        logging.disable(logging.WARNING)
        from loguru import logger

        logger.remove()  # datatrove logs every step's stats
        timed = datatrove_side(files, args.repeat, args.datatrove_worker, args.cycles)
        started = cpu_seconds()  # after the timed passes: imports are warm, as on our side
        counts = datatrove_counts()
        read_cpu = cpu_seconds() - started
        print(json.dumps({**timed, "counts": counts, "read_cpu": read_cpu}))
        return
    if not files:
        sys.exit(f"no WARC files under {SHARED / 'web' / 'warc'}")
    machine_load = check_load()
    from importlib.metadata import version

    lines = [
        machine_load,
        f"WARC -> extracted text: {len(files)} shared WARC files ({', '.join(p.name for p in files)});"
        f" trafilatura {version('trafilatura')}, fastwarc {version('fastwarc')}; the median of {args.repeat} passes, each"
        f" reading the files {args.cycles} times;"
        " one process each (its extractor child / sandbox included); CPU seconds incl. children",
    ]
    peer_counts: dict | None = None
    for title, extractor, settings in COMPARISONS:
        ours = tokenmill_side(files, args.repeat, extractor, args.cycles)
        alone = extractor_alone(files, args.repeat, extractor, args.cycles)
        lines += [title, describe(f"tokenmill (WarcFile + ExtractStage, extractor={extractor})", ours)]
        lines.append(f"    of which starting the extractor child: {child_start_cpu(extractor, args.repeat):.2f} CPU s")
        lines.append(
            f"  the extractor alone ({extractor}, in one process, same pages): {alone['cpu_seconds']:.2f} CPU s,"
            f" {alone['docs_per_cpu_s']:.1f} docs per CPU second; tokenmill's reading, checks and child cost"
            f" {100 * (1 - alone['cpu_seconds'] / ours['cpu_seconds']):.0f}% of its time"
        )
        if not BENCH_PYTHON.exists():
            lines.append(f"  datatrove: skipped, no environment at {BENCH_PYTHON} (make bench-env)")
            continue
        peer = run_peer(settings, args.repeat, args.cycles)
        peer_counts = peer
        arguments = ", ".join(f"{k}={v}" for k, v in PEER_SETTINGS[settings].items())
        lines.append(describe(f"datatrove (WarcReader + Trafilatura({arguments}))", peer))
        lines.append(
            f"  tokenmill / datatrove: {ours['docs_per_cpu_s'] / peer['docs_per_cpu_s']:.2f}x documents with text"
            f" per CPU second ({peer['wall'] / ours['wall']:.2f}x wall); at most"
            f" {alone['docs_per_cpu_s'] / peer['docs_per_cpu_s']:.2f}x with this extractor (the extractor alone"
            " against datatrove's whole pass)"
        )
    started = cpu_seconds()
    our_counts = tokenmill_counts()
    our_read_cpu = cpu_seconds() - started
    if peer_counts is not None:
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
            f"datatrove {peer_versions[0]} (warcio {peer_versions[1]}, in {BENCH_PYTHON.parent.parent.name}, a"
            " subprocess). HTML documents found per shared WARC (tokenmill / datatrove); reading alone (no"
            f" extraction), all {len(our_counts)} files: {our_read_cpu:.3f} / {peer_counts['read_cpu']:.3f} CPU s"
        )
        for name, n in our_counts.items():
            lines.append(f"  {name}: {n} / {peer_counts['counts'].get(name)}")
    from warc_read import write_result  # bench/ is this script's directory, first on sys.path

    write_result(lines, args.out)


if __name__ == "__main__":
    main()
