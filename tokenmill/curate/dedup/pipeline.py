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

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from tokenmill.curate.dedup.components import connected_components
from tokenmill.curate.dedup.lsh import bucket_edges, melt_bands
from tokenmill.curate.dedup.minhash import jaccard, shingle_sets
from tokenmill.curate.dedup.options import DedupConfig, KeepRule
from tokenmill.curate.dedup.work import (
    WorkDir,
    compute_with_progress,
    parquet_files,
    partition_file,
    write_parquet_atomic,
    write_partitions,
)
from tokenmill.curate.documents import check_document_columns, resolve_input_files, upstream_manifest
from tokenmill.curate.registry import phases_text
from tokenmill.curate.stage import StageOutput, reject, run_tasks
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import faults, storage
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.infra.cluster import client_or_new, external_scheduler

log = logging.getLogger(__name__)

ROW_BITS = 32
# Index documents get uids below every input uid, so they sort first and always win a cluster.
INDEX_UID_BASE = -(1 << 62)
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
    indexed = _already_indexed(ordered, "label")
    out = pd.DataFrame(
        {
            "uid": ordered["uid"].to_numpy(np.int64),
            "part": ordered["part"].to_numpy(np.int64),
            "cluster_id": ordered["label"].map(names).astype(str).to_numpy(),
            "kept_id": ordered["label"].map(kept["id"]).astype(str).to_numpy(),
            "keep": (ordered["uid"].to_numpy() == ordered["label"].map(kept["uid"]).to_numpy()) | indexed,
            "indexed": indexed,
        }
    )
    return out[out["part"] >= 0]


def _already_indexed(ordered: pd.DataFrame, group: str) -> np.ndarray:
    """Input documents that an index document of their group stands for under the same id: the
    same document, added by an earlier run of these inputs. Such a document is never a duplicate
    of itself: it is kept, and not added to the index again."""
    index_rows = ordered[ordered["uid"].to_numpy() < 0]
    if index_rows.empty:
        return np.zeros(len(ordered), bool)
    known = pd.MultiIndex.from_arrays([index_rows[group].to_numpy(), index_rows["id"].astype(str).to_numpy()])
    mine = pd.MultiIndex.from_arrays([ordered[group].to_numpy(), ordered["id"].astype(str).to_numpy()])
    return (ordered["uid"].to_numpy() >= 0) & mine.isin(known)


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
    indexed = _already_indexed(ordered, "group")
    decisions = pd.DataFrame(
        {
            "uid": ordered["uid"].to_numpy(np.int64),
            "part": ordered["part"].to_numpy(np.int64),
            "cluster_id": ordered["group"].map(first["id"]).astype(str).to_numpy(),
            "kept_id": ordered["group"].map(first["id"]).astype(str).to_numpy(),
            "keep": (ordered["uid"].to_numpy() == ordered["group"].map(first["uid"]).to_numpy()) | indexed,
            "indexed": indexed,
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
            "indexed": np.zeros(0, bool),
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
    return pd.DataFrame(
        {"rows": [len(frame)], "rejected": [int((~frame["keep"]).sum())], "indexed": [int(frame["indexed"].sum())]}
    )


# What `_write_decisions_by_part` returns per partition.
_DECISION_COUNTS = {"rows": "int64", "rejected": "int64", "indexed": "int64"}


def _decision_counts(results: list[pd.DataFrame], name: str) -> dict[str, int]:
    return {
        name: int(sum(r["rows"].sum() for r in results)),
        "already_indexed": int(sum(r["indexed"].sum() for r in results)),
    }


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


# Options that change no decision of a run: left out of its key, so that a rerun with another
# work directory, batch size or index location is still the same run.
_NOT_IN_RUN_KEY = (
    "work_dir",
    "keep_work",
    "batch_rows",
    "partition_rows",
    "shuffle",
    "index",
    "update_index",
    "index_owner",
)


def run_key(config: DedupConfig, inputs: list) -> str:
    """The key under which a run's kept documents enter the index: a digest of the config and the
    inputs (`storage.fingerprint` of each: path, size, version), never of the index, so that the
    run's own append leaves it unchanged and a rerun recognises its batch."""
    settings = {k: v for k, v in asdict(config).items() if k not in _NOT_IN_RUN_KEY}
    payload = {"config": settings, "inputs": inputs}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class IndexView:
    """What one run queries of an index (`files`) and its index.json (`meta`, None for a new
    index). `own`: the batch this very run added before it was stopped (the run queries the
    index as it was before that append and never appends again); `replaced`: the batch of an
    earlier run of the same owner, which this run replaces."""

    files: list[str]
    meta: dict[str, Any] | None = None
    own: dict[str, Any] | None = None
    replaced: dict[str, Any] | None = None


def index_view(config: DedupConfig, key: str) -> IndexView:
    """The rows files of the index (see `check_index`) that a run of `key` queries."""
    files, meta = check_index(config)
    if not config.index:
        return IndexView(files, meta)
    batches = (meta or {}).get("batches", [])
    names = [Path(f).relative_to(Path(config.index)).as_posix() for f in files]
    own = next((i for i, b in enumerate(batches) if b["key"] == key), None)
    if own is not None:
        # Appends go to the end of the list: the index before this run's append is what precedes it.
        later = {name for batch in batches[own:] for name in batch["files"]}
        return IndexView([f for f, n in zip(files, names) if n not in later], meta, own=batches[own])
    replaced = next((b for b in reversed(batches) if config.index_owner and b.get("owner") == config.index_owner), None)
    if replaced is not None:
        gone = set(replaced["files"])
        return IndexView([f for f, n in zip(files, names) if n not in gone], meta, replaced=replaced)
    return IndexView(files, meta)


def _index_rows(rows_path: str, decisions: str, part: int, index_part: int, out: str, keep_shingles: bool) -> int:
    """The kept documents of one input file as index rows (uids moved below every input uid),
    written only if there are any; documents the index holds already are not added again."""
    frame = pd.read_parquet(rows_path)
    files = parquet_files(Path(decisions) / f"part={part}")
    if files:
        dec = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        indexed = dec["indexed"] if "indexed" in dec.columns else False
        dropped = set(dec.loc[~dec["keep"] | indexed, "uid"].tolist())
        frame = frame[~frame["uid"].isin(dropped)]
    if "n_shingles" in frame.columns:
        frame = frame[frame["n_shingles"] > 0]  # a document without shingles matches nothing
    if frame.empty:
        return 0
    rows = frame["uid"].to_numpy(np.int64) & np.int64((1 << ROW_BITS) - 1)
    frame = frame.assign(uid=INDEX_UID_BASE + ((np.int64(index_part) << np.int64(ROW_BITS)) | rows), part=np.int64(-1))
    if not keep_shingles and "shingles" in frame.columns:
        frame = frame.drop(columns=["shingles"])
    write_parquet_atomic(frame.reset_index(drop=True), Path(out) / f"part-{index_part:05d}.parquet")
    return len(frame)


def _published_under(view: IndexView, output: str | Path, key: str) -> dict[str, Any] | None:
    """The manifest of `output` if the run of `key` published it and added its batch to the
    index: the run was stopped after its index update, before it could say so."""
    path = f"{output}/manifest.json"
    if view.own is None:
        return None
    if not storage.exists(path):
        return None
    try:
        manifest = json.loads(storage.read_text(path))
    except ValueError:
        return None
    return manifest if (manifest.get("dedup") or {}).get("run_key") == key else None


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
    inputs = [storage.fingerprint(p) for p in files]
    key = run_key(config, inputs)
    view = index_view(config, key)
    index_files = view.files
    fingerprint = {
        "config": asdict(config) | {"work_dir": None, "keep_work": None},
        "inputs": inputs,
        # What the run queries, not the whole index: its own append must not change the
        # fingerprint, or a rerun after a stop at the very end would start afresh.
        "index": index_files,
    }
    if storage.is_url(output):
        # The phases' checkpoints stay on local disk; only the stage directory goes to the bucket.
        output = storage.absolute(output)
        default_work = storage.staging_dir(output) / "dedup.work"
    else:
        output = Path(output).resolve()
        default_work = output.parent / f".{output.name}.work"
    if (published := _published_under(view, output, key)) is not None:
        log.info(f"dedup: {output} and the index already hold this run's result; nothing to redo")
        if not config.keep_work:
            storage.remove(config.work_dir or default_work)
        return published
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
                written = decisions.map_partitions(_write_decisions_by_part, str(directory), meta=_DECISION_COUNTS)
                results = compute_with_progress(dask, written, "dedup exact groups", progress)
                return _decision_counts(results, "in_groups")

            decided = timed("decisions", decide)
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
                written = decisions.map_partitions(_write_decisions_by_part, str(directory), meta=_DECISION_COUNTS)
                results = compute_with_progress(dask, written, "dedup clusters", progress)
                return _decision_counts(results, "in_clusters")

            decided = timed("decisions", decide)
            reason = "near_duplicate"
            stats_extra = {
                "bands": lsh.bands,
                "rows": lsh.rows,
                "candidate_edges": cand.get("edges"),
                "verified_edges": ver.get("verified_edges"),
                "components": comp,
                "index_documents": n_docs - info1["docs"],
            }
        if config.index:
            # Kept because the index holds them under their own id (see `_already_indexed`).
            stats_extra["already_indexed"] = decided.get("already_indexed", 0)
        stats_extra["run_key"] = key

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
            _update_index(dask, config, files, work, mirror, key, view)

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
    client,
    config: DedupConfig,
    files: list[Path],
    work: WorkDir,
    mirror: storage.Mirror | None,
    key: str,
    view: IndexView,
) -> None:
    """Append the kept documents' rows to the index as one batch under the run's key: text hashes
    (exact), or band keys and, with --verify, shingle sets (fuzzy). index.json, which names the
    rows files and the batches, is written last, on disk and on object storage (after the new
    rows are uploaded). A run whose batch is there already appends nothing; one that replaces its
    owner's earlier batch drops that batch's files from the index once index.json no longer
    names them."""
    if not config.update_index or view.own is not None:
        return
    index, meta = Path(config.index), view.meta
    rows_dir = index / config.index_rows_dir
    rows_dir.mkdir(parents=True, exist_ok=True)
    existing = parquet_files(rows_dir)
    # New files get numbers no listed file ever had (files of a replaced batch included);
    # rows a killed update left unlisted are overwritten.
    first = (meta or {}).get("next_part")
    if first is None:
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
    counts = [f.result() for f in futures]
    added = sum(counts)
    if meta is not None and "files" in meta:
        names = list(meta["files"])
    else:
        names = [Path(f).relative_to(index).as_posix() for f in existing]
    batches = list((meta or {}).get("batches", []))
    total = (meta or {}).get("documents", 0) + added
    gone: list[str] = []
    if view.replaced is not None:
        gone = list(view.replaced["files"])
        names = [n for n in names if n not in gone]
        batches = [b for b in batches if b["key"] != view.replaced["key"]]
        total -= view.replaced.get("documents", 0)
    new = [f"{config.index_rows_dir}/part-{first + part:05d}.parquet" for part, n in enumerate(counts) if n]
    names += new
    batches.append({"key": key, "owner": config.index_owner, "files": new, "documents": added, "added": time.time()})
    record = {
        "params": config.index_signature(),
        "shingles": bool(config.verify and (meta is None or meta.get("shingles"))),
        "documents": total,
        "updated": time.time(),
        "files": names,
        "batches": batches,
        "next_part": first + len(files),
    }
    atomic_write_text(index / "index.json", json.dumps(record, indent=2))
    if mirror is not None:
        mirror.push(names, last=["index.json"])
    for name in gone:
        if mirror is not None:
            mirror.remove(name)
        (index / name).unlink(missing_ok=True)


def _versions() -> dict[str, str]:
    import numba

    return {"numba": numba.__version__}
