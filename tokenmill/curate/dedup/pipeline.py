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
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
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
from tokenmill.curate.registry import phases_text
from tokenmill.curate.stage import STAGE_OUTPUT, Batch, reject, run_tasks
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import machine_faults, records, storage
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.infra.cluster import client_or_new, external_scheduler, submit_and_collect
from tokenmill.infra.document_dirs import check_document_columns, input_list, resolve_input_files, upstream_manifest
from tokenmill.infra.outputs import OutputKind, claim_output

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
    totals = {"docs": 0, "resumed": 0}

    def add(_part: int, result: dict[str, int]) -> None:
        totals["docs"] += result["docs"]
        totals["resumed"] += result["resumed"]

    calls = ((part, (str(path), part, str(out), config)) for part, path in enumerate(files))
    submit_and_collect(client, func, calls, add, desc=desc, unit="file", progress=progress)
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

    def run(self) -> Iterator[Batch]:
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
            yield Batch(
                n_in=len(docs),
                kept=kept.reset_index(drop=True),
                rejected=rejected.reset_index(drop=True),
                stats={"in_clusters": int(in_cluster.sum())},
            )


# ----------------------------------------------------------------------------- index


# What `--index` may be: an earlier index, or nothing yet.
INDEX_OUTPUT = OutputKind("a dedup index", ("index.json",))


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
        return [
            storage.join_inside(index, name, f"{index / 'index.json'} names the file") for name in meta["files"]
        ], meta
    return parquet_files(index / config.index_rows_dir), meta


def index_mirror(config: DedupConfig) -> storage.Mirror | None:
    """For an index on object storage: a local copy holding what the remote index.json names
    (pulled now), or None for a local index. The run updates the copy, and `_update_index`
    pushes the new rows first and index.json last."""
    if not config.index or storage.Location(config.index).is_local:
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
# work directory, batch size, MinHash device or index location is still the same run.
_NOT_IN_RUN_KEY = (
    "work_dir",
    "keep_work",
    "batch_rows",
    "partition_rows",
    "minhash_device",
    "shuffle",
    "index",
    "update_index",
    "index_owner",
)


def run_key(config: DedupConfig, inputs: list) -> str:
    """The key under which a run's kept documents enter the index: a digest of the config and the
    inputs (`records.identity`: path, size, version), never of the index, so that the
    run's own append leaves it unchanged and a rerun recognises its batch."""
    settings = {k: v for k, v in asdict(config).items() if k not in _NOT_IN_RUN_KEY}
    payload = {"config": settings, "inputs": inputs}
    return records.digest(payload, length=32)


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


@dataclass
class _DedupRun:
    """What the phases of one dedup run share. `phase` (the one under way) and `work` also say,
    when a fault ends the run, what was running and what a rerun resumes."""

    config: DedupConfig
    files: list[Path]
    index_files: list[str]  # the index rows files the run queries (see `index_view`)
    progress: bool
    dask: Any = None
    work: WorkDir | None = None
    shuffle: _ShuffleChoice | None = None
    n_workers: int = 1
    npart: int = 0  # shuffle partitions of the global phases
    phase: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, run: Callable[[Path], dict[str, Any] | None]) -> dict[str, Any]:
        """Run one phase (or resume it from its checkpoint) and record its seconds."""
        t0 = time.time()
        self.phase = name
        info = self.work.phase(name, run)
        self.seconds[name] = round(time.time() - t0, 3)
        return info

    def set_partitions(self, rows: int) -> None:
        """One shuffle partition per worker, or more so that none holds over `partition_rows` rows."""
        self.npart = max(self.n_workers, math.ceil(rows / self.config.partition_rows))
        self.shuffle.set(self.npart == self.n_workers)

    def phases_kept(self) -> str | None:
        finished = _finished_phases(self.work)
        if not finished:
            return None
        return f"{phases_text(finished)} {'is' if len(finished) == 1 else 'are'} kept in {self.work.path}"


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
    """Deduplicate documents; writes the stage directory `output` and returns its manifest.

    The method's phases decide which documents to keep (`_exact_phases`, `_fuzzy_phases`),
    each checkpointed in the work directory; `_apply` writes the stage directory; the index,
    if any, takes the kept documents last.
    """
    config = config or DedupConfig()
    with ExitStack() as held:
        held.enter_context(claim_output(output, STAGE_OUTPUT, flag="--output", inputs=input_list(input)))
        if config.index and config.update_index:
            # Held from the read of index.json to the write of the new one: two runs that
            # updated one index together would each write over the other's batch.
            held.enter_context(claim_output(config.index, INDEX_OUTPUT, flag="--index", inputs=input_list(input)))
        return _run_dedup(input, output, config, client=client, scheduler=scheduler, workers=workers, progress=progress)


def _run_dedup(
    input: str | Path | list,
    output: str | Path,
    config: DedupConfig,
    *,
    client,
    scheduler: str | None,
    workers: int | None,
    progress: bool,
) -> dict[str, Any]:
    files = resolve_input_files(input)
    mirror = index_mirror(config)
    if mirror is not None:
        config = replace(config, index=str(mirror.local))
    inputs = records.identity(files)
    key = run_key(config, inputs)
    view = index_view(config, key)
    fingerprint = {
        "config": asdict(config) | {"work_dir": None, "keep_work": None},
        "inputs": inputs,
        # What the run queries, not the whole index: its own append must not change the
        # fingerprint, or a rerun after a stop at the very end would start afresh.
        "index": view.files,
    }
    output, default_work = _output_and_work_dir(output)
    if (published := _published_under(view, output, key)) is not None:
        log.info(f"dedup: {output} and the index already hold this run's result; nothing to redo")
        if not config.keep_work:
            storage.remove(config.work_dir or default_work)
        return published
    started = time.time()
    run = _DedupRun(config, files, view.files, progress)
    address: list[str] = []
    with (
        machine_faults.reported_faults(
            lambda: f"curate dedup {run.phase}".rstrip(),
            str(output),
            lambda: run.phases_kept() or "no phase had finished",
            lambda: address[0] if address else None,
        ),
        client_or_new(client, scheduler, workers) as dask,
        _ShuffleChoice(config) as shuffle,
    ):
        address.append(external_scheduler(dask))
        run.dask, run.shuffle = dask, shuffle
        # Checkpoints only once the cluster answers: an unreachable scheduler leaves no work
        # directory beside the output.
        run.work = WorkDir(config.work_dir or default_work, fingerprint)
        run.n_workers = max(1, len(dask.scheduler_info(n_workers=-1).get("workers", {})))
        if config.method == "exact":
            reason, (decided, stats) = "exact_duplicate", _exact_phases(run)
        else:
            reason, (decided, stats) = "near_duplicate", _fuzzy_phases(run)
        if config.index:
            # Kept because the index holds them under their own id (see `_already_indexed`).
            stats["already_indexed"] = decided.get("already_indexed", 0)
        stats["run_key"] = key
        manifest = _apply(run, input, output, reason, stats, started)
        run.phase = "index update"
        if config.index:
            _update_index(dask, config, files, run.work, mirror, key, view)

    if not config.keep_work:
        run.work.remove()
    return manifest


def _output_and_work_dir(output: str | Path) -> tuple[str | Path, Path]:
    """The stage directory (absolute) and the default work directory of its phases: beside the
    output's local working copy (the phases' checkpoints stay on local disk; only the stage
    directory goes to a bucket)."""
    target = storage.Location(output).absolute()
    return target.native(), storage.working_copy(target.parent, "staging") / f".{target.name}.work"


def _rows_in(files: list[str]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _exact_phases(run: _DedupRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """hashes (per input file) -> decisions (shuffle on the hash). Returns the decisions' counts
    and the manifest's dedup statistics."""
    hashed = run.timed(
        "hashes", lambda d: _run_per_file(run.dask, hash_file, run.files, d, run.config, "dedup hashes", run.progress)
    )
    run.set_partitions(hashed["docs"])
    hashes = parquet_files(run.work.dir("hashes")) + run.index_files
    decided = run.timed("decisions", lambda d: _exact_decisions(run, hashes, d))
    return decided, {"index_documents": _rows_in(run.index_files)}


def _exact_decisions(run: _DedupRun, hashes: list[str], directory: Path) -> dict[str, Any]:
    import dask.dataframe as dd

    frame = dd.read_parquet(hashes, columns=["uid", "id", "part", "length", "quality", "h1", "h2"])
    shuffled = frame.shuffle(on="h1", npartitions=run.npart)
    decisions = shuffled.map_partitions(_choose_exact, run.config.keep, meta=_empty_decisions())
    return _write_decisions(run, decisions, directory, "dedup exact groups", "in_groups")


def _fuzzy_phases(run: _DedupRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """signatures (per input file) -> candidates -> [verify] -> components -> decisions.
    Returns the decisions' counts and the manifest's dedup statistics."""
    lsh = run.config.lsh()
    bands = _band_columns(lsh.bands)
    signed = run.timed(
        "signatures",
        lambda d: _run_per_file(run.dask, signature_file, run.files, d, run.config, "dedup signatures", run.progress),
    )
    n_docs = signed["docs"] + _rows_in(run.index_files)
    # Each document contributes `bands` rows of 16 bytes to the candidate shuffle.
    run.set_partitions(n_docs * lsh.bands)
    sig_files = parquet_files(run.work.dir("signatures")) + run.index_files
    cand = run.timed("candidates", lambda d: _candidate_edges(run, sig_files, bands, d))
    edge_dir = run.work.dir("candidates")
    ver: dict[str, Any] = {}
    if run.config.verify:
        ver = run.timed("verify", lambda d: _verified_edges(run, sig_files, edge_dir, d))
        edge_dir = run.work.dir("verify")
    comp = run.timed(
        "components",
        lambda d: connected_components(
            run.dask, parquet_files(edge_dir), d, npartitions=run.npart, progress=run.progress
        ),
    )
    decided = run.timed("decisions", lambda d: _cluster_decisions(run, sig_files, d))
    return decided, {
        "bands": lsh.bands,
        "rows": lsh.rows,
        "candidate_edges": cand.get("edges"),
        "verified_edges": ver.get("verified_edges"),
        "components": comp,
        "index_documents": n_docs - signed["docs"],
    }


def _candidate_edges(run: _DedupRun, sig_files: list[str], bands: list[str], directory: Path) -> dict[str, int]:
    """Pairs of documents that share a band key (shuffled on the key), without repeats."""
    import dask.dataframe as dd

    npart = run.npart
    frame = dd.read_parquet(sig_files, columns=["uid", "n_shingles", *bands])
    long = frame.map_partitions(
        lambda df: melt_bands(df[df["n_shingles"] > 0], bands), meta={"key": "int64", "uid": "int64"}
    )
    edges = long.shuffle(on="key", npartitions=npart).map_partitions(
        bucket_edges, run.config.all_pairs_limit if run.config.verify else 2, meta={"u": "int64", "v": "int64"}
    )
    unique = edges.shuffle(on="u", npartitions=npart).map_partitions(
        lambda df: df.drop_duplicates(ignore_index=True), meta={"u": "int64", "v": "int64"}
    )
    return {"edges": write_partitions(run.dask, unique, directory, "dedup candidates", run.progress)}


def _verified_edges(run: _DedupRun, sig_files: list[str], edge_dir: Path, directory: Path) -> dict[str, int]:
    """The candidate pairs whose shingle sets reach the Jaccard threshold."""
    import dask.dataframe as dd

    npart = run.npart
    edges = dd.read_parquet(parquet_files(edge_dir), columns=["u", "v"])
    sets = dd.read_parquet(sig_files, columns=["uid", "shingles"])
    joined = edges.merge(sets.rename(columns={"uid": "u", "shingles": "su"}), on="u", npartitions=npart)
    joined = joined.merge(sets.rename(columns={"uid": "v", "shingles": "sv"}), on="v", npartitions=npart)
    kept = joined.map_partitions(
        _jaccard_partition, run.config.threshold, meta={"u": "int64", "v": "int64", "jaccard": "float64"}
    )
    return {"verified_edges": write_partitions(run.dask, kept, directory, "dedup verify", run.progress)}


def _cluster_decisions(run: _DedupRun, sig_files: list[str], directory: Path) -> dict[str, Any]:
    """One document kept per component (shuffled on the component label)."""
    import dask.dataframe as dd

    npart = run.npart
    labels = dd.read_parquet(parquet_files(run.work.dir("components") / "final"), columns=["node", "label"])
    meta = dd.read_parquet(sig_files, columns=["uid", "id", "part", "length", "quality"])
    members = labels.merge(meta, left_on="node", right_on="uid", npartitions=npart)
    decisions = members.shuffle(on="label", npartitions=npart).map_partitions(
        _choose_clusters, run.config.keep, meta=_empty_decisions()
    )
    return _write_decisions(run, decisions, directory, "dedup clusters", "in_clusters")


def _write_decisions(run: _DedupRun, decisions, directory: Path, desc: str, counted: str) -> dict[str, Any]:
    """Write the decisions, one directory per input file, and count them."""
    written = decisions.map_partitions(_write_decisions_by_part, str(directory), meta=_DECISION_COUNTS)
    results = compute_with_progress(run.dask, written, desc, run.progress)
    return _decision_counts(results, counted)


def _apply(
    run: _DedupRun, input: str | Path | list, output: str | Path, reason: str, stats: dict[str, Any], started: float
) -> dict[str, Any]:
    """The last phase: each input file split into kept and rejected documents by the decisions,
    through `run_tasks`, which publishes `output` with the manifest."""
    config, work = run.config, run.work
    tasks = [
        ApplyDecisions(str(path), part, str(work.dir("decisions")), reason, config.batch_rows)
        for part, path in enumerate(run.files)
    ]
    t0 = time.time()

    def add_dedup_details(manifest: dict) -> None:
        run.seconds["apply"] = round(time.time() - t0, 3)
        manifest["timings"]["seconds"] = round(time.time() - started, 3)
        manifest["timings"]["phases"] = run.seconds
        manifest["resumed_phases"] = work.resumed
        manifest["dedup"] = stats

    return run_tasks(
        "dedup",
        asdict(config),
        tasks,
        output,
        inputs=[storage.absolute(p) for p in input_list(input)],
        upstream=upstream_manifest(input),
        versions=_versions(),
        client=run.dask,
        progress=run.progress,
        finalize=add_dedup_details,
        what="curate dedup apply",
        also_kept=run.phases_kept,
    )


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
    counts = [0] * len(files)
    calls = (
        (part, (rows[part], str(work.dir("decisions")), part, first + part, str(rows_dir), config.verify))
        for part in range(len(files))
    )
    submit_and_collect(client, _index_rows, calls, counts.__setitem__, desc="dedup index", unit="file", progress=False)
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
