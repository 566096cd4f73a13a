"""Bench: PII replacement, documents per CPU second, tokenmill's pii stage vs datatrove's PIIFormatter.

    .venv/bin/python bench/pii.py [--repeat 3] [--out bench/results/pii.txt]

Documents: the real text in ../shared/data -- WikiText-2 (valid + test) articles, Shakespeare
in scenes of 30 speeches and one speech per document (bench/curate_filter.py's sets), and the
181 article bodies of the web extraction benchmark (news and blog pages, with real e-mail
addresses and phone numbers).

Both sides run in a subprocess of their own, on the same documents, timed on the replacement
calls alone, the median of `--repeat` passes, in CPU seconds of the process (`time.process_time`,
so per core, and steady under other load); each reports its peak RSS. tokenmill's side calls
`PiiStage.redact` (the stage's core, without Parquet and Dask) twice: with e-mail and IP only
(the work PIIFormatter does by default: e-mails and public IPv4 addresses) and with all three
kinds. datatrove runs in `.venv-bench` (`make bench-env`); without it that side is skipped.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curate_filter import BENCH_PYTHON, ROOT, SHARED, corpus_documents  # noqa: E402
from measure import bench_parser, check_load, cpu_timed, emit_report, run_worker, write_result  # noqa: E402


def documents() -> list[tuple[str, str]]:
    docs = corpus_documents(sets=("wikitext", "scene", "speech"))
    truth = json.loads((SHARED / "web" / "extraction" / "ground-truth.json").read_text(encoding="utf-8"))
    docs += [(f"web-{key[:12]}", page["articleBody"]) for key, page in truth.items()]
    return docs


def ours_worker(in_path: str, out_path: str, repeat: int) -> None:
    from collections import Counter

    from tokenmill.curate.pii import PiiStage

    texts = [d["text"] for d in json.loads(Path(in_path).read_text())]
    report = {}
    for label, kinds in (("email+ip", ["email", "ip"]), ("email+ip+phone", ["email", "ip", "phone"])):
        stage = PiiStage(kinds=kinds)
        stats: Counter = Counter()

        def run(stage=stage, stats=stats):
            stats.clear()
            return [stage.redact(text, stats) for text in texts]

        timing, _ = cpu_timed(repeat, run)
        report[label] = {"seconds": timing.median, "spread": timing.spread, "stats": dict(stats)}
    write_result(out_path, **report)


def datatrove_worker(in_path: str, out_path: str, repeat: int) -> None:
    """Runs inside .venv-bench."""
    from importlib.metadata import version

    from datatrove.pipeline.formatters import PIIFormatter

    texts = [d["text"] for d in json.loads(Path(in_path).read_text())]
    formatter = PIIFormatter()
    formatter.format("warm-up a@example.com 8.8.8.8")
    timing, outputs = cpu_timed(repeat, lambda: [formatter.format(text) for text in texts])
    # Its replacements are example addresses: count those that were not in the input.
    emails = ("email@example.com", "firstname.lastname@example.org")
    ips = ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11", "18.104.22.168")

    def added(strings):
        return sum(out.count(s) - text.count(s) for text, out in zip(texts, outputs) for s in strings)

    write_result(
        out_path,
        seconds=timing.median,
        spread=timing.spread,
        emails=added(emails),
        ips=added(ips),
        version=version("datatrove"),
    )


def main() -> int:
    parser = bench_parser(__doc__, ours_args=2, peer_args=2)
    args = parser.parse_args()
    if run_worker(args, ours_worker, datatrove_worker):
        return 0

    load = check_load()
    docs = documents()
    n_chars = sum(len(text) for _, text in docs)
    lines = [
        f"# bench/pii.py  ({time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, {os.cpu_count()} cores)",
        f"documents: {len(docs)} ({n_chars / 1e6:.1f} M characters): WikiText-2 articles, Shakespeare scenes and"
        " speeches, 181 web article bodies",
        f"timing: CPU seconds of one process, the median of {args.repeat} passes (spread: slowest - fastest over median)",
        load,
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        in_path = Path(tmp) / "docs.json"
        in_path.write_text(json.dumps([{"id": i, "text": t} for i, t in docs]))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        ours_out = Path(tmp) / "ours.json"
        script = str(Path(__file__).resolve())
        repeat = ["--repeat", str(args.repeat)]
        subprocess.run(
            [sys.executable, script, "--ours-worker", str(in_path), str(ours_out), *repeat], check=True, env=env
        )
        ours = json.loads(ours_out.read_text())
        peer = None
        if BENCH_PYTHON.exists():
            peer_out = Path(tmp) / "peer.json"
            subprocess.run(
                [str(BENCH_PYTHON), script, "--datatrove-worker", str(in_path), str(peer_out), *repeat],
                check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            peer = json.loads(peer_out.read_text())

    def rate(seconds: float) -> float:
        return len(docs) / seconds

    lines.append(f"{'':42} {'docs/CPU s':>12} {'spread':>7} {'found':>28}")
    for label, result in (
        ("tokenmill pii (email, ip)", ours["email+ip"]),
        ("tokenmill pii (email, ip, phone)", ours["email+ip+phone"]),
    ):
        stats = result["stats"]
        found = f"{stats.get('pii.email', 0)} emails, {stats.get('pii.ip_address', 0)} IPs, {stats.get('pii.phone', 0)} phones"
        lines.append(f"{label:42} {rate(result['seconds']):>12,.0f} {result['spread']:>7.0%} {found:>28}")
    lines.append(f"{'':42} peak RSS {ours['peak_rss_mib']:.0f} MiB")
    if peer is None:
        lines.append(f"datatrove: skipped ({BENCH_PYTHON} not found; `make bench-env` creates it)")
    else:
        found = f"{peer['emails']} emails, {peer['ips']} IPs"
        lines.append(
            f"{'datatrove ' + peer['version'] + ' PIIFormatter':42} {rate(peer['seconds']):>12,.0f}"
            f" {peer['spread']:>7.0%} {found:>28}"
        )
        lines.append(f"{'':42} peak RSS {peer['peak_rss_mib']:.0f} MiB")
        lines.append("")
        lines.append(
            f"ratio, same kinds (email, ip): {peer['seconds'] / ours['email+ip']['seconds']:.2f}x datatrove's documents"
            " per CPU second"
        )
        lines.append(
            f"ratio, with phones too:        {peer['seconds'] / ours['email+ip+phone']['seconds']:.2f}x (datatrove finds"
            " no phone numbers)"
        )
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
