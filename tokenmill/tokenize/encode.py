"""Encode documents into a Megatron token shard (`PREFIX.bin/.idx/.json`) on Dask.

Each partition (a slice of one Parquet file's row group) is encoded by a worker with the
tokenizer's batched Rust encoder, an EOD token is appended to every document, and the result is
written as its own small shard `PREFIX.parts/part-NNNNN.{bin,idx,json}`. The `.json` is written
last and names everything the part depends on (input file fingerprint, rows, tokenizer hash), so
a re-run skips the parts that are already done. When every part is done they are merged, in
partition order, into `PREFIX.bin/.idx`, and the work directory is removed.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill import __version__
from tokenmill.errors import TokenmillError
from tokenmill.infra import machine_faults, records, storage
from tokenmill.infra.cluster import client_or_new, external_scheduler, submit_and_collect
from tokenmill.infra.document_dirs import check_document_columns, input_list, resolve_input_files, upstream_manifest
from tokenmill.infra.outputs import OutputKind, claim_output
from tokenmill.tokenize.indexed import (
    CHECKSUM_ALGORITHM,
    IndexedDatasetWriter,
    bin_path,
    dtype_for_vocab,
    file_checksum,
    idx_path,
)
from tokenmill.tokenize.tokenizer import (
    PIECE_CHARS,
    eod_id,
    load_tokenizer,
    local_tokenizer_path,
    splits_safely,
    text_pieces,
    tokenizer_hash,
    vocab_size,
)

# Documents per encode_batch call: large enough for the Rust thread pool, small enough to bound
# a worker's memory.
ENCODE_BATCH_DOCS = 1000
# Pieces of one long document per encode_batch call: the Rust pool's work, in bounded memory.
PIECES_PER_CALL = 4
# Rows per partition: enough work per task to amortise scheduling, and enough tasks to keep
# every worker busy on a few files.
PARTITION_ROWS = 5000

REASON_MISSING = "missing_text"  # text is null or not a string
REASON_EMPTY = "empty"  # no tokens (empty text): Megatron appends EOD only to non-empty documents
REASON_ENCODE_ERROR = "encode_error"  # the tokenizer raised on this document


@dataclass(frozen=True)
class EncodePartition:
    """Rows [start, stop) of one row group of one Parquet file."""

    index: int
    path: str
    row_group: int
    start: int
    stop: int
    fingerprint: str  # size and mtime of the file: a changed input invalidates the part

    @property
    def name(self) -> str:
        return f"part-{self.index:05d}"


@dataclass(frozen=True)
class EncodeSettings:
    tokenizer_path: str
    tokenizer_hash: str
    eod_id: int
    dtype: str
    parts_dir: str
    # Whether the tokenizer may use its own Rust thread pool inside a task. With one worker
    # process per core, extra threads only contend (and spin) for the same cores.
    rust_threads: bool = True


def _file_fingerprint(path: Path | str) -> str:
    _, size, version = storage.fingerprint(path)
    return f"{size}-{version}"


def plan_partitions(files: list[Path], rows_per_partition: int = PARTITION_ROWS) -> list[EncodePartition]:
    partitions: list[EncodePartition] = []
    for path in files:
        parquet_file = storage.parquet_file(path)
        metadata = parquet_file.metadata
        check_document_columns(parquet_file.schema_arrow.names, path)
        fingerprint = _file_fingerprint(path)
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            for start in range(0, rows, rows_per_partition):
                partitions.append(
                    EncodePartition(
                        len(partitions), str(path), group, start, min(rows, start + rows_per_partition), fingerprint
                    )
                )
    return partitions


def _part_key(partition: EncodePartition, settings: EncodeSettings) -> str:
    identity = {
        **asdict(partition),
        "tokenizer_hash": settings.tokenizer_hash,
        "eod_id": settings.eod_id,
        "dtype": settings.dtype,
    }
    identity.pop("index")
    return records.digest(identity, length=None)


def _finished_part(parts_dir: Path, partition: EncodePartition, settings: EncodeSettings) -> dict[str, Any] | None:
    """The completion record of a partition's part shard, if it is of these settings and the
    shard is there."""
    done = records.read_record(parts_dir / f"{partition.name}.json", key=_part_key(partition, settings))
    return done if done is not None and idx_path(parts_dir / partition.name).exists() else None


# One tokenizer per worker process, loaded on first use and never pickled.
_TOKENIZERS: dict[str, Any] = {}


def _worker_tokenizer(settings: EncodeSettings):
    key = settings.tokenizer_hash
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(settings.tokenizer_path)
    return _TOKENIZERS[key]


def _long_document_ids(tokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    """A long document's ids, encoded a few pieces at a time (`text_pieces`: the ids of the
    whole text, in memory bounded by the pieces rather than the document)."""
    pieces = text_pieces(text)
    arrays = []
    for begin in range(0, len(pieces), PIECES_PER_CALL):
        for encoding in tokenizer.encode_batch_fast(pieces[begin : begin + PIECES_PER_CALL], add_special_tokens=False):
            arrays.append(np.asarray(encoding.ids, dtype=dtype))
    return np.concatenate(arrays)


def _encode_texts(tokenizer, texts: list[str], dtype: np.dtype) -> tuple[list, list[int]]:
    """Each text's token ids (a list, or an array for a long document encoded in pieces when the
    tokenizer allows it); on failure fall back to one document at a time to isolate the bad one.
    Returns the ids (None for a failed document) and the failed positions."""
    in_pieces = splits_safely(tokenizer)
    long = {position for position, text in enumerate(texts) if len(text) > PIECE_CHARS} if in_pieces else set()
    ids: list = [None] * len(texts)
    failed = []
    short = [position for position in range(len(texts)) if position not in long]
    try:
        encodings = tokenizer.encode_batch_fast([texts[p] for p in short], add_special_tokens=False)
        for position, encoding in zip(short, encodings):
            ids[position] = encoding.ids
    except Exception:
        for position in short:
            try:
                ids[position] = tokenizer.encode(texts[position], add_special_tokens=False).ids
            except Exception:
                failed.append(position)
    for position in sorted(long):
        try:
            ids[position] = _long_document_ids(tokenizer, texts[position], dtype)
        except Exception:
            failed.append(position)
    return ids, sorted(failed)


def encode_partition(partition: EncodePartition, settings: EncodeSettings) -> dict[str, Any]:
    """Worker side: encode one partition into its part shard, or reuse the part already there."""
    parts_dir = Path(settings.parts_dir)
    marker = parts_dir / f"{partition.name}.json"
    key = _part_key(partition, settings)
    done = _finished_part(parts_dir, partition, settings)
    if done is not None:
        return {**done, "resumed": True}

    try:
        table = storage.parquet_file(partition.path).read_row_group(partition.row_group, columns=["text"])
    except TokenmillError:
        raise
    except Exception as error:  # pyarrow raises several types for a corrupt file
        raise TokenmillError(f"cannot read Parquet file {partition.path}: {error}") from None
    texts_all = table.column("text").slice(partition.start, partition.stop - partition.start).to_pylist()
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if settings.rust_threads else "false"
    tokenizer = _worker_tokenizer(settings)
    dtype = np.dtype(settings.dtype)
    eod = settings.eod_id
    rejected: Counter[str] = Counter()
    writer = IndexedDatasetWriter(parts_dir / partition.name, dtype)
    try:
        for begin in range(0, len(texts_all), ENCODE_BATCH_DOCS):
            batch = texts_all[begin : begin + ENCODE_BATCH_DOCS]
            texts = []
            for text in batch:
                if not isinstance(text, str):
                    rejected[REASON_MISSING] += 1
                elif not text:
                    rejected[REASON_EMPTY] += 1
                else:
                    texts.append(text)
            if not texts:
                continue
            documents_ids, failed = _encode_texts(tokenizer, texts, dtype)
            rejected[REASON_ENCODE_ERROR] += len(failed)
            documents_ids = [ids for ids in documents_ids if ids is not None]
            lengths = np.fromiter((len(ids) for ids in documents_ids), dtype=np.int64, count=len(documents_ids))
            keep = lengths > 0
            rejected[REASON_EMPTY] += int((~keep).sum())
            if not keep.all():
                documents_ids = [ids for ids, k in zip(documents_ids, keep) if k]
                lengths = lengths[keep]
            total = int(lengths.sum()) + len(documents_ids)
            if any(isinstance(ids, np.ndarray) for ids in documents_ids):
                end = np.array([eod], dtype=dtype)
                flat = np.concatenate([part for ids in documents_ids for part in (np.asarray(ids, dtype=dtype), end)])
            else:
                # Each document's ids followed by its EOD, flattened without a per-document array.
                flat = np.fromiter(
                    itertools.chain.from_iterable(itertools.chain(ids, (eod,)) for ids in documents_ids),
                    dtype=dtype,
                    count=total,
                )
            writer.add_documents(flat, (lengths + 1).astype(np.int32))
        documents, tokens = len(writer), writer.tokens
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    result = {
        "key": key,
        "name": partition.name,
        "path": partition.path,
        "rows": partition.stop - partition.start,
        "documents": documents,
        "tokens": tokens,
        "rejected": {reason: n for reason, n in rejected.items() if n},
    }
    records.write_record(marker, result)
    return {**result, "resumed": False}


def _encode_partitions(
    dask, partitions: list[EncodePartition], settings: EncodeSettings, progress: bool
) -> dict[int, dict[str, Any]]:
    """Encode every partition on the cluster; the results by partition index."""
    results: dict[int, dict[str, Any]] = {}
    tokens = 0

    def add(index: int, result: dict[str, Any]) -> dict[str, int]:
        nonlocal tokens
        results[index] = result
        tokens += result["tokens"]
        return {"tokens": tokens}

    # Every partition runs to completion even when one fails, so that a re-run after
    # fixing the bad input only redoes what failed.
    calls = ((partition.index, (partition, settings)) for partition in partitions)
    submit_and_collect(
        dask,
        encode_partition,
        calls,
        add,
        desc="encode",
        key="encode-part",
        unit="part",
        progress=progress,
        keep_going=True,
    )
    return results


def _finished_partitions(partitions: list[EncodePartition], settings: EncodeSettings) -> int:
    """How many partitions have a complete part shard that a rerun reuses."""
    parts_dir = Path(settings.parts_dir)
    finished = 0
    for partition in partitions:
        if _finished_part(parts_dir, partition, settings) is not None:
            finished += 1
    return finished


def work_dir_for(prefix: Path) -> Path:
    return Path(f"{prefix}.parts")


def _parts_kept(target: storage.Location) -> bool:
    """Whether an encode killed while it published `target` left its parts (on object storage
    they are kept in the local working copy the shard is built in)."""
    return work_dir_for(_output_prefix(target.path)[1]).is_dir()


# What `--output-prefix` may replace: an earlier shard, PREFIX.json beside it, or the files of
# an encode killed while it published them (PREFIX.parts/ is still there).
SHARD_OUTPUT = OutputKind(
    "a token shard", ("{name}.json",), layout="prefix", suffixes=(".bin", ".idx", ".json"), leftover=_parts_kept
)


def _input_manifest(input: Any, files: list[Path]) -> dict[str, Any]:
    upstream = upstream_manifest(input)
    return {
        "paths": [storage.absolute(p) for p in input_list(input)],
        "files": [
            {"path": storage.absolute(p), "bytes": storage.size(p), "rows": storage.parquet_file(p).metadata.num_rows}
            for p in files
        ],
        "upstream": upstream,
    }


def encode_documents(
    input: str | Path | list,
    tokenizer_path: str | Path,
    output_prefix: str | Path,
    *,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    eod_token: str | None = None,
    rows_per_partition: int = PARTITION_ROWS,
) -> dict[str, Any]:
    """Encode documents (Parquet directory or stage directory) into `PREFIX.bin/.idx/.json`.

    Returns the metadata written to `PREFIX.json`. Re-running after an interruption reuses the
    partitions already written under `PREFIX.parts/`. The prefix is held for the whole run
    (`claim_output`): files there that an earlier encode did not write are refused.
    """
    with claim_output(output_prefix, SHARD_OUTPUT, flag="--output-prefix", inputs=input_list(input)):
        return _encode_documents(
            input,
            tokenizer_path,
            output_prefix,
            client=client,
            scheduler=scheduler,
            workers=workers,
            progress=progress,
            eod_token=eod_token,
            rows_per_partition=rows_per_partition,
        )


def _encode_documents(
    input: str | Path | list,
    tokenizer_path: str | Path,
    output_prefix: str | Path,
    *,
    client,
    scheduler: str | None,
    workers: int | None,
    progress: bool,
    eod_token: str | None,
    rows_per_partition: int,
) -> dict[str, Any]:
    started = time.time()
    files = resolve_input_files(input)
    tokenizer_source = storage.absolute(tokenizer_path)
    tokenizer_path = local_tokenizer_path(tokenizer_path).resolve()
    tokenizer = load_tokenizer(tokenizer_path)
    n_vocab = vocab_size(tokenizer)
    eod = eod_id(tokenizer, eod_token)
    dtype = dtype_for_vocab(n_vocab)
    remote, prefix = _output_prefix(output_prefix)
    parts_dir = work_dir_for(prefix)
    partitions = plan_partitions(files, rows_per_partition)

    address: list[str] = []
    settings: EncodeSettings | None = None

    def kept() -> str:
        # Asked once encoding has stopped: the part markers say what a rerun reuses.
        done = _finished_partitions(partitions, settings) if settings is not None else 0
        return machine_faults.partitions_kept(done, len(partitions), parts_dir if done else None)

    with machine_faults.reported_faults(
        "tokenize encode", remote or str(prefix), kept, lambda: address[0] if address else None
    ):
        with client_or_new(client, scheduler, workers) as dask:
            address.append(external_scheduler(dask))
            # The parts directory only once the cluster answers: an unreachable scheduler
            # leaves nothing beside the output.
            parts_dir.mkdir(parents=True, exist_ok=True)
            n_workers = len(dask.scheduler_info(n_workers=-1).get("workers", {}))
            settings = EncodeSettings(
                str(tokenizer_path),
                tokenizer_hash(tokenizer_path),
                eod,
                dtype.name,
                str(parts_dir),
                rust_threads=n_workers <= 1,
            )
            results = _encode_partitions(dask, partitions, settings, progress)

        merge_started = time.time()
        writer, checksums = _merge_parts(prefix, dtype, partitions, parts_dir)
    rows, rejected = _counts(results)
    finished = time.time()
    documents = len(writer)
    metadata = {
        "format": "megatron-mmididx",
        "prefix": remote or str(prefix),
        "tokenizer": {"path": tokenizer_source, "hash": settings.tokenizer_hash, "vocab_size": n_vocab},
        "vocab_size": n_vocab,
        "eod_id": eod,
        "dtype": dtype.name,
        "documents": documents,
        "tokens": writer.tokens,
        "counts": {"in": rows, "kept": documents, "rejected": dict(sorted(rejected.items()))},
        "partitions": {"total": len(partitions), "resumed": sum(1 for r in results.values() if r["resumed"])},
        # What `tokenmill tokenize inspect --verify` checks the files against.
        "checksums": {"algorithm": CHECKSUM_ALGORITHM, **checksums},
        "input": _input_manifest(input, files),
        "versions": _versions(),
        "timings": {
            "started": started,
            "finished": finished,
            "seconds": round(finished - started, 3),
            "merge_seconds": round(finished - merge_started, 3),
        },
    }
    if rows != documents + sum(rejected.values()):
        writer.abort()
        raise RuntimeError(f"encode lost documents: in={rows} kept={documents} rejected={dict(rejected)}")
    publish_shard(writer, json.dumps(metadata, indent=2, default=str) + "\n", url=remote)
    shutil.rmtree(parts_dir, ignore_errors=True)
    return metadata


def _output_prefix(output_prefix: str | Path) -> tuple[str | None, Path]:
    """The shard's URL on object storage (None for local disk) and the local prefix it is built at."""
    target = storage.Location(output_prefix).absolute()
    # Shards bound for object storage are built in the local working copy of their directory
    # (kept between runs, so a re-run resumes its finished partitions) and pushed when complete.
    prefix = storage.working_copy(target.parent, "staging") / target.name
    remote = None if target.is_local else target.path
    if prefix.name.endswith((".bin", ".idx", ".json")):
        raise TokenmillError(
            f"--output-prefix {output_prefix} should not carry an extension (PREFIX.bin/.idx/.json are written)"
        )
    return remote, prefix


def _counts(results: dict[int, dict[str, Any]]) -> tuple[int, Counter[str]]:
    """The input rows of all partitions and their rejected documents by reason."""
    rejected: Counter[str] = Counter()
    for result in results.values():
        rejected.update(result["rejected"])
    return sum(r["rows"] for r in results.values()), rejected


def _merge_parts(
    prefix: Path, dtype: np.dtype, partitions: list[EncodePartition], parts_dir: Path
) -> tuple[IndexedDatasetWriter, dict[str, str]]:
    """The part shards joined into one sealed shard at `prefix` (published by `publish_shard`),
    and its checksums."""
    writer = IndexedDatasetWriter(prefix, dtype)
    try:
        for partition in partitions:
            writer.add_index(parts_dir / partition.name)
        checksums = writer.seal()
    except BaseException:
        writer.abort()
        raise
    return writer, checksums


def publish_shard(writer: IndexedDatasetWriter, meta_text: str, url: str | None = None) -> None:
    """Publish a sealed shard at its prefix, or upload it to `url` when it was staged locally.
    `PREFIX.json` goes first away and last back: a crash in between leaves a shard without
    metadata (which readers of a bucket take for an unfinished upload), never a new `.bin` /
    `.idx` beside the old `.json`, whose counts and checksums describe other files."""
    target = url or str(writer.prefix)
    storage.remove(f"{target}.json")
    try:
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    if url:
        staged = storage.Mirror(storage.parent(url), "staging", local=writer.prefix.parent)
        staged.push([bin_path(writer.prefix).name, idx_path(writer.prefix).name])
    storage.write_text(f"{target}.json", meta_text)
    if url:
        for path in (bin_path(writer.prefix), idx_path(writer.prefix)):
            path.unlink(missing_ok=True)


def _versions() -> dict[str, str]:
    import tokenizers

    return {
        "tokenmill": __version__,
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


def read_shard_metadata(prefix: str | Path) -> dict[str, Any]:
    """The `PREFIX.json` written by `encode_documents`."""
    path = f"{prefix}.json"
    missing = f"shard metadata not found: {path} (was {prefix} written by `tokenmill tokenize encode`?)"
    return storage.read_json(path, missing=missing)


def verify_shard(prefix: str | Path) -> dict[str, str]:
    """Hash `PREFIX.idx` and `PREFIX.bin` again (in chunks, whatever their size) and compare
    with the checksums `PREFIX.json` recorded at encode time; the first file that differs is
    named in the error. Returns the checksums."""
    meta_path = f"{prefix}.json"
    recorded = read_shard_metadata(prefix).get("checksums")
    if not isinstance(recorded, dict) or recorded.get("algorithm") != CHECKSUM_ALGORITHM:
        raise TokenmillError(
            f"{meta_path} records no {CHECKSUM_ALGORITHM} checksums of the shard's files (it was written by an older"
            " tokenmill or another tool): encode the shard again to record them"
        )
    for name, path in (("idx", idx_path(prefix)), ("bin", bin_path(prefix))):
        actual = file_checksum(path)
        if actual != recorded.get(name):
            raise TokenmillError(
                f"{path} has {CHECKSUM_ALGORITHM} {actual}, but {meta_path} records {recorded.get(name)}: the file"
                " changed after it was encoded (encode the shard again or restore it from a copy)"
            )
    return {"idx": recorded["idx"], "bin": recorded["bin"]}


__all__ = ["encode_documents", "read_shard_metadata", "verify_shard", "plan_partitions", "bin_path", "idx_path"]
