"""Bench: url-filter against datatrove's URLFilter, same URLs, same lists: speed, memory, agreement.

    .venv/bin/python bench/url_filter.py [--repeat 3] [--out bench/results/url_filter.txt]

Lists: those datatrove 0.10.1 ships (its snapshot of UT1's `adult` category: 4.56 M domains,
19,586 URLs; its banned, soft-banned and banned-sub words), read from `.venv-bench` at run time.
URLs: the real page URLs of ../shared/data/web (the WARC-Target-URI of every record of the
shared WARCs, the 181 article URLs of the extraction benchmark) and URLs on listed hosts: every
500th listed domain as `https://www.D/`, `http://D/index.html` and `https://media.D/`, every
50th listed URL as `http://URL`.

Each side runs in a subprocess of its own and reports its list-loading time, its URLs per CPU
second on the filter calls alone (the median of `--repeat`) and its peak RSS. tokenmill runs
`UrlFilterStage.reason` (the stage's core, without Parquet and Dask); datatrove
`URLFilter.filter` in `.venv-bench` (`make bench-env`; skipped without it). Agreement is
printed as keep/reject agreement and every disagreement with both reasons.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curate_filter import BENCH_PYTHON, ROOT, SHARED  # noqa: E402
from measure import bench_parser, check_load, cpu_timed, emit_report, run_worker, write_result  # noqa: E402

DATATROVE_ASSETS = "lib/python3.11/site-packages/datatrove/assets"
WORD_LISTS = ("banned_words.txt", "soft_banned_words.txt", "banned_subwords.txt")


def real_urls() -> list[str]:
    urls = []
    for warc in sorted((SHARED / "web" / "warc").glob("*.warc.gz")):
        try:
            with gzip.open(warc, "rb") as file:
                data = file.read()
        except (OSError, EOFError):  # the truncated archive: what was read before the cut is enough
            continue
        urls += [m.decode() for m in re.findall(rb"^WARC-Target-URI: <?([^\r\n>]+)>?\r?$", data, re.M)]
    truth = json.loads((SHARED / "web" / "extraction" / "ground-truth.json").read_text())
    urls += [page["url"] for page in truth.values()]
    return [u for u in dict.fromkeys(urls) if u.startswith(("http://", "https://"))]


def listed_urls(lists: Path) -> list[str]:
    domains = (lists / "domains").read_text(errors="replace").splitlines()[::500]
    urls = (lists / "urls").read_text(errors="replace").splitlines()[::50]
    made = [u for d in domains for u in (f"https://www.{d}/", f"http://{d}/index.html", f"https://media.{d}/")]
    return made + [f"http://{u}" for u in urls]


def ours_worker(lists: str, words: str, urls_path: str, out_path: str, repeat: int) -> None:
    from tokenmill.curate.url_filter import UrlFilterStage, load_blocklists

    urls = json.loads(Path(urls_path).read_text())
    stage = UrlFilterStage(
        blocklist=[f"{lists}/domains", f"{lists}/urls"],
        banned_words=f"{words}/banned_words.txt",
        soft_banned_words=f"{words}/soft_banned_words.txt",
        banned_subwords=f"{words}/banned_subwords.txt",
    )
    start = time.process_time()
    index = load_blocklists(stage._sources)
    load = time.process_time() - start
    timing, reasons = cpu_timed(repeat, lambda: [stage.reason(url, index) for url in urls])
    write_result(out_path, load=load, seconds=timing.median, spread=timing.spread, reasons=reasons)


def datatrove_worker(urls_path: str, out_path: str, repeat: int) -> None:
    """Runs inside .venv-bench."""
    import logging
    from importlib.metadata import version

    from datatrove.data import Document
    from datatrove.pipeline.filters import URLFilter

    logging.disable(logging.ERROR)  # tldextract reports that it cannot fetch the suffix list, then uses its own
    urls = json.loads(Path(urls_path).read_text())
    url_filter = URLFilter()
    start = time.process_time()
    url_filter.download_data()  # extracts and reads its bundled lists
    url_filter.filter(Document(text="", id="warm", metadata={"url": "https://example.com/"}))
    load = time.process_time() - start

    def run():
        results = []
        for i, url in enumerate(urls):
            verdict = url_filter.filter(Document(text="", id=str(i), metadata={"url": url}))
            results.append(None if verdict is True else verdict[1])
        return results

    timing, reasons = cpu_timed(repeat, run)
    write_result(
        out_path, load=load, seconds=timing.median, spread=timing.spread, reasons=reasons, version=version("datatrove")
    )


def main() -> int:

    parser = bench_parser(__doc__, ours_args=4, peer_args=2)
    parser.add_argument("--examples", type=int, default=3, help="disagreements shown per pair of reasons")
    args = parser.parse_args()
    if run_worker(args, ours_worker, datatrove_worker):
        return 0

    machine_load = check_load()
    assets = BENCH_PYTHON.parent.parent / DATATROVE_ASSETS
    if not (assets / "url_filterblacklistsv0_3_0.tar.gz").exists():
        print(f"skipped: the lists come with datatrove in {BENCH_PYTHON.parent.parent} (`make bench-env`)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        lists = Path(tmp) / "lists"
        with tarfile.open(assets / "url_filterblacklistsv0_3_0.tar.gz") as tar:
            tar.extractall(lists, filter="data")
        real = real_urls()
        urls = real + listed_urls(lists)
        urls_path = Path(tmp) / "urls.json"
        urls_path.write_text(json.dumps(urls))
        script = str(Path(__file__).resolve())
        repeat = ["--repeat", str(args.repeat)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        ours_out, peer_out = Path(tmp) / "ours.json", Path(tmp) / "peer.json"
        subprocess.run(
            [sys.executable, script, "--ours-worker", str(lists), str(assets), str(urls_path), str(ours_out), *repeat],
            check=True,
            env=env,
        )
        subprocess.run(
            [str(BENCH_PYTHON), script, "--datatrove-worker", str(urls_path), str(peer_out), *repeat], check=True
        )
        ours, peer = json.loads(ours_out.read_text()), json.loads(peer_out.read_text())

    n = len(urls)
    lines = [
        f"# bench/url_filter.py  ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)",
        f"URLs: {n} ({len(real)} real page URLs from ../shared/data/web, {n - len(real)} on hosts or URLs of the list)",
        f"lists: datatrove {peer['version']}'s bundled UT1 adult snapshot and word lists",
        f"timing: CPU seconds of one process, filter calls the median of {args.repeat} passes"
        " (spread: slowest - fastest over median)",
        machine_load,
        "",
        f"{'':24} {'load lists':>11} {'URLs/CPU s':>12} {'spread':>7} {'peak RSS':>10} {'rejected':>9}",
    ]
    for label, side in (("tokenmill url-filter", ours), ("datatrove URLFilter", peer)):
        rejected = sum(r is not None for r in side["reasons"])
        lines.append(
            f"{label:24} {side['load']:>10.1f}s {n / side['seconds']:>12,.0f} {side['spread']:>7.0%}"
            f" {side['peak_rss_mib']:>7.0f} MiB"
            f" {rejected:>9}"
        )
    lines.append("")
    lines.append(f"ratio: {peer['seconds'] / ours['seconds']:.2f}x datatrove's URLs per CPU second")
    for label, part in (("real page URLs", slice(0, len(real))), ("URLs on the list", slice(len(real), n))):
        mine, theirs = ours["reasons"][part], peer["reasons"][part]
        agree = sum((x is None) == (y is None) for x, y in zip(mine, theirs))
        lines.append(
            f"{label}: tokenmill rejects {sum(x is not None for x in mine)}, datatrove {sum(y is not None for y in theirs)}"
            f" of {len(mine)}; keep/reject agree on {agree}"
        )
    pairs = Counter((a, b) for a, b in zip(ours["reasons"], peer["reasons"]) if (a is None) != (b is None))
    if pairs:
        lines.append("disagreements (tokenmill | datatrove: URLs):")
        for (a, b), count in pairs.most_common():
            examples = [u for u, x, y in zip(urls, ours["reasons"], peer["reasons"]) if (x, y) == (a, b)]
            lines.append(f"  {a or 'kept'} | {b or 'kept'}: {count}  e.g. {', '.join(examples[: args.examples])}")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
