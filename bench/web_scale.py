"""Bench: the common-crawl recipe's curation, in one pass and stage by stage, beside datatrove.

    .venv/bin/python bench/web_scale.py [--multiple 20] [--repeat 1] [--out bench/results/web_scale.txt]

What runs, on one core each (one Dask worker with one thread for tokenmill; datatrove's
LocalPipelineExecutor with one worker), over the same WARC files:

- tokenmill, fused: `tokenmill curate chain --stages ingest,extract,langid,url-filter,pii,filter`
  (the recipe's stages before dedup, with its options: the lean extractor, English at 0.65, a
  blocklist, PII replaced, the Gopher/C4/FineWeb rules), rejected documents written as ids;
- tokenmill, stage by stage: the same six stages as six `tokenmill curate STAGE` commands, each
  writing its kept and rejected documents whole (what the recipe did before chains);
- datatrove 0.10, one pass: WarcReader -> Trafilatura (favour_precision, as FineWeb runs it) ->
  LanguageFilter (en, 0.65, on the same fastText lid.176 model) -> URLFilter (the same blocked
  domain) -> PIIFormatter -> GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter ->
  FineWebQualityFilter -> ParquetWriter, in its own virtual environment (`.venv-bench`, with
  `pip install "datatrove[processing]==0.10.0" trafilatura warcio faust-cchardet python-magic spacy pandas
  pyarrow`) in a
  subprocess started with `--datatrove-worker`, as bench/curate_filter.py runs it.

Corpora: the shared WARCs (`../shared/data/web/warc`: the five complete archives, the truncated
one left out), and one `--multiple` times larger: each archive holds its records `--multiple`
times over, each repetition with another WARC-Record-ID and target URI (`?copy=K` appended) so
that every copy is a distinct document to any step that looks at ids or URLs, and with its
text distinct too: in copy K every word of four letters or more in the text of an HTML page
(outside tags and entities; common function words such as `that`, `with`, `which` aside) is
replaced through copy K's permutation of the corpus's own vocabulary, each word by one of the
same length, its capitals kept. A copy keeps its page's markup, punctuation, numbers, short
words, lines and byte length (no WARC or HTTP length changes), the words' frequencies within the
page and over the corpus, and the language its letters say; what it loses is the meaning of
its sentences. So kept text compresses in Parquet as distinct pages in the same language do,
not as exact copies of a page did (0.07 MiB of kept Parquet for 440 kept pages, against 0.43
MiB for 428 reworded ones), which made ids and footers look six times heavier than they are. Pages that are compressed, chunked or not UTF-8 (most of the non-English
ones) are copied as they are. A rule that looks for given words (C4's `javascript` and `lorem
ipsum`) or a language score near its threshold can decide a copy otherwise, so the larger
corpus keeps about, not exactly, twenty times the shared WARCs' pages. datatrove's Trafilatura
runs without its cache of paragraphs seen before, which would empty the copies of the pages
copied as they are. An archive stays one partition, as a crawl's are.

Measured per run: CPU seconds of every process of the run (the command and, for tokenmill, the
Dask scheduler and worker with the worker's extractor processes, by psutil; datatrove's process
and its children), documents per CPU second (= per second per core), wall seconds, the peak
resident memory of the process that does the work, and the bytes the run wrote (every stage
directory for tokenmill; datatrove's Parquet output) beside the size of the kept documents.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from measure import check_load, emit_report

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
BENCH_PYTHON = Path(os.environ.get("TOKENMILL_BENCH_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))
WARCS = SHARED / "web" / "warc"
# The complete HTML archives (truncated.warc.gz is cut off on purpose; WET and WAT are not HTML).
BASE_ARCHIVES = (
    "cc-main-2020-34-sample.warc.gz",
    "clueweb-quirk.warc.gz",
    "wget-sample-0000.warc.gz",
    "wget-sample-0001.warc.gz",
    "whirlwind.warc.gz",
)
BLOCKED_HOST = "kyleclo.com"
# A Common Crawl snapshot: ~3 billion pages in ~100 TB of WARC files of about 1 GB, ~30,000 pages each.
PAGES_PER_ARCHIVE = 30_000
STAGES = ("ingest", "extract", "langid", "url-filter", "pii", "filter")
CHAIN_OPTIONS = ("langid.languages=[en]", "langid.min_score=0.65", "url-filter.blocklist=[BLOCKLIST]")
STAGE_FLAGS = {"langid": ["--languages", "en", "--min-score", "0.65"], "url-filter": ["--blocklist", "BLOCKLIST"]}


# ----------------------------------------------------------------------------- the corpora


def warc_records(path: Path) -> list[tuple[bytes, bytes]]:
    """(header, body) of every record of a gzipped WARC file."""
    data = gzip.open(path).read()
    records, at = [], 0
    while at < len(data):
        end = data.index(b"\r\n\r\n", at)
        header = data[at:end]
        length = next(
            int(line.split(b":", 1)[1]) for line in header.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        records.append((header, data[end + 4 : end + 4 + length]))
        at = end + 4 + length
        while data[at : at + 2] == b"\r\n":
            at += 2
    return records


def copied_uri(uri: bytes, copy: int) -> bytes:
    """`?copy=K` (or `&copy=K`) added to a URI's query, before its fragment; WARC 1.0 writes
    some URIs in angle brackets, which stay around it."""
    bracketed = uri.startswith(b"<") and uri.endswith(b">")
    bare, hash_mark, fragment = uri.strip(b"<>").partition(b"#")
    copied = bare + (b"&" if b"?" in bare else b"?") + f"copy={copy}".encode() + hash_mark + fragment
    return b"<" + copied + b">" if bracketed else copied


def copied_header(header: bytes, copy: int) -> bytes:
    """The header of copy `copy` of a record: another record id, and `?copy=K` on its URI."""
    lines = []
    for line in header.split(b"\r\n"):
        name = line.split(b":", 1)[0].lower()
        if name == b"warc-record-id":
            record_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{line.decode(errors='replace')}#{copy}")
            line = f"WARC-Record-ID: <urn:uuid:{record_id}>".encode()
        elif name == b"warc-target-uri":
            line = b"WARC-Target-URI: " + copied_uri(line.split(b":", 1)[1].strip(), copy)
        lines.append(line)
    return b"\r\n".join(lines)


# Words a copy keeps as they are: the function words that langid and Gopher's stop-word rule
# read, so that a copy stays English prose to them.
KEPT_WORDS = frozenset(
    "that have with this from they will would there their what about which when were been your"
    " more some than them into only also other these those such then over just like".split()
)
# A word a copy may replace: four letters or more, not inside an entity (`&nbsp;`) or a longer token.
WORD = re.compile(rb"(?<![&#\w])[A-Za-z]{4,}(?![\w;])")
TAG = re.compile(rb"(<[^>]*>)")


def rewordable_payload(body: bytes) -> tuple[bytes, bytes] | None:
    """(HTTP headers, payload) of a response whose payload is plain UTF-8 HTML (not compressed,
    not chunked); None for any other record."""
    head, separator, payload = body.partition(b"\r\n\r\n")
    if not separator or not head.startswith(b"HTTP/"):
        return None
    if re.search(rb"(?im)^(content-encoding|transfer-encoding):", head):
        return None
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return head, payload


def vocabulary(records: list[tuple[bytes, bytes]]) -> dict[int, list[bytes]]:
    """The replaceable words of the pages' text (outside tags), lowercased, by length."""
    words: set[bytes] = set()
    for _, body in records:
        if (parts := rewordable_payload(body)) is not None:
            for segment in TAG.split(parts[1])[::2]:
                words.update(w.lower() for w in WORD.findall(segment))
    by_length: dict[int, list[bytes]] = {}
    for word in sorted(words - {w.encode() for w in KEPT_WORDS}):
        by_length.setdefault(len(word), []).append(word)
    return by_length


def word_permutation(words: dict[int, list[bytes]], copy: int) -> dict[bytes, bytes]:
    """Copy `copy`'s one-to-one map of the vocabulary onto itself, each word to one of its length."""
    shuffle = random.Random(copy).shuffle
    mapping = {}
    for same_length in words.values():
        targets = list(same_length)
        shuffle(targets)
        mapping.update(zip(same_length, targets))
    return mapping


def reworded(body: bytes, mapping: dict[bytes, bytes]) -> bytes:
    """The record's page with every replaceable word of its text mapped, the case pattern kept:
    the same bytes long, so that no length in the WARC or HTTP headers changes."""
    parts = rewordable_payload(body)
    if parts is None:
        return body

    def replace(match: re.Match[bytes]) -> bytes:
        word = match.group(0)
        target = mapping.get(word.lower(), word.lower())
        return target.upper() if word.isupper() else target.capitalize() if word[:1].isupper() else target

    segments = TAG.split(parts[1])
    segments[::2] = [WORD.sub(replace, segment) for segment in segments[::2]]
    return parts[0] + b"\r\n\r\n" + b"".join(segments)


def make_corpus(directory: Path, multiple: int) -> Path:
    """Each base archive with its records `multiple` times over (the first time as they are),
    each record in a gzip member of its own as Common Crawl writes them: one archive stays one
    partition, `multiple` times larger, as a crawl's archives of some 40,000 records are. Each
    later copy of a page has its words reworded (`word_permutation`), so that copies are distinct
    text."""
    directory.mkdir(parents=True, exist_ok=True)
    archives = {name: warc_records(WARCS / name) for name in BASE_ARCHIVES}
    words = vocabulary([record for records in archives.values() for record in records])
    for name, records in archives.items():
        if multiple == 1:
            shutil.copyfile(WARCS / name, directory / name)
            continue
        with open(directory / name, "wb") as out:
            for copy in range(multiple):
                mapping = word_permutation(words, copy) if copy else {}
                for header, body in records:
                    if copy:
                        header, body = copied_header(header, copy), reworded(body, mapping)
                    out.write(gzip.compress(header + b"\r\n\r\n" + body + b"\r\n\r\n", 6))
    return directory


# ----------------------------------------------------------------------------- measuring


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def parquet_bytes(directory: Path) -> tuple[int, int, int]:
    """Rows, bytes of their column data, and files of the Parquet files under a directory: a
    file's size beyond its column data is its footer, paid once per file."""
    import pyarrow.parquet as pq

    rows = data = files = 0
    for path in directory.rglob("*.parquet"):
        metadata = pq.ParquetFile(path).metadata
        rows += metadata.num_rows
        files += 1
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            data += sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))
    return rows, data, files


def written_at_partition_size(stage_dirs: list[Path], pages: int, records_per_partition: int) -> str:
    """Bytes written over kept bytes for partitions of a crawl's size, from this run's bytes per
    kept document, per rejected id, per file footer and per manifest."""
    kept_rows, kept_data, kept_files = parquet_bytes(stage_dirs[-1] / "kept")
    rejected = [parquet_bytes(d / "rejected") for d in stage_dirs]
    rejected_rows, rejected_data, rejected_files = (sum(values) for values in zip(*rejected))
    footers = (
        sum(directory_bytes(d / sub) for d in stage_dirs for sub in ("kept", "rejected")) - kept_data - rejected_data
    )
    footer = footers / (kept_files + rejected_files)
    manifests = sum((d / "manifest.json").stat().st_size for d in stage_dirs)
    scale = records_per_partition / pages
    kept = kept_data * scale + footer
    written = kept + rejected_data * scale + footer * len(stage_dirs) + manifests
    return (
        f"at {records_per_partition:,} pages a partition (a Common Crawl archive), with this run's"
        f" {kept_data / kept_rows:.0f} B per kept document, {rejected_data / rejected_rows:.0f} B per rejected id,"
        f" {footer:.0f} B per Parquet footer and {manifests / len(stage_dirs):.0f} B per manifest:"
        f" written / kept {written / kept:.3f}x"
    )


def bytes_by_kind(stage_dirs: list[Path], kept_bytes: int) -> str:
    """Where a pass's bytes go: kept Parquet (the partitions that kept nothing hold a schema
    only), rejected-id files, manifests, each beside the kept bytes."""
    import pyarrow.parquet as pq

    kept_files = list((stage_dirs[-1] / "kept").glob("*.parquet"))
    empty = [p for p in kept_files if pq.ParquetFile(p).metadata.num_rows == 0]
    rejected = [p for d in stage_dirs for p in (d / "rejected").glob("*.parquet")]
    manifests = [d / "manifest.json" for d in stage_dirs]

    def size(paths: list[Path]) -> int:
        return sum(p.stat().st_size for p in paths)

    return (
        f"bytes written by the one pass: kept Parquet {size(kept_files):,} B in {len(kept_files)} files"
        f" ({len(empty)} of them partitions that kept nothing, {size(empty):,} B);"
        f" rejected ids {size(rejected):,} B in {len(rejected)} files ({size(rejected) / kept_bytes:.1%} of kept);"
        f" manifests {size(manifests):,} B in {len(manifests)} ({size(manifests) / kept_bytes:.1%} of kept)"
    )


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds of processes and every descendant, the exited ones they waited for included."""
    import psutil

    total = 0.0
    for pid in pids:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system + times.children_user + times.children_system
    return total


def peak_rss_mib(pid: int) -> float:
    """The highest resident memory of a process (and of its live children, each its own)."""
    import psutil

    peaks = []
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class DaskCluster:
    """A scheduler and one single-threaded worker (no nanny), as separate processes whose CPU
    time is read from outside, the commands sent to them by --scheduler."""

    def __init__(self, directory: Path) -> None:
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.scheduler = subprocess.Popen(
            [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
             "--scheduler-file", str(directory / "scheduler.json")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.time() + 120
        while not (directory / "scheduler.json").exists():
            assert time.time() < deadline, "the Dask scheduler did not start"
            time.sleep(0.2)
        self.address = json.loads((directory / "scheduler.json").read_text())["address"]
        self.worker = subprocess.Popen(
            [str(bin_dir / "dask"), "worker", self.address, "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
             "--dashboard-address", ":0", "--local-directory", str(directory / "worker")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        from distributed import Client

        with Client(self.address, timeout="120s") as client:
            client.wait_for_workers(1, timeout=120)

    def cpu(self) -> float:
        return tree_cpu([self.scheduler.pid, self.worker.pid])

    def close(self) -> None:
        for process in (self.worker, self.scheduler):
            process.terminate()
            process.wait()


def tokenmill_command(argv: list[str], cluster: DaskCluster) -> None:
    command = [sys.executable, "-m", "tokenmill", *argv, "--scheduler", cluster.address, "--no-progress"]
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr[-2000:]}")


def run_fused(corpus: Path, output: Path, blocklist: Path, cluster: DaskCluster) -> Path:
    options = [a for option in CHAIN_OPTIONS for a in ("--option", option.replace("BLOCKLIST", str(blocklist)))]
    argv = ["curate", "chain", "--stages", ",".join(STAGES), "--input", str(corpus), "--output", str(output)]
    tokenmill_command([*argv, *options], cluster)
    return output / f"{len(STAGES):02d}-{STAGES[-1]}"


def run_one_by_one(corpus: Path, output: Path, blocklist: Path, cluster: DaskCluster) -> Path:
    previous = corpus
    for position, stage in enumerate(STAGES, start=1):
        stage_dir = output / f"{position:02d}-{stage}"
        flags = [str(blocklist) if flag == "BLOCKLIST" else flag for flag in STAGE_FLAGS.get(stage, [])]
        tokenmill_command(["curate", stage, "--input", str(previous), "--output", str(stage_dir), *flags], cluster)
        previous = stage_dir
    return previous


def measured(run, cluster: DaskCluster | None) -> dict[str, float]:
    """CPU (the run's commands, and the cluster's processes) and wall seconds of one run."""
    cpu_before = children_cpu() + (cluster.cpu() if cluster else 0.0)
    started = time.perf_counter()
    result = run()
    wall = time.perf_counter() - started
    cpu = children_cpu() + (cluster.cpu() if cluster else 0.0) - cpu_before
    return {"cpu": cpu, "wall": wall, "result": result}


# ----------------------------------------------------------------------------- datatrove's side


def datatrove_worker(corpus: str, output: str, result_path: str) -> None:
    """Runs inside .venv-bench: datatrove's one-pass pipeline over the corpus, one worker."""
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
        URLFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils.lid import FT176LID

    # The fastText lid.176 model tokenmill's langid ships (its compressed .ftz), read from disk:
    # both sides identify languages with the same model, and nothing is downloaded.
    FT176LID.MODEL_URL = str(ROOT / "tokenmill" / "curate" / "models" / "lid.176.ftz")
    counts = {"read": 0, "written": 0}

    def counted(documents, key):
        for document in documents:
            counts[key] += 1
            yield document

    # The steps chained as datatrove's executor chains them (each step's `run` over the one
    # before it), in this process: rank 0 of 1 reads every file. (Its LocalPipelineExecutor
    # left the extractor's sandbox process unanswered here, each page timing out.)
    data = counted(WarcReader(corpus, glob_pattern="*.warc.gz").run(None, 0, 1), "read")
    for step in (
        # favour_precision as FineWeb runs it; a 60 s timeout, so that no page times out on a loaded
        # machine; without trafilatura's cache of paragraphs seen before, which would empty the
        # copies of a page in the larger corpus (they are the same pages).
        Trafilatura(favour_precision=True, timeout=60.0, deduplicate=False),
        LanguageFilter(languages=["en"], language_threshold=0.65),
        URLFilter(extra_domains=[BLOCKED_HOST], use_integrated_lists=False),  # the blocklist alone, as ours
        PIIFormatter(),
        GopherRepetitionFilter(),
        GopherQualityFilter(),
        C4QualityFilter(filter_no_terminal_punct=False),
        FineWebQualityFilter(),
    ):
        data = step.run(data, 0, 1)
    for _ in ParquetWriter(output).run(counted(data, "written"), 0, 1):
        pass
    from importlib.metadata import version

    Path(result_path).write_text(
        json.dumps(
            {
                "version": version("datatrove"),
                **counts,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_datatrove(corpus: Path, output: Path) -> dict[str, Any]:
    result = output.parent / "datatrove-result.json"
    subprocess.run(
        [str(BENCH_PYTHON), str(Path(__file__).resolve()), "--datatrove-worker", str(corpus), str(output), str(result)],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return json.loads(result.read_text())


# ----------------------------------------------------------------------------- the report


def run_corpus(label: str, corpus: Path, work: Path, repeat: int, with_datatrove: bool, extrapolate: bool) -> list[str]:
    """Every contender over one corpus, `repeat` rounds; `extrapolate`: the bytes written at a
    crawl's partition size too, from the documents of this corpus (not of one whose copies of a
    page compress into each other)."""
    blocklist = work / "blocklist.txt"
    blocklist.write_text(f"{BLOCKED_HOST}\n")
    runs: dict[str, list[dict[str, Any]]] = {"fused": [], "one_by_one": [], "datatrove": []}
    cluster = DaskCluster(work)
    try:
        for round_index in range(repeat):
            for name in runs:
                output = work / f"{name}-{round_index}"
                if name == "fused":
                    runs[name].append(measured(lambda o=output: run_fused(corpus, o, blocklist, cluster), cluster))
                elif name == "one_by_one":
                    runs[name].append(measured(lambda o=output: run_one_by_one(corpus, o, blocklist, cluster), cluster))
                elif with_datatrove:
                    runs[name].append(measured(lambda o=output: run_datatrove(corpus, o), None))
                else:
                    continue
                runs[name][-1]["output"] = output
        worker_rss = peak_rss_mib(cluster.worker.pid)
    finally:
        cluster.close()

    fused_last = runs["fused"][-1]["result"]
    ingest = json.loads((runs["fused"][-1]["output"] / "01-ingest" / "manifest.json").read_text())
    pages = ingest["counts"]["kept"]
    kept = json.loads((fused_last / "manifest.json").read_text())["counts"]["kept"]
    kept_bytes = directory_bytes(fused_last / "kept")
    lines = [
        f"## {label}: {corpus.name}, {len(list(corpus.glob('*.warc.gz')))} WARC files,"
        f" {directory_bytes(corpus) / 2**20:.1f} MiB gzipped, {pages} HTML pages ({ingest['counts']['in']} records"
        f" read), {kept} kept",
        "",
        "| run | CPU s (median) | CPU ms / page | pages / s / core | wall s | bytes written | written / kept |",
        "|---|---|---|---|---|---|---|",
    ]
    import statistics

    rates = {}
    for name, label_text in (
        ("fused", "tokenmill, one pass (chain, rejected as ids)"),
        ("one_by_one", "tokenmill, stage by stage (6 commands, rejected whole)"),
        ("datatrove", "datatrove 0.10, one pass (Trafilatura, Parquet writer)"),
    ):
        if not runs[name]:
            continue
        cpu = statistics.median(r["cpu"] for r in runs[name])
        wall = statistics.median(r["wall"] for r in runs[name])
        written = directory_bytes(runs[name][-1]["output"])
        rates[name] = pages / cpu
        spread = (max(r["cpu"] for r in runs[name]) - min(r["cpu"] for r in runs[name])) / cpu
        lines.append(
            f"| {label_text} | {cpu:.1f} (spread {spread:.0%} over {len(runs[name])}) | {1000 * cpu / pages:.1f} |"
            f" {pages / cpu:.1f} | {wall:.1f} | {written / 2**20:.2f} MiB | {written / kept_bytes:.2f}x |"
        )
    lines += ["", f"kept documents (the chain's last kept/): {kept_bytes / 2**20:.2f} MiB"]
    stage_dirs = sorted(p for p in runs["fused"][-1]["output"].iterdir() if p.is_dir())
    lines.append(bytes_by_kind(stage_dirs, kept_bytes))
    if extrapolate:
        lines.append(written_at_partition_size(stage_dirs, pages, PAGES_PER_ARCHIVE))
    lines.append(f"peak RSS of the Dask worker (one core, every stage's state loaded): {worker_rss:.0f} MiB")
    if runs["datatrove"]:
        result = runs["datatrove"][-1]["result"]
        lines.append(
            f"datatrove {result['version']}: {result['read']} HTML documents read, {result['written']} written;"
            f" peak RSS {result['peak_rss_mib']:.0f} MiB"
        )
        lines.append(
            f"tokenmill one pass / datatrove, pages per CPU second: {rates['fused'] / rates['datatrove']:.2f}x;"
            f" stage by stage / one pass, CPU: {rates['fused'] / rates['one_by_one']:.2f}x"
        )
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multiple", type=int, default=20, help="the larger corpus: this many copies (default 20)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each contender on the larger corpus")
    parser.add_argument("--repeat-base", type=int, default=3, help="rounds on the shared WARCs as they are")
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--datatrove-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.datatrove_worker:
        datatrove_worker(*args.datatrove_worker)
        return 0
    with_datatrove = BENCH_PYTHON.exists()
    if not with_datatrove:
        print(f"datatrove environment not found at {BENCH_PYTHON}; see this script's docstring", file=sys.stderr)
    lines = ["# bench/web_scale.py: the common-crawl recipe's curation before dedup, one core each", ""]
    lines += [check_load(), ""]
    with tempfile.TemporaryDirectory(prefix="web-scale-") as tmp:
        tmp_path = Path(tmp)
        base = make_corpus(tmp_path / "corpus-1x", 1)
        larger = make_corpus(tmp_path / f"corpus-{args.multiple}x", args.multiple)
        for label, corpus, repeat in (
            ("the shared WARCs", base, args.repeat_base),
            (f"{args.multiple}x the shared WARCs", larger, args.repeat),
        ):
            work = tmp_path / f"work-{corpus.name}"
            work.mkdir()
            lines += run_corpus(label, corpus, work, repeat, with_datatrove, extrapolate=corpus is base)
    lines += [check_load("after the run")]
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
