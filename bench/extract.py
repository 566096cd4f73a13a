"""HTML -> main text: quality and speed of each extractor on the article-extraction benchmark,
and memory over a long run.

    python bench/extract.py [--long-run 3000] [--repeat 2]

Quality, on each gold set: the 181 pages of ../shared/data/web/extraction, and the set
bench/extract_goldset.py assembles (Readability's test pages, when it has been run), scored with
the benchmark's own metric
(`tokenmill.curate.extract.html_text.extraction_scores`: word 4-gram shingle multisets, mean per-page
precision and recall, F1 of the means), beside the figures the benchmark publishes. Speed: pages
per CPU second (process time of the extracting process, the median of --repeat passes over the
pages, with their spread; CPU time, so the load of a shared machine counts as little as it can). Each extractor runs in its own
process, so its peak RSS (ru_maxrss) is its own. Peers: trafilatura (its default path and its
fast mode, comments excluded as the benchmark runs it), Resiliparse with its default
main-content options (as the benchmark runs it) and jusText, run here on the same pages.

Memory: --long-run pages (the 181 pages, cycled) through the default extractor two ways, with the
RSS sampled every 100 pages: in one process (how lxml-based extraction is usually called), and
through the stage's child process recycled every 1,000 pages (ExtractorProcess).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.append(str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402

from bench.measure import check_load, cpu_timed  # noqa: E402

DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
PUBLISHED = {"trafilatura": 0.958, "justext": 0.804}  # the benchmark's README, latest evaluation


def gold_sets() -> dict[str, Path]:
    """The gold sets present: the benchmark's 181 pages, and the one bench/extract_goldset.py assembles."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract_goldset", Path(__file__).with_name("extract_goldset.py"))
    goldset = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(goldset)  # type: ignore[union-attr]
    DEFAULT_CACHE = goldset.DEFAULT_CACHE
    sets = {"article-extraction-benchmark": DATA / "web" / "extraction"}
    if (DEFAULT_CACHE / "ground-truth.json").exists():
        sets["readability-test-pages"] = DEFAULT_CACHE
    return sets


def load_pages(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(key, html, true article body) of each page of a gold set (default the benchmark), in key order."""
    root = root or DATA / "web" / "extraction"
    truth = json.loads((root / "ground-truth.json").read_text())
    pages = []
    for path in sorted((root / "html").glob("*.html.gz")):
        key = path.name.split(".")[0]
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            pages.append((key, f.read(), truth[key]["articleBody"]))
    return pages


def _peer(name: str):
    """A peer extractor run as its authors document it: html -> text."""
    if name == "trafilatura --fast":
        import trafilatura

        return lambda html: trafilatura.extract(html, include_comments=False, fast=True)
    if name == "resiliparse (defaults)":
        from resiliparse.extract.html2text import extract_plain_text

        return lambda html: extract_plain_text(html, main_content=True)
    if name == "justext":
        import justext

        stoplist = justext.get_stoplist("English")

        def run(html: str) -> str:
            paragraphs = justext.justext(html.encode("utf-8"), stoplist)
            return "\n".join(p.text for p in paragraphs if not p.is_boilerplate)

        return run
    raise KeyError(name)


def measure_one(name: str, repeat: int, root: Path) -> dict:
    """In this process: the extractor's scores, pages per CPU second and peak RSS."""
    from tokenmill.curate.extract.html_text import EXTRACTORS, extraction_scores

    extract = EXTRACTORS[name] if name in EXTRACTORS else _peer(name)
    pages = load_pages(root)
    if name.startswith(("trafilatura", "lean")):  # jusText's stop lists load once, on first use
        from trafilatura.external import jt_stoplist_init

        jt_stoplist_init()
    extract(pages[0][1])  # imports and caches outside the timing
    timing, texts = cpu_timed(repeat, lambda: [extract(html) or "" for _, html, _ in pages])
    scores = extraction_scores((true, text) for (_, _, true), text in zip(pages, texts))
    return {
        **scores,
        "pages": len(pages),
        "pages_per_cpu_s": len(pages) / timing.median,
        "spread": timing.spread,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def long_run_in_process(n_pages: int) -> dict:
    from tokenmill.curate.extract.html_text import DEFAULT_EXTRACTOR, extract_page

    pages = [html for _, html, _ in load_pages()]
    samples = []
    for i in range(n_pages):
        extract_page(DEFAULT_EXTRACTOR, pages[i % len(pages)])
        if i % 100 == 99:
            samples.append(rss_mb(os.getpid()))
    return {"samples": samples}


def long_run_child(n_pages: int, recycle_after: int) -> dict:
    from tokenmill.curate.extract.html_text import DEFAULT_EXTRACTOR, ExtractorProcess

    pages = [html for _, html, _ in load_pages()]
    process = ExtractorProcess(DEFAULT_EXTRACTOR, timeout=60, recycle_after=recycle_after)
    samples = []
    try:
        for i in range(n_pages):
            status, _, _ = process.extract(pages[i % len(pages)])
            assert status == "ok", status
            if i % 100 == 99:
                samples.append(rss_mb(process._child.pid) + rss_mb(os.getpid()))
    finally:
        process.close()
    return {"samples": samples, "children": process.started}


def in_subprocess(*args: str) -> dict:
    """Run this script with `args` in a fresh Python and return the JSON it prints."""
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False, env=os.environ.copy()
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe(samples: list[float]) -> str:
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    return (
        f"RSS first third {min(first):.0f}-{max(first):.0f} MB, last third {min(last):.0f}-{max(last):.0f} MB,"
        f" peak {max(samples):.0f} MB"
    )


OURS = ["lean", "lean-fast", "resiliparse"]
PEERS = ["trafilatura", "trafilatura --fast", "resiliparse (defaults)", "justext"]


def quality_and_speed(set_name: str, root: Path, repeat: int) -> None:
    """One table per gold set: every extractor's scores, speed and peak RSS, then our modes'
    speed and F1 against trafilatura's default and fast modes."""
    from tokenmill.curate.extract.html_text import DEFAULT_EXTRACTOR

    published = PUBLISHED if set_name == "article-extraction-benchmark" else {}
    print(f"\n{set_name}: {len(load_pages(root))} pages")
    print(
        f"{'extractor':<24} {'precision':>9} {'recall':>7} {'F1':>6} {'published F1':>12} {'pages/CPU s':>11} {'spread':>6} {'peak RSS':>9}"
    )
    rows = {}
    for name in [*PEERS, *OURS]:
        row = rows[name] = in_subprocess("--one", name, "--repeat", str(repeat), "--root", str(root))
        label = f"{name} (tokenmill)" if name in OURS else name
        label += " *" if name == DEFAULT_EXTRACTOR else ""
        reference = f"{published[name]:.3f}" if name in published else ""
        print(
            f"{label:<24} {row['precision']:>9.3f} {row['recall']:>7.3f} {row['f1']:>6.3f} {reference:>12}"
            f" {row['pages_per_cpu_s']:>11.0f} {row['spread']:>6.0%} {row['peak_rss_mb']:>6.0f} MB",
            flush=True,
        )
    print("* the default. Against trafilatura's default mode and its fast mode (pages per CPU second, F1):")
    for name in OURS:
        parts = []
        for peer in ("trafilatura", "trafilatura --fast"):
            speed = rows[name]["pages_per_cpu_s"] / rows[peer]["pages_per_cpu_s"]
            parts.append(f"{speed:.2f}x {peer}, F1 {rows[name]['f1'] - rows[peer]['f1']:+.3f}")
        print(f"  {name}: " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="timed passes per extractor (the median counts)")
    parser.add_argument("--long-run", type=int, default=3000, help="pages for the memory runs (0: skip)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--memory", choices=["in-process", "child"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.repeat, args.root)))
        return
    if args.memory == "in-process":
        print(json.dumps(long_run_in_process(args.long_run)))
        return
    if args.memory == "child":
        print(json.dumps(long_run_child(args.long_run, recycle_after=1000)))
        return
    check_load()

    from importlib.metadata import version

    print(
        f"trafilatura {version('trafilatura')}, resiliparse {version('resiliparse')}, justext {version('justext')},"
        f" lxml {version('lxml')}; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for set_name, root in gold_sets().items():
        quality_and_speed(set_name, root, args.repeat)
    print(f"load average at end {os.getloadavg()[0]:.1f}")

    if args.long_run:
        from tokenmill.curate.extract.html_text import DEFAULT_EXTRACTOR

        print(f"\nmemory over {args.long_run} pages (the 181 pages cycled), {DEFAULT_EXTRACTOR} extractor:")
        alone = in_subprocess("--memory", "in-process", "--long-run", str(args.long_run))
        print(f"  in one process, no recycling: {describe(alone['samples'])}")
        child = in_subprocess("--memory", "child", "--long-run", str(args.long_run))
        print(
            f"  stage's child process recycled every 1000 pages ({child['children']} children),"
            f" parent + child: {describe(child['samples'])}"
        )


if __name__ == "__main__":
    main()
