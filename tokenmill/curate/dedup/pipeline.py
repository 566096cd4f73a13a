"""The dedup stage: exact (hash of normalized text) and fuzzy (MinHash LSH) deduplication on
Dask, phase by phase with checkpoints, then the usual kept/ rejected/ manifest.json output.

Phases (fuzzy): signatures (one task per input file) -> candidates (shuffle on band key) ->
[verify (shuffle-joins of edges with shingle sets)] -> components (label propagation) ->
decisions (shuffle on component label, keep one per component) -> apply (one task per input
file, through `run_tasks`). Exact: hashes -> decisions (shuffle on the hash) -> apply.

Memory per worker is bounded by one input batch (`batch_rows` documents) in the per-file
phases and by one shuffle partition (total rows / npartitions, at most `partition_rows` rows of
fixed-width integers) in the global ones; the client holds only counters.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from tokenmill.curate.dedup.components import connected_components
from tokenmill.curate.dedup.lsh import LSHParams, bucket_edges, melt_bands
from tokenmill.curate.dedup.minhash import MinHasher, jaccard, shingle_sets
from tokenmill.curate.dedup.shingles import ShingleConfig, TextNormalization
from tokenmill.curate.dedup.work import (
    WorkDir,
    compute_with_progress,
    parquet_files,
    partition_file,
    phases_text,
    write_parquet_atomic,
    write_partitions,
)
from tokenmill.curate.documents import check_document_columns, resolve_input_files, upstream_manifest
from tokenmill.curate.registry import option
from tokenmill.curate.stage import StageOutput, reject, run_tasks
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import faults, storage
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.infra.cluster import client_or_new, external_scheduler

KeepRule = Literal["first", "longest", "quality"]
ROW_BITS = 32
# Index documents get uids below every input uid, so they sort first and always win a cluster.
INDEX_UID_BASE = -(1 << 62)
INDEX_FORMAT = 1
# Every phase with a checkpoint, in the order they run (fuzzy, then exact's own).
PHASES = ("hashes", "signatures", "candidates", "verify", "components", "decisions")


def make_uid(part: int, rows: np.ndarray) -> np.ndarray:
    """A document's int64 uid: (input file number << 32) | row. Orders documents by input order."""
    return (np.int64(part) << np.int64(ROW_BITS)) | rows.astype(np.int64)


def iter_batches(path: str, columns: list[str], batch_rows: int) -> Iterator[tuple[int, pd.DataFrame]]:
    """(first row, frame) batches of one Parquet file, always in the same order."""
    parquet = storage.parquet_file(path)
    names = parquet.schema_arrow.names
    check_document_columns(names, path)
    wanted = [c for c in columns if c in names]
    if parquet.metadata.num_rows == 0:
        # An empty part (a stage rejected a whole batch) still yields a frame, so that the
        # phase writes a file with its columns, not a file without any.
        yield 0, parquet.schema_arrow.empty_table().select(wanted).to_pandas()
        return
    start = 0
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
        frame = batch.to_pandas()
        yield start, frame
        start += len(frame)


def parse_normalization(spec: str) -> TextNormalization:
    """`--normalize`: comma list of lower, punct, nfkc; `none` or `whitespace` for neither
    (whitespace is always collapsed)."""
    items = {s.strip() for s in spec.split(",") if s.strip()}
    unknown = items - {"lower", "punct", "nfkc", "none", "whitespace"}
    if unknown:
        raise ConfigError(f"unknown --normalize item(s) {', '.join(sorted(unknown))}; use lower, punct, nfkc or none")
    return TextNormalization(
        lowercase="lower" in items, strip_punctuation="punct" in items, unicode_nfkc="nfkc" in items
    )


@dataclass
class DedupConfig:
    method: Literal["fuzzy", "exact"] = option(
        "fuzzy", help="fuzzy: MinHash LSH near-duplicates; exact: identical normalized text (default fuzzy)"
    )
    # Default: "lower,punct" for fuzzy, "none" (whitespace collapsed only) for exact.
    normalize: str | None = option(
        None,
        help="comma list of lower, punct, nfkc, or none (whitespace is always collapsed); "
        "default lower,punct for fuzzy, none for exact",
    )
    keep: KeepRule = option(
        "first", help="which document of a cluster to keep: first in input order, longest, or highest quality_score"
    )
    # Fuzzy.
    threshold: float = option(0.8, group="fuzzy", help="Jaccard threshold (default 0.8)")
    num_perm: int = option(
        128, group="fuzzy", help="MinHash permutations per signature: more is more precise and slower (default 128)"
    )
    seed: int = option(1, group="fuzzy", help="seed of the MinHash permutations, as datasketch's seed (default 1)")
    scheme: str = option(
        "legacy",
        group="fuzzy",
        cli={"choices": ["legacy", "affine32", "fast"]},
        help="legacy = datasketch 1.x / 2.x scheme='legacy' (default); affine32 = datasketch 2.x default; "
        "fast = xxh64 + multiply-shift, NOT datasketch-compatible",
    )
    bands: int | None = option(None, group="fuzzy", help="LSH bands (default: datasketch's optimum for --threshold)")
    rows: int | None = option(None, group="fuzzy", help="LSH rows per band (with --bands)")
    ngram: int = option(5, group="fuzzy", help="words per shingle (default 5)")
    char_ngram: int = option(5, group="fuzzy", help="characters per shingle for text without spaces")
    shingle: Literal["auto", "word", "char"] = option(
        "auto", group="fuzzy", help="auto: character n-grams for documents mostly in scripts without spaces (CJK, Thai)"
    )
    verify: bool = option(False, group="fuzzy", help="check every candidate pair by exact Jaccard of the shingle sets")
    all_pairs_limit: int = option(
        50,
        cli=False,
        help="buckets up to this size give every pair (so verification sees each pair); larger ones a star",
    )
    index: str | None = option(
        None,
        path=True,
        help="an index directory or URL: dedup against the documents of earlier runs, then add the kept ones "
        "to it (created if missing; it stores hashes for exact, band keys for fuzzy dedup)",
    )
    update_index: bool = option(True, flag="--no-index-update", help="query --index without adding the kept documents")
    # Execution.
    work_dir: str | None = option(
        None,
        group="execution",
        recipe=False,
        help="checkpoints (default: .<output>.work beside --output); a rerun resumes there",
    )
    keep_work: bool = option(False, group="execution", recipe=False, help="keep the checkpoints after success")
    batch_rows: int = option(20_000, group="execution", help="documents per batch in a worker")
    partition_rows: int = option(2_000_000, cli=False, help="documents per partition of the shuffled tables")
    # Dask shuffle: "p2p" (disk-backed, bounded memory), "tasks", or "auto" = tasks when the
    # shuffled table fits one partition per worker (its fixed overhead is lower), else p2p.
    shuffle: str = option("auto", cli=False, help="Dask shuffle: p2p (disk-backed, bounded memory), tasks, or auto")

    def __post_init__(self) -> None:
        if self.method not in ("fuzzy", "exact"):
            raise ConfigError(f"--method must be fuzzy or exact, not {self.method!r}")
        if self.keep not in ("first", "longest", "quality"):
            raise ConfigError(f"--keep must be first, longest or quality, not {self.keep!r}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"--threshold must be in (0, 1), got {self.threshold}")
        if self.shuffle not in ("auto", "p2p", "tasks"):
            raise ConfigError(f"shuffle must be auto, p2p or tasks, not {self.shuffle!r}")
        if self.normalize is None:
            self.normalize = "lower,punct" if self.method == "fuzzy" else "none"
        _ = self.normalization  # validates
        if self.method == "fuzzy":
            self.lsh()  # validates bands/rows before any cluster starts

    @property
    def normalization(self) -> TextNormalization:
        return parse_normalization(self.normalize)

    @property
    def shingles(self) -> ShingleConfig:
        return ShingleConfig(self.ngram, self.char_ngram, self.shingle, normalization=self.normalization)

    def hasher(self) -> MinHasher:
        return MinHasher(self.num_perm, self.seed, self.scheme, self.shingles)

    def lsh(self) -> LSHParams:
        return LSHParams.resolve(self.num_perm, self.threshold, self.bands, self.rows)

    def index_signature(self) -> dict[str, Any]:
        """What an index must share with a run that queries it."""
        if self.method == "exact":
            return {"format": INDEX_FORMAT, "method": "exact", "normalize": self.normalize}
        lsh = self.lsh()
        return {
            "format": INDEX_FORMAT,
            "method": "fuzzy",
            "num_perm": self.num_perm,
            "seed": self.seed,
            "scheme": self.scheme,
            "bands": lsh.bands,
            "rows": lsh.rows,
            "ngram": self.ngram,
            "char_ngram": self.char_ngram,
            "shingle": self.shingle,
            "normalize": self.normalize,
        }

    @property
    def index_rows_dir(self) -> str:
        """The index's folder of per-document rows: text hashes (exact) or band keys (fuzzy),
        the same rows the run's first phase writes to its work directory."""
        return "hashes" if self.method == "exact" else "bands"

    @property
    def first_phase(self) -> str:
        return "hashes" if self.method == "exact" else "signatures"


def _band_columns(bands: int) -> list[str]:
    return [f"b{i}" for i in range(bands)]


# ----------------------------------------------------------------------------- per-file phases


def _quality(frame: pd.DataFrame) -> np.ndarray:
    if "quality_score" in frame.columns:
        return pd.to_numeric(frame["quality_score"], errors="coerce").to_numpy(np.float64)
    return np.full(len(frame), np.nan)


def signature_file(path: str, part: int, out: str, config: DedupConfig) -> dict[str, int]:
    """Phase 1 (fuzzy) for one input file: uid, id, length, quality, band keys [, shingles]."""
    target = Path(out) / f"part-{part:05d}.parquet"
    if target.exists():
        return {"docs": pq.ParquetFile(target).metadata.num_rows, "resumed": 1}
    hasher, lsh = config.hasher(), config.lsh()
    columns = _band_columns(lsh.bands)
    frames = []
    for start, batch in iter_batches(path, ["id", "text", "quality_score"], config.batch_rows):
        texts = batch["text"].tolist()
        sig, counts = hasher.signatures_with_counts(texts)
        keys = lsh.keys(sig).view(np.int64)
        frame = pd.DataFrame(
            {
                "uid": make_uid(part, np.arange(start, start + len(batch))),
                "id": batch["id"].astype(str).to_numpy(),
                "part": np.full(len(batch), part, np.int64),
                "length": np.array([len(t) if isinstance(t, str) else 0 for t in texts], np.int64),
                "quality": _quality(batch),
                "n_shingles": counts,
            }
        )
        frame = pd.concat([frame, pd.DataFrame(keys, columns=columns)], axis=1)
        if config.verify:
            frame["shingles"] = [s.tobytes() for s in shingle_sets(texts, config.shingles)]
        frames.append(frame)
    result = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    write_parquet_atomic(result, target)
    return {"docs": len(result), "resumed": 0}


def hash_file(path: str, part: int, out: str, config: DedupConfig) -> dict[str, int]:
    """Phase 1 (exact) for one input file: uid, id, length, quality, 128-bit text hash."""
    import xxhash

    target = Path(out) / f"part-{part:05d}.parquet"
    if target.exists():
        return {"docs": pq.ParquetFile(target).metadata.num_rows, "resumed": 1}
    norm = config.normalization
    frames = []
    for start, batch in iter_batches(path, ["id", "text", "quality_score"], config.batch_rows):
        texts = batch["text"].tolist()
        digests = [
            xxhash.xxh3_128_intdigest(norm.apply(t if isinstance(t, str) else "").encode("utf-8")) for t in texts
        ]
        hi = np.array([d >> 64 for d in digests], dtype=np.uint64).view(np.int64)
        lo = np.array([d & ((1 << 64) - 1) for d in digests], dtype=np.uint64).view(np.int64)
        frames.append(
            pd.DataFrame(
                {
                    "uid": make_uid(part, np.arange(start, start + len(batch))),
                    "id": batch["id"].astype(str).to_numpy(),
                    "part": np.full(len(batch), part, np.int64),
                    "length": np.array([len(t) if isinstance(t, str) else 0 for t in texts], np.int64),
                    "quality": _quality(batch),
                    "h1": hi,
                    "h2": lo,
                }
            )
        )
    result = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    write_parquet_atomic(result, target)
    return {"docs": len(result), "resumed": 0}


def _run_per_file(
    client, func, files: list[Path], out: Path, config: DedupConfig, desc: str, progress: bool
) -> dict[str, int]:
    from distributed import as_completed

    from tokenmill.progress import progress_bar

    futures = [client.submit(func, str(path), part, str(out), config, pure=False) for part, path in enumerate(files)]
    totals = {"docs": 0, "resumed": 0}
    with progress_bar(total=len(futures), desc=desc, unit="file", enabled=progress) as bar:
        for future in as_completed(futures):
            result = future.result()
            totals["docs"] += result["docs"]
            totals["resumed"] += result["resumed"]
            bar.update(1)
    return totals


# ----------------------------------------------------------------------------- global phases


def _order_frame(frame: pd.DataFrame, group: str, keep: KeepRule) -> pd.DataFrame:
    """Sort so that the first row of each group is the document to keep: index documents
    first, then by the rule, ties broken by uid (input order)."""
    frame = frame.assign(_index=(frame["uid"] < 0).astype(np.int8))
    by, ascending = [group, "_index"], [True, False]
    if keep == "longest":
        by.append("length"), ascending.append(False)
    elif keep == "quality":
        frame = frame.assign(_q=frame["quality"].fillna(-np.inf))
        by.append("_q"), ascending.append(False)
    by.append("uid"), ascending.append(True)
    return frame.sort_values(by, ascending=ascending, kind="stable")


def _choose_clusters(frame: pd.DataFrame, keep: KeepRule) -> pd.DataFrame:
    """One shuffled partition of (node, label, uid, id, part, length, quality) -> decisions."""
    if frame.empty:
        return _empty_decisions()
    ordered = _order_frame(frame, "label", keep)
    kept = ordered.groupby("label", sort=False).head(1).set_index("label")
    # The cluster is named after its smallest-uid member (the component label).
    names = frame.loc[frame["uid"] == frame["label"], ["label", "id"]].set_index("label")["id"]
    out = pd.DataFrame(
        {
            "uid": ordered["uid"].to_numpy(np.int64),
            "part": ordered["part"].to_numpy(np.int64),
            "cluster_id": ordered["label"].map(names).astype(str).to_numpy(),
            "kept_id": ordered["label"].map(kept["id"]).astype(str).to_numpy(),
            "keep": ordered["uid"].to_numpy() == ordered["label"].map(kept["uid"]).to_numpy(),
        }
    )
    return out[out["part"] >= 0]


def _choose_exact(frame: pd.DataFrame, keep: KeepRule) -> pd.DataFrame:
    if frame.empty:
        return _empty_decisions()
    frame = frame.assign(group=frame["h1"].astype(str) + ":" + frame["h2"].astype(str))
    sizes = frame.groupby("group")["uid"].transform("size")
    frame = frame[sizes > 1]
    if frame.empty:
        return _empty_decisions()
    ordered = _order_frame(frame, "group", keep)
    first = ordered.groupby("group", sort=False).head(1).set_index("group")
    decisions = pd.DataFrame(
        {
            "uid": ordered["uid"].to_numpy(np.int64),
            "part": ordered["part"].to_numpy(np.int64),
            "cluster_id": ordered["group"].map(first["id"]).astype(str).to_numpy(),
            "kept_id": ordered["group"].map(first["id"]).astype(str).to_numpy(),
            "keep": ordered["uid"].to_numpy() == ordered["group"].map(first["uid"]).to_numpy(),
        }
    )
    decisions = decisions[decisions["part"] >= 0]  # index documents are not in this input
    return decisions


def _empty_decisions() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "uid": np.zeros(0, np.int64),
            "part": np.zeros(0, np.int64),
            "cluster_id": np.zeros(0, object),
            "kept_id": np.zeros(0, object),
            "keep": np.zeros(0, bool),
        }
    )


def _write_decisions_by_part(frame: pd.DataFrame, directory: str, partition_info: dict | None = None) -> pd.DataFrame:
    """Split one partition of decisions by input file, so the apply task of file p reads only
    `part=p/`."""
    for part, group in frame.groupby("part"):
        write_parquet_atomic(
            group.drop(columns=["part"]).reset_index(drop=True),
            partition_file(Path(directory) / f"part={int(part)}", partition_info, stem="chunk"),
        )
    return pd.DataFrame({"rows": [len(frame)], "rejected": [int((~frame["keep"]).sum())]})


def _jaccard_partition(frame: pd.DataFrame, threshold: float) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame({"u": np.zeros(0, np.int64), "v": np.zeros(0, np.int64), "jaccard": np.zeros(0)})
    values = np.array(
        [
            jaccard(np.frombuffer(a, dtype=np.uint64), np.frombuffer(b, dtype=np.uint64))
            for a, b in zip(frame["su"].tolist(), frame["sv"].tolist())
        ]
    )
    out = pd.DataFrame({"u": frame["u"].to_numpy(np.int64), "v": frame["v"].to_numpy(np.int64), "jaccard": values})
    return out[out["jaccard"] >= threshold]


# ----------------------------------------------------------------------------- apply


@dataclass
class ApplyDecisions:
    """Final per-file task: split one input file into kept and rejected by the decisions."""

    path: str
    part: int
    decisions: str
    reason: str
    batch_rows: int

    def run(self) -> Iterator[StageOutput]:
        files = parquet_files(Path(self.decisions) / f"part={self.part}")
        decided = (
            pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            if files
            else _empty_decisions().drop(columns=["part"])
        )
        decided = decided.set_index("uid")
        parquet = storage.parquet_file(self.path)
        start = 0
        for batch in parquet.iter_batches(batch_size=self.batch_rows):
            docs = batch.to_pandas()
            uids = make_uid(self.part, np.arange(start, start + len(docs)))
            start += len(docs)
            hit = decided.reindex(uids)
            in_cluster = hit["keep"].notna().to_numpy()
            rejected_mask = in_cluster & (hit["keep"].to_numpy() == False)  # noqa: E712
            docs = docs.assign(
                cluster_id=np.where(in_cluster, hit["cluster_id"].to_numpy(), None),
                kept_id=np.where(rejected_mask, hit["kept_id"].to_numpy(), None),
            )
            kept = docs[~rejected_mask].drop(columns=["kept_id"])
            rejected = reject(docs[rejected_mask], self.reason)
            yield StageOutput(
                n_in=len(docs),
                kept=kept.reset_index(drop=True),
                rejected=rejected.reset_index(drop=True),
                stats={"in_clusters": int(in_cluster.sum())},
            )


# ----------------------------------------------------------------------------- index


def _read_index_meta(index: Path) -> dict[str, Any] | None:
    meta = index / "index.json"
    if not meta.exists():
        if index.exists() and any(index.iterdir()):
            raise TokenmillError(f"{index} is not a dedup index (index.json is missing)")
        return None
    return json.loads(meta.read_text())


def check_index(config: DedupConfig) -> tuple[list[str], dict[str, Any] | None]:
    """Files of an existing index (empty if new) after checking it matches the config; the
    index is a local directory (see `index_mirror` for one on object storage)."""
    if not config.index:
        return [], None
    index = Path(config.index)
    meta = _read_index_meta(index)
    if meta is None:
        return [], None
    expected = config.index_signature()
    built = {"method": "fuzzy", **meta["params"]}  # indexes from before exact ones existed are fuzzy
    mismatched = {k: (built.get(k), v) for k, v in expected.items() if built.get(k) != v}
    if mismatched:
        detail = ", ".join(f"{k}: index {a!r} vs run {b!r}" for k, (a, b) in mismatched.items())
        raise ConfigError(f"index {index} was built with other parameters ({detail})")
    if config.verify and not meta.get("shingles"):
        raise ConfigError(
            f"index {index} has no shingle sets; it cannot be used with --verify (rebuild it with --verify)"
        )
    if "files" in meta:
        # Only the files index.json names: rows a killed update left beside them are not part of it.
        return [str(index / name) for name in meta["files"]], meta
    return parquet_files(index / config.index_rows_dir), meta


def index_mirror(config: DedupConfig) -> storage.Mirror | None:
    """For an index on object storage: a local copy holding what the remote index.json names
    (pulled now), or None for a local index. The run updates the copy, and `_update_index`
    pushes the new rows first and index.json last."""
    if not config.index or not storage.is_url(config.index):
        return None
    mirror = storage.Mirror(config.index, "index")
    if mirror.pull(["index.json"]):
        meta = _read_index_meta(mirror.local) or {}
        names = meta.get("files")
        mirror.pull(names if names is not None else mirror.files(config.index_rows_dir))
    elif mirror.files():
        raise TokenmillError(f"{mirror.url} is not a dedup index (index.json is missing)")
    else:
        storage.remove(mirror.local)  # a new index: nothing of an older one at this URL survives
        mirror.local.mkdir(parents=True)
    return mirror


def _index_rows(rows_path: str, decisions: str, part: int, index_part: int, out: str, keep_shingles: bool) -> int:
    """The kept documents of one input file as index rows (uids moved below every input uid)."""
    frame = pd.read_parquet(rows_path)
    files = parquet_files(Path(decisions) / f"part={part}")
    if files:
        dec = pd.concat([pd.read_parquet(f, columns=["uid", "keep"]) for f in files], ignore_index=True)
        dropped = set(dec.loc[~dec["keep"], "uid"].tolist())
        frame = frame[~frame["uid"].isin(dropped)]
    if "n_shingles" in frame.columns:
        frame = frame[frame["n_shingles"] > 0]  # a document without shingles matches nothing
    rows = frame["uid"].to_numpy(np.int64) & np.int64((1 << ROW_BITS) - 1)
    frame = frame.assign(uid=INDEX_UID_BASE + ((np.int64(index_part) << np.int64(ROW_BITS)) | rows), part=np.int64(-1))
    if not keep_shingles and "shingles" in frame.columns:
        frame = frame.drop(columns=["shingles"])
    write_parquet_atomic(frame.reset_index(drop=True), Path(out) / f"part-{index_part:05d}.parquet")
    return len(frame)


# ----------------------------------------------------------------------------- the stage


def run_dedup(
    input: str | Path | list,
    output: str | Path,
    config: DedupConfig | None = None,
    *,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Deduplicate documents; writes the stage directory `output` and returns its manifest."""
    import dask.dataframe as dd

    config = config or DedupConfig()
    files = resolve_input_files(input)
    mirror = index_mirror(config)
    if mirror is not None:
        config = replace(config, index=str(mirror.local))
    index_files, index_meta = check_index(config)
    fingerprint = {
        "config": asdict(config) | {"work_dir": None, "keep_work": None},
        "inputs": [storage.fingerprint(p) for p in files],
        "index": index_files,
    }
    if storage.is_url(output):
        # The phases' checkpoints stay on local disk; only the stage directory goes to the bucket.
        output = storage.absolute(output)
        default_work = storage.staging_dir(output) / "dedup.work"
    else:
        output = Path(output).resolve()
        default_work = output.parent / f".{output.name}.work"
    started = time.time()
    phase_seconds: dict[str, float] = {}
    work: WorkDir | None = None
    running = [""]  # the phase under way, for a fault's one line
    address: list[str] = []

    def timed(name, fn):
        t0 = time.time()
        running[0] = name
        info = work.phase(name, fn)
        phase_seconds[name] = round(time.time() - t0, 3)
        return info

    def phases_kept() -> str | None:
        finished = _finished_phases(work)
        if not finished:
            return None
        return f"{phases_text(finished)} {'is' if len(finished) == 1 else 'are'} kept in {work.path}"

    with (
        faults.reported_faults(
            lambda: f"curate dedup {running[0]}".rstrip(),
            str(output),
            lambda: phases_kept() or "no phase had finished",
            lambda: address[0] if address else None,
        ),
        client_or_new(client, scheduler, workers) as dask,
        _ShuffleChoice(config) as shuffle,
    ):
        address.append(external_scheduler(dask))
        # Checkpoints only once the cluster answers: an unreachable scheduler leaves no work
        # directory beside the output.
        work = WorkDir(config.work_dir or default_work, fingerprint)
        n_workers = max(1, len(dask.scheduler_info(n_workers=-1).get("workers", {})))
        if config.method == "exact":
            info1 = timed(
                "hashes", lambda d: _run_per_file(dask, hash_file, files, d, config, "dedup hashes", progress)
            )
            npart = max(n_workers, math.ceil(info1["docs"] / config.partition_rows))
            shuffle.set(npart == n_workers)
            hashes = parquet_files(work.dir("hashes")) + index_files

            def decide(directory: Path) -> dict:
                frame = dd.read_parquet(hashes, columns=["uid", "id", "part", "length", "quality", "h1", "h2"])
                shuffled = frame.shuffle(on="h1", npartitions=npart)
                decisions = shuffled.map_partitions(_choose_exact, config.keep, meta=_empty_decisions())
                written = decisions.map_partitions(
                    _write_decisions_by_part, str(directory), meta={"rows": "int64", "rejected": "int64"}
                )
                results = compute_with_progress(dask, written, "dedup exact groups", progress)
                return {"in_groups": int(sum(r["rows"].sum() for r in results))}

            timed("decisions", decide)
            reason = "exact_duplicate"
            stats_extra: dict[str, Any] = {
                "index_documents": sum(pq.ParquetFile(f).metadata.num_rows for f in index_files)
            }
        else:
            lsh = config.lsh()
            bands = _band_columns(lsh.bands)
            info1 = timed(
                "signatures",
                lambda d: _run_per_file(dask, signature_file, files, d, config, "dedup signatures", progress),
            )
            n_docs = info1["docs"] + sum(pq.ParquetFile(f).metadata.num_rows for f in index_files)
            # Each document contributes `bands` rows of 16 bytes to the candidate shuffle.
            npart = max(n_workers, math.ceil(n_docs * lsh.bands / config.partition_rows))
            shuffle.set(npart == n_workers)
            sig_files = parquet_files(work.dir("signatures")) + index_files

            def candidates(directory: Path) -> dict:
                frame = dd.read_parquet(sig_files, columns=["uid", "n_shingles", *bands])
                long = frame.map_partitions(
                    lambda df: melt_bands(df[df["n_shingles"] > 0], bands), meta={"key": "int64", "uid": "int64"}
                )
                edges = long.shuffle(on="key", npartitions=npart).map_partitions(
                    bucket_edges, config.all_pairs_limit if config.verify else 2, meta={"u": "int64", "v": "int64"}
                )
                unique = edges.shuffle(on="u", npartitions=npart).map_partitions(
                    lambda df: df.drop_duplicates(ignore_index=True), meta={"u": "int64", "v": "int64"}
                )
                return {"edges": write_partitions(dask, unique, directory, "dedup candidates", progress)}

            cand = timed("candidates", candidates)
            edge_dir = work.dir("candidates")
            if config.verify:

                def verify(directory: Path) -> dict:
                    edges = dd.read_parquet(parquet_files(edge_dir), columns=["u", "v"])
                    sets = dd.read_parquet(sig_files, columns=["uid", "shingles"])
                    joined = edges.merge(sets.rename(columns={"uid": "u", "shingles": "su"}), on="u", npartitions=npart)
                    joined = joined.merge(
                        sets.rename(columns={"uid": "v", "shingles": "sv"}), on="v", npartitions=npart
                    )
                    kept = joined.map_partitions(
                        _jaccard_partition, config.threshold, meta={"u": "int64", "v": "int64", "jaccard": "float64"}
                    )
                    return {"verified_edges": write_partitions(dask, kept, directory, "dedup verify", progress)}

                ver = timed("verify", verify)
                edge_dir = work.dir("verify")
            else:
                ver = {}
            comp = timed(
                "components",
                lambda d: connected_components(dask, parquet_files(edge_dir), d, npartitions=npart, progress=progress),
            )

            def decide(directory: Path) -> dict:
                labels = dd.read_parquet(parquet_files(work.dir("components") / "final"), columns=["node", "label"])
                meta = dd.read_parquet(sig_files, columns=["uid", "id", "part", "length", "quality"])
                members = labels.merge(meta, left_on="node", right_on="uid", npartitions=npart)
                decisions = members.shuffle(on="label", npartitions=npart).map_partitions(
                    _choose_clusters, config.keep, meta=_empty_decisions()
                )
                written = decisions.map_partitions(
                    _write_decisions_by_part, str(directory), meta={"rows": "int64", "rejected": "int64"}
                )
                results = compute_with_progress(dask, written, "dedup clusters", progress)
                return {"in_clusters": int(sum(r["rows"].sum() for r in results))}

            timed("decisions", decide)
            reason = "near_duplicate"
            stats_extra = {
                "bands": lsh.bands,
                "rows": lsh.rows,
                "candidate_edges": cand.get("edges"),
                "verified_edges": ver.get("verified_edges"),
                "components": comp,
                "index_documents": n_docs - info1["docs"],
            }

        tasks = [
            ApplyDecisions(str(path), part, str(work.dir("decisions")), reason, config.batch_rows)
            for part, path in enumerate(files)
        ]
        t0 = time.time()

        def add_dedup_details(manifest: dict) -> None:
            phase_seconds["apply"] = round(time.time() - t0, 3)
            manifest["timings"]["seconds"] = round(time.time() - started, 3)
            manifest["timings"]["phases"] = phase_seconds
            manifest["resumed_phases"] = work.resumed
            manifest["dedup"] = stats_extra

        manifest = run_tasks(
            "dedup",
            asdict(config),
            tasks,
            output,
            inputs=[storage.absolute(p) for p in (input if isinstance(input, (list, tuple)) else [input])],
            upstream=upstream_manifest(input),
            versions=_versions(),
            client=dask,
            progress=progress,
            finalize=add_dedup_details,
            what="curate dedup apply",
            also_kept=phases_kept,
        )
        running[0] = "index update"
        if config.index:
            _update_index(dask, config, files, work, index_meta, mirror)

    if not config.keep_work:
        work.remove()
    return manifest


def _finished_phases(work: WorkDir | None) -> list[str]:
    """The phases whose checkpoints a rerun resumes, in the order they ran."""
    if work is None or not work.path.is_dir():
        return []
    return [phase for phase in PHASES if work.done(phase)]


class _ShuffleChoice:
    """Sets Dask's shuffle method for the global phases (see `DedupConfig.shuffle`)."""

    def __init__(self, config: DedupConfig):
        self.config = config
        self._context = None

    def __enter__(self) -> _ShuffleChoice:
        return self

    def set(self, small: bool) -> None:
        import dask

        method = self.config.shuffle if self.config.shuffle != "auto" else ("tasks" if small else "p2p")
        self._context = dask.config.set({"dataframe.shuffle.method": method})
        self._context.__enter__()

    def __exit__(self, *exc) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


def _update_index(
    client, config: DedupConfig, files: list[Path], work: WorkDir, meta: dict | None, mirror: storage.Mirror | None
) -> None:
    """Append the kept documents' rows to the index: text hashes (exact), or band keys and,
    with --verify, shingle sets (fuzzy). index.json, which names the rows files, is written
    last, on disk and on object storage (after the new rows are uploaded)."""
    if not config.update_index:
        return
    index = Path(config.index)
    rows_dir = index / config.index_rows_dir
    rows_dir.mkdir(parents=True, exist_ok=True)
    existing = parquet_files(rows_dir)
    first = 0 if not existing else max(int(Path(f).stem.split("-")[1]) for f in existing) + 1
    rows = {int(Path(f).stem.split("-")[1]): f for f in parquet_files(work.dir(config.first_phase))}
    futures = [
        client.submit(
            _index_rows,
            rows[part],
            str(work.dir("decisions")),
            part,
            first + part,
            str(rows_dir),
            config.verify,
            pure=False,
        )
        for part in range(len(files))
    ]
    added = sum(f.result() for f in futures)
    total = (meta or {}).get("documents", 0) + added
    if meta is not None and "files" in meta:
        names = list(meta["files"])
    else:
        names = [Path(f).relative_to(index).as_posix() for f in existing]
    names += [f"{config.index_rows_dir}/part-{first + part:05d}.parquet" for part in range(len(files))]
    record = {
        "params": config.index_signature(),
        "shingles": bool(config.verify and (meta is None or meta.get("shingles"))),
        "documents": total,
        "updated": time.time(),
        "files": names,
    }
    atomic_write_text(index / "index.json", json.dumps(record, indent=2))
    if mirror is not None:
        mirror.push(names, last=["index.json"])


def _versions() -> dict[str, str]:
    import numba

    return {"numba": numba.__version__}
