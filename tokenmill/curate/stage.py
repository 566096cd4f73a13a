"""The stage contract: documents in, `kept/` + `rejected/` + `manifest.json` out, atomically.

A stage (declared in `tokenmill.curate.registry`) is one `StageOptions` dataclass: its fields
are the options, `process` the per-batch function. `run_stage` splits the input into partition
tasks (`StageOptions.partitions`: one per input Parquet file, or a stage's own split, as ingest's of
raw files) that run on Dask workers. Each task yields one or more `Batch`es, written as
`part-<task>-<batch>.parquet` in `kept/` and `rejected/`, so memory is bounded by a batch, not
by the corpus, and the set of output documents does not depend on the number of workers. The
runner checks `in == kept + rejected` for every batch. A stage with shuffle phases of its own
(dedup) ends with `run_tasks`, the same loop.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokenmill import __version__
from tokenmill.curate import resume
from tokenmill.curate.documents import read_documents, write_documents, write_rejected_ids
from tokenmill.infra import machine_faults, storage
from tokenmill.infra.atomic import remove_leftovers_in, replace_dir
from tokenmill.infra.cluster import client_or_new, external_scheduler, submit_and_collect
from tokenmill.infra.document_dirs import (
    KEPT_DIR,
    MANIFEST_FILE,
    REJECTED_DIR,
    check_document_columns,
    input_list,
    resolve_input_files,
    upstream_manifest,
)
from tokenmill.infra.outputs import OutputKind, claim_output

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


def _publication_interrupted(target: storage.Location) -> bool:
    """Whether `target` is a stage output on object storage whose publication was cut short:
    its files are copied into place one by one, the manifest last, and the stage's partial
    prefix beside it is removed only after that."""
    return not target.is_local and bool(
        storage.glob(storage.parent(target.native()), storage.work_prefix(target.path) + "*")
    )


# What `--output` of a curate stage may replace: an earlier stage directory (see `claim_output`).
STAGE_OUTPUT = OutputKind("a stage directory", (MANIFEST_FILE,), leftover=_publication_interrupted)

# Rows per batch when a Parquet input file is large; bounds a worker's memory.
PARQUET_BATCH_ROWS = 20_000


@dataclass
class Batch:
    """What a stage made of one batch of documents: kept ones, rejected ones (with `reason`),
    counters."""

    n_in: int
    kept: pd.DataFrame
    rejected: pd.DataFrame
    stats: dict[str, int] = field(default_factory=dict)


# Rejected records keep this much of their raw input, enough to see why without copying a corpus.
RAW_PREVIEW_CHARS = 2_000


class DocumentBatcher:
    """Kept and rejected documents of one source, emitted as `Batch` batches.

    `columns` are the document columns beyond id, text and source (web archives add url, date
    and the like); a record leaves out those it does not know, and they are null.
    """

    def __init__(self, source: str, columns: Sequence[str] = ()) -> None:
        self.source = source
        self.kept_columns = ["id", "text", "source", *columns]
        self.rejected_columns = [*self.kept_columns, "reason", "raw"]
        self.kept: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []
        self.stats: dict[str, int] = {}

    def keep(self, doc_id: str, text: str, meta: dict[str, Any] | None = None) -> None:
        self.kept.append({"id": doc_id, "text": text, "source": self.source, **(meta or {})})

    def reject(
        self,
        doc_id: str,
        reason: str,
        raw: str | bytes | None,
        meta: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="backslashreplace")
        if raw is not None and len(raw) > RAW_PREVIEW_CHARS:
            raw = raw[:RAW_PREVIEW_CHARS] + "..."
        self.rejected.append(
            {"id": doc_id, "text": text, "source": self.source, **(meta or {}), "reason": reason, "raw": raw}
        )

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def __len__(self) -> int:
        return len(self.kept) + len(self.rejected)

    def flush(self) -> Batch:
        import pandas as pd

        kept = pd.DataFrame(self.kept, columns=self.kept_columns)
        rejected = pd.DataFrame(self.rejected, columns=self.rejected_columns)
        output = Batch(n_in=len(kept) + len(rejected), kept=kept, rejected=rejected, stats=self.stats)
        self.kept, self.rejected, self.stats = [], [], {}
        return output


def reject(frame: pd.DataFrame, reason: str | pd.Series) -> pd.DataFrame:
    """Rows of `frame` marked with a rejection reason (one string, or one per row)."""
    rejected = frame.copy()
    rejected["reason"] = reason
    return rejected


class PartitionTask(Protocol):
    """A picklable unit of work that yields batches of output."""

    def run(self) -> Iterator[Batch]: ...


class StageOptions:
    """A stage's options and its work, declared once.

    Subclasses are dataclasses whose fields are the stage's options (made with
    `registry.option`; they go into the manifest) and implement `process` for one batch of
    documents. A stage that reads something other than documents (ingest's raw files) splits
    its input itself (`partitions`). Expensive state (models) is loaded lazily in the worker, never
    pickled.
    """

    name: str = "stage"

    def process(self, docs: pd.DataFrame) -> Batch:
        """Split one batch into kept and rejected documents."""
        raise NotImplementedError(f"{type(self).__name__} processes no document batch")

    def partitions(self, input: Any) -> list[PartitionTask]:
        """The partition tasks over the input: one per Parquet file, batched by `process`."""
        return [ParquetPartition(str(path), self) for path in resolve_input_files(input)]

    def upstream(self, input: Any) -> dict[str, Any] | None:
        """The manifest of the stage that wrote the input, if any (summed up in this one's)."""
        return upstream_manifest(input)

    def manifest_config(self) -> dict[str, Any]:
        """The options as the manifest records them (and `tokenmill inspect` reads them)."""
        return asdict(self) if is_dataclass(self) else {}

    def versions(self) -> dict[str, str]:
        """Versions of the libraries whose behaviour shapes this stage's output."""
        return {}

    def finalize(self, manifest: dict[str, Any]) -> None:
        """Add stage-specific entries to the manifest before it is published."""


@dataclass
class ParquetPartition:
    """One input Parquet file, processed in row batches by a stage's `process`."""

    path: str
    stage: StageOptions

    def run(self) -> Iterator[Batch]:
        parquet_file = storage.parquet_file(self.path)
        check_document_columns(parquet_file.schema_arrow.names, self.path)
        if parquet_file.metadata.num_rows <= PARQUET_BATCH_ROWS:
            yield self.stage.process(read_documents(self.path))
            return
        for batch in parquet_file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            yield self.stage.process(batch.to_pandas())


def _library_versions() -> dict[str, str]:
    # The installed distributions' versions, read from their metadata: the process that
    # submits a stage never imports pandas (over a CPU second) just to name its version.
    from importlib.metadata import version

    return {
        "tokenmill": __version__,
        "python": platform.python_version(),
        **{name: version(name) for name in ("pandas", "pyarrow", "dask")},
    }


# How a stage records the documents it rejects in `rejected/`: whole (every column, as kept
# documents have them, plus the reason), ids (`id` and `reason` only, one file per partition)
# or none (the manifest's counts only).
REJECTED_MODES = ("whole", "ids", "none")
REJECTED_ID_COLUMNS = ["id", "reason"]


@dataclass
class Link:
    """One stage of a pass over the partitions: the first link's batches come from the partition
    tasks, each later link's `process` takes the documents the link before it kept.

    `write` False: the link runs only to feed the links after it (its directory is up to date);
    `keep` False: its kept documents go only to the next link, not to `kept/`."""

    name: str
    config: dict[str, Any]
    output: str | Path
    process: Callable[[pd.DataFrame], Batch] | None = None
    inputs: list[str] = field(default_factory=list)
    upstream: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    finalize: Callable[[dict[str, Any]], None] | None = None
    write: bool = True
    keep: bool = True


@dataclass
class _LinkWork:
    """What a worker needs of a link: its `process`, and where it writes (None: nowhere)."""

    name: str
    process: Callable[[pd.DataFrame], Batch] | None
    work_dir: str | None
    keep: bool


def _new_counts() -> dict[str, Any]:
    return {"in": 0, "kept": 0, "rejected": Counter(), "stats": Counter()}


def _check_batch(output: Batch, task_index: int, stage_name: str) -> None:
    n_rejected = len(output.rejected)
    if output.n_in != len(output.kept) + n_rejected:
        raise RuntimeError(
            f"{stage_name} lost documents in task {task_index}:"
            f" in={output.n_in} kept={len(output.kept)} rejected={n_rejected}"
        )
    if n_rejected and "reason" not in output.rejected.columns:
        raise RuntimeError("rejected documents must carry a `reason`")


def _write_batch(output: Batch, link: _LinkWork, name: str, rejected: str) -> None:
    assert link.work_dir is not None
    if link.keep:
        write_documents(output.kept, storage.join(link.work_dir, KEPT_DIR, name))
    if len(output.rejected) and rejected == "whole":
        write_documents(output.rejected, storage.join(link.work_dir, REJECTED_DIR, name))


def _run_task(task: PartitionTask, task_index: int, links: Sequence[_LinkWork], rejected: str) -> list[dict[str, Any]]:
    """Worker side: run one partition through every link, each batch through the links in turn,
    write what each link writes, record the partition as finished in each link's directory (the
    last link last) and return each link's counts.

    Rejected documents as ids are gathered over the partition's batches and written as one file
    per link and partition (`part-TTTTT.parquet`): a web archive's thousands of rejected ids in
    one file, not one small file, each with its footer, per batch of records."""
    import pandas as pd

    counts = [_new_counts() for _ in links]
    rejected_ids: list[list[pd.DataFrame]] = [[] for _ in links]
    for batch_index, output in enumerate(task.run()):
        name = f"part-{task_index:05d}-{batch_index:04d}.parquet"
        for position, link in enumerate(links):
            if position:
                assert link.process is not None
                # A fresh index, as the frame read back from the previous link's Parquet has.
                output = link.process(output.kept.reset_index(drop=True))
            _check_batch(output, task_index, link.name)
            if link.work_dir is not None:
                _write_batch(output, link, name, rejected)
                if rejected == "ids" and len(output.rejected):
                    rejected_ids[position].append(output.rejected[REJECTED_ID_COLUMNS])
            _add_counts(counts[position], _batch_counts(output))
    for link, frames in zip(links, rejected_ids):
        if frames:
            assert link.work_dir is not None
            path = storage.join(link.work_dir, REJECTED_DIR, f"part-{task_index:05d}.parquet")
            write_rejected_ids(pd.concat(frames, ignore_index=True), path)
    for link, link_counts in zip(links, counts):
        if link.work_dir is not None:
            resume.record_done(link.work_dir, task_index, link_counts)
    return counts


def _batch_counts(output: Batch) -> dict[str, Any]:
    rejected = Counter(output.rejected["reason"].astype(str).value_counts().to_dict()) if len(output.rejected) else {}
    return {"in": output.n_in, "kept": len(output.kept), "rejected": rejected, "stats": output.stats}


def publish(tmp_dir: Path, output: Path) -> None:
    """Move a finished stage directory into place, replacing an older one."""
    replace_dir(tmp_dir, output)


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n"


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / MANIFEST_FILE).write_text(manifest_text(manifest))


def run_tasks(
    stage_name: str,
    config: dict[str, Any],
    tasks: Sequence[PartitionTask],
    output: str | Path,
    *,
    inputs: list[str],
    upstream: dict[str, Any] | None = None,
    versions: dict[str, str] | None = None,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    finalize: Callable[[dict[str, Any]], None] | None = None,
    what: str | None = None,
    also_kept: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Run partition tasks on Dask and publish `output` (kept/, rejected/, manifest.json): the
    one-link case of `run_chain`, whose documentation says the rest."""
    link = Link(
        stage_name,
        config,
        output,
        inputs=inputs,
        upstream=upstream,
        versions=versions or {},
        finalize=finalize,
    )
    (manifest,) = run_chain(
        [link],
        tasks,
        client=client,
        scheduler=scheduler,
        workers=workers,
        progress=progress,
        what=what,
        also_kept=also_kept,
    )
    return manifest


def run_chain(
    links: Sequence[Link],
    tasks: Sequence[PartitionTask],
    *,
    rejected: str = "whole",
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    what: str | None = None,
    also_kept: Callable[[], str | None] | None = None,
) -> list[dict[str, Any]]:
    """Run partition tasks through `links` in one pass on Dask and publish each written link's
    stage directory (kept/ where the link keeps, rejected/ as `rejected` says, manifest.json);
    returns their manifests, in order.

    Each manifest's `finalize` may add entries before it is written, so a published directory is
    complete the moment it appears. A rerun after a crash runs only the partitions that the
    crashed run did not finish in every link (`tokenmill.curate.resume`). A full disk or a lost
    scheduler ends the run with one line naming `what` ran (default `curate NAME`) and what a
    rerun resumes: the finished partitions, and `also_kept()` (a caller's own checkpoints).
    """
    if rejected not in REJECTED_MODES:
        raise ValueError(f"rejected must be one of {REJECTED_MODES}, got {rejected!r}")
    written = [link for link in links if link.write]
    targets = [storage.Location(link.output).absolute() for link in written]
    remote = not targets[-1].is_local
    outputs = [target.native() for target in targets]
    versions = [{**_library_versions(), **link.versions} for link in links]
    key = _chain_key(links, versions, rejected, len(tasks))
    started = time.time()
    totals = [_new_counts() for _ in links]
    tmp_dirs: list[Any] = []
    address: str | None = None
    last = written[-1]

    def tally(_index: int, counts: list[dict[str, Any]]) -> dict[str, int]:
        for link_totals, link_counts in zip(totals, counts):
            _add_counts(link_totals, link_counts)
        end = totals[links.index(last)]
        return {"kept": end["kept"], "rejected": sum(end["rejected"].values())}

    try:
        with client_or_new(client, scheduler, workers) as dask:
            address = external_scheduler(dask)
            # The work directories only once the cluster answers: an unreachable scheduler leaves
            # nothing beside the outputs (and an older run's partitions where they are).
            tmp_dirs = [_work_dir(output, key, remote) for output in outputs]
            work = _link_work(links, tmp_dirs)
            done = _resumed_tasks(" + ".join(link.name for link in written), work, len(tasks), totals)
            n_workers = len(dask.scheduler_info(n_workers=-1).get("workers", {}))
            submit_and_collect(
                dask,
                _run_task,
                ((index, (task, index, work, rejected)) for index, task in enumerate(tasks) if index not in done),
                tally,
                desc=" + ".join(link.name for link in written),
                unit="part",
                progress=progress,
                total=len(tasks),
                initial=len(done),
            )
        manifests = _chain_manifests(links, versions, totals, rejected, started, n_workers, len(tasks), len(done))
        for tmp_dir, output, manifest in zip(tmp_dirs, outputs, manifests):
            _publish_stage(tmp_dir, output, manifest, remote)
    except BaseException as error:
        # Finished partitions stay for a rerun to resume; a run that finished none leaves nothing.
        for tmp_dir in tmp_dirs:
            _discard_unfinished(tmp_dir, len(tasks), remote)
        last_dir = tmp_dirs[-1] if tmp_dirs else None
        fault = machine_faults.as_user_error(
            error,
            what or f"curate {' + '.join(link.name for link in written)}",
            str(outputs[-1]),
            lambda: _kept_for_rerun(last_dir, len(tasks), also_kept),
            address,
        )
        if fault is not None:
            raise fault from error
        raise
    return manifests


def _chain_key(links: Sequence[Link], versions: list[dict[str, str]], rejected: str, n_tasks: int) -> str:
    """The key of a pass's work directories: a single stage's (`resume.stage_key`) for one link
    writing whole documents; for a chain, every link's config and what it writes as well."""
    first = links[0]
    if len(links) == 1 and rejected == "whole":
        return resume.stage_key(first.name, first.config, first.inputs, versions[0], n_tasks)
    chain = {
        "links": [
            {"stage": link.name, "config": link.config, "write": link.write, "keep": link.keep} for link in links
        ],
        "rejected": rejected,
    }
    merged = {name: value for link_versions in versions for name, value in link_versions.items()}
    return resume.stage_key(" + ".join(link.name for link in links), chain, first.inputs, merged, n_tasks)


def _link_work(links: Sequence[Link], tmp_dirs: list[Any]) -> list[_LinkWork]:
    dirs = iter(tmp_dirs)
    return [
        _LinkWork(link.name, link.process, str(next(dirs)) if link.write else None, link.keep and link.write)
        for link in links
    ]


def _chain_manifests(
    links: Sequence[Link],
    versions: list[dict[str, str]],
    totals: list[dict[str, Any]],
    rejected: str,
    started: float,
    n_workers: int,
    n_tasks: int,
    n_resumed: int,
) -> list[dict[str, Any]]:
    """The manifest of each written link: its own counts, and the link before it as upstream."""
    manifests = []
    for position, link in enumerate(links):
        if not link.write:
            continue
        inputs, upstream = link.inputs, link.upstream
        if position and link.upstream is None:
            before = links[position - 1]
            inputs = [storage.absolute(str(before.output))]
            upstream = (
                {"stage": before.name, "counts": _published_counts(totals[position - 1])}
                if before.write
                else upstream_manifest(before.output)
            )
        manifest = _stage_manifest(
            link.name,
            link.config,
            inputs,
            upstream,
            versions[position],
            started,
            n_workers,
            n_tasks,
            n_resumed,
            totals[position],
        )
        if len(links) > 1 or rejected != "whole":
            manifest["chain"] = {
                "stages": [other.name for other in links],
                "kept_written": link.keep,
                "rejected": rejected,
            }
        if link.finalize is not None:
            link.finalize(manifest)
        manifests.append(manifest)
    return manifests


def _published_counts(totals: dict[str, Any]) -> dict[str, Any]:
    return {"in": totals["in"], "kept": totals["kept"], "rejected": dict(sorted(totals["rejected"].items()))}


def _stage_manifest(
    stage_name: str,
    config: dict[str, Any],
    inputs: list[str],
    upstream: dict[str, Any] | None,
    versions: dict[str, str],
    started: float,
    n_workers: int,
    n_tasks: int,
    n_resumed: int,
    totals: dict[str, Any],
) -> dict[str, Any]:
    finished = time.time()
    return {
        "stage": stage_name,
        "config": config,
        "inputs": [storage.redact(path) for path in inputs],  # a presigned URL's signature is never stored
        "upstream": {"stage": upstream.get("stage"), "counts": upstream.get("counts")} if upstream else None,
        "versions": versions,
        "timings": {
            "started": started,
            "finished": finished,
            "seconds": round(finished - started, 3),
            "workers": n_workers,
        },
        "partitions": n_tasks,
        "resumed_partitions": n_resumed,
        "counts": _published_counts(totals),
        "stats": dict(sorted(totals["stats"].items())),
    }


def _resumed_tasks(what: str, links: Sequence[_LinkWork], n_tasks: int, totals: list[dict[str, Any]]) -> set[int]:
    """The partitions an earlier run finished in every written link, their counts added to
    `totals` (a partition some link did not record runs again in all of them)."""
    recorded = [resume.finished_tasks(link.work_dir, n_tasks) if link.work_dir else None for link in links]
    done = set.intersection(*(set(records) for records in recorded if records is not None))
    for link_totals, records in zip(totals, recorded):
        for index in done if records is not None else ():
            _add_counts(link_totals, records[index])
    if done:
        log.info("%s: resumed %d of %d partitions finished by an earlier run", what, len(done), n_tasks)
    return done


def _publish_stage(tmp_dir: Any, output: Any, manifest: dict[str, Any], remote: bool) -> None:
    if remote:
        # The records stay until the parts are in place: a run killed while copying resumes.
        storage.publish_prefix(tmp_dir, output, MANIFEST_FILE, manifest_text(manifest), private=resume.TASKS_DIR)
    else:
        # A worker killed while it wrote a part (a lost scheduler, a killed run) leaves the
        # part's temporary file; the partition ran again, and the torn file is not output.
        for sub in (KEPT_DIR, REJECTED_DIR):
            remove_leftovers_in(tmp_dir / sub)
        # The manifest before the records go: a full disk here keeps the partitions.
        write_manifest(tmp_dir, manifest)
        resume.remove_records(tmp_dir)
        publish(tmp_dir, output)


def _discard_unfinished(tmp_dir: Any, n_tasks: int, remote: bool) -> None:
    """Remove a failed run's partial directory when it holds no finished partition."""
    if remote:
        if not _remote_records(tmp_dir, n_tasks):
            _discard_remote(tmp_dir)
    elif not resume.finished_tasks(tmp_dir, n_tasks):
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _kept_for_rerun(tmp_dir: Any, n_tasks: int, also_kept: Callable[[], str | None] | None) -> str:
    """What a rerun resumes, in words: the records left on disk, and the caller's own checkpoints."""
    finished = len(_finished_records(tmp_dir, n_tasks)) if tmp_dir is not None else 0
    kept_partitions = machine_faults.partitions_kept(finished, n_tasks, tmp_dir if finished else None)
    return "; ".join(filter(None, (kept_partitions, also_kept() if also_kept else None)))


def _work_dir(output: Any, key: str, remote: bool) -> Any:
    """The stage's partial directory (a `Path`, or a URL prefix), created on local disk."""
    if not remote:
        output.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = resume.partial_dir(output, key)
    if remote:
        return tmp_dir
    (Path(tmp_dir) / KEPT_DIR).mkdir(parents=True, exist_ok=True)
    (Path(tmp_dir) / REJECTED_DIR).mkdir(parents=True, exist_ok=True)
    return Path(tmp_dir)


def _finished_records(tmp_dir: Any, n_tasks: int) -> dict[int, Any]:
    """The partitions recorded as finished (none when the store cannot say)."""
    try:
        return resume.finished_tasks(tmp_dir, n_tasks)
    except Exception:
        return {}


def _remote_records(tmp_prefix: str, n_tasks: int) -> bool:
    """Whether partitions are recorded under the prefix (True when the store cannot say, e.g.
    with the connection gone: the prefix is then left for a rerun)."""
    try:
        return bool(resume.finished_tasks(tmp_prefix, n_tasks))
    except Exception:
        return True


def _discard_remote(tmp_prefix: str) -> None:
    """Best effort: a failed run removes its temporary prefix (the next run removes what is
    left when this fails too, e.g. with the connection gone)."""
    try:
        storage.remove(tmp_prefix)
    except Exception as error:
        logging.getLogger(__name__).warning("could not remove %s: %s", tmp_prefix, error)


def _add_counts(totals: dict[str, Any], counts: dict[str, Any]) -> None:
    totals["in"] += counts["in"]
    totals["kept"] += counts["kept"]
    totals["rejected"].update(counts["rejected"])
    totals["stats"].update(counts["stats"])


def run_stage(
    stage: StageOptions,
    input: str | Path | list,
    output: str | Path,
    *,
    client=None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run a stage over its input (stage directories or Parquet files; raw files for ingest)
    and publish `output`, holding it for the whole run (`claim_output`); returns the manifest."""
    inputs = input_list(input)
    with claim_output(output, STAGE_OUTPUT, flag="--output", inputs=inputs):
        return run_tasks(
            stage.name,
            stage.manifest_config(),
            stage.partitions(input),
            output,
            inputs=[storage.absolute(p) for p in inputs],
            upstream=stage.upstream(input),
            versions=stage.versions(),
            client=client,
            scheduler=scheduler,
            workers=workers,
            progress=progress,
            finalize=stage.finalize,
        )
