"""Run a recipe's plan: each step writes under the work directory, records its fingerprint when
it finishes, and is skipped by a later run while that fingerprint holds.

Resuming after a crash needs nothing special: a step's fingerprint is written only after its
output is complete, curation stages publish their directories atomically, the encoder keeps
finished partitions, and the trainer resumes from its latest checkpoint. A killed run started
again therefore redoes only the unfinished step, from where that step can resume.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tokenmill import __version__
from tokenmill.errors import DiskFullError, TokenmillError
from tokenmill.infra import faults, storage
from tokenmill.infra.atomic import atomic_dir, atomic_write_text, remove_leftovers
from tokenmill.infra.lock import PidLock, pid_alive
from tokenmill.pipelines.plan import (
    STATE_DIR,
    Selection,
    Step,
    StepRef,
    build_plan,
    is_fresh,
    read_state,
    select,
    state_path,
)
from tokenmill.pipelines.recipe import Recipe
from tokenmill.train.metrics import read_metrics

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    name: str
    status: str  # ran | skipped | not-selected
    seconds: float = 0.0
    summary: str = ""


@dataclass
class RunResult:
    workdir: Path
    steps: list[StepResult] = field(default_factory=list)
    report_md: Path | None = None
    report_html: Path | None = None
    seconds: float = 0.0


class Context:
    """What steps share during one run: the recipe, the work directory, one Dask client."""

    def __init__(
        self,
        recipe: Recipe,
        workdir: Path,
        steps: list[Step],
        *,
        scheduler: str | None,
        workers: int | None,
        progress: bool,
        client: Any = None,
    ) -> None:
        self.recipe = recipe
        self.workdir = workdir
        self.steps = {s.name: s for s in steps}
        self.scheduler = scheduler
        self.workers = workers
        self.progress = progress
        self._client_stack: ExitStack | None = None
        self._client: Any = client
        self._own_client = client is None
        self.remote: RemoteWorkdir | None = None  # the work directory's URL, when it has one

    def client(self) -> Any:
        """The Dask client every curation and encoding step shares, opened on first use."""
        if self._client is None:
            from tokenmill.infra.cluster import dask_client

            self._client_stack = ExitStack()
            self._client = self._client_stack.enter_context(dask_client(self.scheduler, self.workers))
        return self._client

    def close_client(self) -> None:
        """Closed before training, so the trainer's processes get the cores."""
        if not self._own_client:
            return
        if self._client_stack is not None:
            self._client_stack.close()
        self._client_stack = None
        self._client = None


def _remove_leftovers(step: Step) -> None:
    """Temporary directories a killed run left beside this step's output (the stages write to
    `.NAME.tmp-*` and rename when done), so they do not pile up over resumes."""
    if step.output.parent.is_dir():
        remove_leftovers(step.output)


class WorkdirLock(PidLock):
    """One run per work directory at a time: two runs would publish over each other."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(
            workdir / STATE_DIR / "lock",
            lambda holder: TokenmillError(
                f"another tokenmill run (pid {holder}) is using {workdir}; wait for it or use another --workdir"
            ),
        )


def resolve_workdir(path: str | Path) -> str | Path:
    """The work directory as given: an absolute local path, or a URL (see `RemoteWorkdir`)."""
    return storage.absolute(path) if storage.is_url(path) else Path(path).resolve()


def default_workdir(recipe: Recipe) -> str | Path:
    if recipe.workdir:
        return resolve_workdir(recipe.resolve(recipe.workdir))
    return Path.cwd() / f"{recipe.name}-work"


class RemoteWorkdir:
    """A work directory on object storage, run through its local copy in the cache.

    The run starts by taking the lock object ``.state/lock`` with a conditional create (an S3
    PUT with ``If-None-Match: *``: of two runs, exactly one creates it), then brings the local
    copy up to date with the URL. Each finished step is published like any other output: the
    step's state file is removed before it runs, its output files are uploaded (and files of an
    older output that it no longer has removed), and the state file, the mark of a finished
    step, is uploaded last. The lock object is removed when the run ends."""

    LOCK = f"{STATE_DIR}/lock"

    def __init__(self, url: str) -> None:
        self.mirror = storage.Mirror(url, "workdirs")
        self.url, self.local = self.mirror.url, self.mirror.local
        self._held = False

    def acquire(self) -> None:
        import socket

        holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        for _ in range(2):
            if self.mirror.create(self.LOCK, json.dumps(holder).encode()):
                self._held = True
                return
            other = _json_or_none(self.mirror.read(self.LOCK)) or {}
            if other.get("host") != holder["host"] or pid_alive(other.get("pid")):
                break
            # Left by a run on this machine that no longer exists (killed): it is safe to take.
            log.warning(f"removing {self.url}/{self.LOCK}, left by pid {other.get('pid')}, which has ended")
            self.mirror.remove(self.LOCK)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(other.get("started", 0)))
        raise TokenmillError(
            f"another tokenmill run (host {other.get('host', '?')}, pid {other.get('pid', '?')}, since {since}) is "
            f"using {self.url}; wait for it or use another --workdir (if that run is gone, delete {self.url}/{self.LOCK})"
        )

    def release(self) -> None:
        if self._held:
            self.mirror.remove(self.LOCK)
            self._held = False

    def pull(self) -> None:
        """Make the local copy hold what the URL holds. Local state files the URL lacks are removed:
        a step counts as finished only once its state reached the URL."""
        names = [n for n in self.mirror.files() if n != self.LOCK]
        self.mirror.pull(names)
        remote_states = {n for n in names if n.startswith(f"{STATE_DIR}/")}
        for path in (self.local / STATE_DIR).rglob("*.json") if (self.local / STATE_DIR).is_dir() else []:
            if path.relative_to(self.local).as_posix() not in remote_states:
                path.unlink()

    def _name(self, path: Path) -> str:
        return path.relative_to(self.local).as_posix()

    def forget(self, step: Step) -> None:
        """Before a step runs: it stops counting as finished on the URL too."""
        self.mirror.remove(self._name(state_path(self.local, step)))

    def push_step(self, step: Step) -> None:
        """After a step finished: its output files, then its state file."""
        prefix = self._name(step.output)
        files = [self._name(p) for p in sorted(step.output.rglob("*")) if p.is_file() and _published(p)]
        self.mirror.push(files)
        for stale in sorted(set(self.mirror.files(prefix)) - set(files)):
            self.mirror.remove(stale)  # of an older output of this step
        self.mirror.push([], last=[self._name(state_path(self.local, step))])

    def push_files(self, paths: list[Path]) -> None:
        self.mirror.push([self._name(p) for p in paths if p is not None and p.is_file()])

    def push_checkpoint(self, step: Step, run_dir: Path, done: str | None) -> str | None:
        """While a training step runs: upload its newest checkpoint if it is not ``done`` (the one
        uploaded last), with the step's config and fingerprint, so that a rerun on another
        machine resumes the training from it. Returns the checkpoint now on the URL."""
        from tokenmill.train.checkpoint import LATEST, RemoteRun

        latest = run_dir / "checkpoints" / LATEST
        name = latest.read_text().strip() if latest.is_file() else None
        if name is None or name == done:
            return done
        try:
            self.mirror.push([self._name(step.output / "config.yaml"), self._name(step.output / "fingerprint")])
            RemoteRun(f"{self.url}/{self._name(run_dir)}", local=run_dir).push(run_dir / "checkpoints" / name)
        except (TokenmillError, OSError) as error:  # pruned by the trainer meanwhile: the next one goes
            log.warning(f"  checkpoint {name} not uploaded yet: {error}")
            return done
        return name


def _published(path: Path) -> bool:
    """Not the trainer's lock or a temporary sibling (``.NAME.tmp-*``) a writer leaves while it works."""
    return path.name != ".lock" and not any(part.startswith(".") and ".tmp" in part for part in path.parts)


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------------------------
# Step implementations


def _ingest(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.curate.ingest import ingest

    source = ctx.recipe.source(step.source or "")
    extra: dict[str, Any] = {}
    if source.format == "python-docs":
        from tokenmill.pipelines.pydocs import build_corpus

        corpus = ctx.workdir / "sources" / source.name / "corpus.jsonl"
        log.info(f"  assembling the python-docs corpus -> {corpus}")
        extra = build_corpus(corpus, source.max_documents)
        paths: list[Any] = [corpus]
        fmt, id_field = "jsonl", "id"
    else:
        paths = [ctx.recipe.resolve(p) for p in source.paths()]
        fmt, id_field = source.format, source.id_field
    manifest = ingest(
        [str(p) for p in paths],
        step.output,
        format=fmt,
        text_field=source.text_field,
        id_field=id_field,
        source=source.name,
        separator=source.separator,
        client=ctx.client(),
        progress=ctx.progress,
    )
    if extra:
        manifest["python_docs"] = extra
        (step.output / "python-docs.json").write_text(json.dumps(extra, indent=2) + "\n")
    return manifest


def _curate(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.curate.registry import recipe_stage

    kind = recipe_stage(step.config["stage"])
    options = dict(step.config["options"])
    if "classifier" in step.config:
        from tokenmill.pipelines.plan import classifier_model_path

        options["model"] = str(classifier_model_path(ctx.workdir, step.config["classifier"]))
    upstream = ctx.steps[step.deps[0]].output
    config = kind.recipe_options(options)
    if getattr(config, "index", None) and hasattr(config, "index_owner"):
        # A dedup index: what this step added to it is replaced when the step reruns (--from,
        # --force, a changed upstream), instead of being found there as duplicates of itself.
        where = ctx.remote.url if ctx.remote is not None else str(ctx.workdir)
        config = replace(config, index_owner=f"{where}#{step.name}")
    return kind.run(config, str(upstream), step.output, client=ctx.client(), progress=ctx.progress)


def _classifier(ctx: Context, step: Step) -> dict[str, Any]:
    """Train the quality classifier on the ingested positive and negative sources."""
    from tokenmill.curate.classifier import train_classifier
    from tokenmill.pipelines.plan import classifier_model_path

    positive = [str(ctx.steps[StepRef.ingest(s)].output) for s in step.config["positive"]]
    negative = [str(ctx.steps[StepRef.ingest(s)].output) for s in step.config["negative"]]
    name = step.name.last
    with atomic_dir(step.output) as tmp:
        meta = train_classifier(positive, negative, tmp / "model.bin", **step.config["options"])
    assert classifier_model_path(ctx.workdir, name).exists()
    return meta


def _tokenizer(ctx: Context, step: Step) -> dict[str, Any]:
    spec = ctx.recipe.tokenize
    assert spec is not None
    target = step.output / "tokenizer.json"
    with atomic_dir(step.output) as tmp:
        if spec.file:
            shutil.copyfile(ctx.recipe.resolve(spec.file), tmp / "tokenizer.json")
        else:
            from tokenmill.tokenize.tokenizer import train_tokenizer

            inputs = [str(ctx.steps[d].output) for d in step.deps]
            log.info(f"  training a byte-level BPE (vocab {spec.vocab_size}) on {len(inputs)} curated source(s)")
            train_tokenizer(
                inputs,
                spec.vocab_size,
                tmp / "tokenizer.json",
                sample_docs=spec.sample_docs,
                progress=ctx.progress,
                **spec.options,
            )
    from tokenmill.tokenize.tokenizer import load_tokenizer, tokenizer_hash, vocab_size

    return {
        "path": str(target.relative_to(ctx.workdir)),
        "vocab_size": vocab_size(load_tokenizer(target)),
        "hash": tokenizer_hash(target),
    }


def _encode(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.tokenize.encode import encode_documents

    docs = ctx.steps[step.deps[0]].output
    tokenizer = ctx.steps[StepRef.tokenizer()].output / "tokenizer.json"
    step.output.mkdir(parents=True, exist_ok=True)
    # The encoder resumes from the partitions under PREFIX.parts/, so the prefix is stable.
    return encode_documents(str(docs), tokenizer, step.output / step.source, client=ctx.client(), progress=ctx.progress)


def blend_weights(entries: list[dict[str, Any]], tokens: dict[str, int]) -> dict[str, float]:
    """Normalised weights; `epochs: e` means e passes over the source's tokens, so its weight
    is proportional to e x tokens (MT-NLG gives some sources in epochs, others in weight).
    Mixing both: weights are shares of the stream and the epoch sources take their share."""
    epoch_tokens = {e["source"]: e["epochs"] * tokens[e["source"]] for e in entries if e.get("epochs") is not None}
    weighted = {e["source"]: e["weight"] for e in entries if e.get("weight") is not None}
    if not weighted:
        total = sum(epoch_tokens.values())
        return {k: v / total for k, v in epoch_tokens.items()}
    if not epoch_tokens:
        total = sum(weighted.values())
        return {k: v / total for k, v in weighted.items()}
    # Weighted sources fill the stream the epoch sources leave; scale by their token shares.
    w_total = sum(weighted.values())
    weighted_tokens = sum(tokens[k] for k in weighted)
    stream = sum(epoch_tokens.values()) + weighted_tokens
    out = {k: v / stream for k, v in epoch_tokens.items()}
    rest = 1.0 - sum(out.values())
    out.update({k: rest * v / w_total for k, v in weighted.items()})
    return out


def _blend(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.tokenize.encode import read_shard_metadata

    entries = step.config["blend"]
    prefixes = {e["source"]: ctx.steps[StepRef.encode(e["source"])].output / e["source"] for e in entries}
    tokens = {name: int(read_shard_metadata(p)["tokens"]) for name, p in prefixes.items()}
    empty = [name for name, n in tokens.items() if n == 0]
    if empty:
        raise TokenmillError(f"blend: source(s) {', '.join(empty)} have no tokens left after curation")
    weights = blend_weights(entries, tokens)
    # Prefixes relative to blend.json (as `load_blend_file` reads them), so the work directory can move.
    blend = [
        {"prefix": os.path.relpath(prefixes[name], step.output), "weight": round(weights[name], 12)}
        for name in prefixes
    ]
    info = {"requested": entries, "weights": weights, "tokens": tokens}
    with atomic_dir(step.output) as tmp:
        (tmp / "blend.json").write_text(json.dumps(blend, indent=2) + "\n")
        (tmp / "blend-info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def train_config(ctx: Context, step: Step) -> dict[str, Any]:
    """The trainer's config for this run: the recipe's, plus data, output, tokenizer and layout
    (the model's vocabulary, when left out, is the shards' tokenizer's, padded by the trainer)."""
    spec = ctx.recipe.train
    assert spec is not None
    from tokenmill.train.config import apply_overrides

    tokenizer_dir = ctx.steps[StepRef.tokenizer()].output
    overrides = {
        "data": str(ctx.steps[StepRef.blend()].output / "blend.json"),
        "out": str(step.output / "run"),
        "tokenizer": str(tokenizer_dir / "tokenizer.json"),
        **spec.overrides(),
    }
    # Nested sections (old flat keys moved into them): the trainer reads this file.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # reported once, when the recipe was checked
        config = apply_overrides(ctx.recipe.train_config_dict(), overrides)
    return config


def _read_marker(path: Path) -> dict[str, Any]:
    """The training step's record of what its run directory was trained from (empty if none)."""
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or a format this version does not write: the run is not resumed
    return marker if isinstance(marker, dict) else {}


def _hash_file(path: Path) -> str:
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def training_data(workdir: Path, blend_file: Path, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the training step reads, by content: the blend file and each shard's .bin and .idx
    (xxh3-128, names relative to the work directory, so a moved work directory keeps them).
    A file whose size and mtime are those `previous` recorded keeps its recorded digest: a
    re-run over shards nobody rewrote reads none of them."""
    from tokenmill.tokenize.blend import load_blend_file
    from tokenmill.tokenize.indexed import bin_path, idx_path

    paths = [blend_file]
    for entry in load_blend_file(blend_file):
        paths += [bin_path(entry.prefix), idx_path(entry.prefix)]
    known = (previous or {}).get("files", {})
    files: dict[str, dict[str, Any]] = {}
    for path in paths:
        name = os.path.relpath(path, workdir)
        stat = path.stat()
        record = known.get(name) or {}
        if record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns and record.get("xxh3"):
            digest = record["xxh3"]
        else:
            digest = _hash_file(path)
        files[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "xxh3": digest}
    combined = json.dumps(sorted((name, f["xxh3"]) for name, f in files.items()))
    import xxhash

    return {"digest": xxhash.xxh3_128_hexdigest(combined.encode()), "files": files}


def _changed_files(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    old = {name: f.get("xxh3") for name, f in before.get("files", {}).items()}
    changed = [name for name, f in now["files"].items() if old.get(name) != f["xxh3"]]
    return changed + [name for name in old if name not in now["files"]] or ["unknown"]


def _resume_note(run_dir: Path) -> str:
    """Which checkpoint the trainer resumes (it says itself when that one finished training)."""
    from tokenmill.train.checkpoint import LATEST

    latest = run_dir / "checkpoints" / LATEST
    name = latest.read_text().strip() if latest.is_file() else ""
    return f"resuming from the latest checkpoint in {run_dir / 'checkpoints'}" + (f" ({name})" if name else "")


# How often a run on a work directory URL looks for a new checkpoint of its training step to upload.
CHECKPOINT_POLL_SECONDS = 5.0


def _train(ctx: Context, step: Step) -> dict[str, Any]:
    ctx.close_client()
    config = train_config(ctx, step)
    step.output.mkdir(parents=True, exist_ok=True)
    config_path = step.output / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = step.output / "run"
    # Checkpoints are resumed only by the run that made them: a changed config upstream means a
    # different fingerprint, and a re-run upstream step (--from, --force) that wrote other
    # shards means other data under the same fingerprint. Either way training starts afresh.
    marker = step.output / "fingerprint"
    recorded = _read_marker(marker)
    data = training_data(ctx.workdir, ctx.steps[StepRef.blend()].output / "blend.json", recorded.get("data"))
    if run_dir.exists():
        if recorded.get("fingerprint") != step.fingerprint:
            log.info(f"  the training config or its inputs changed since {run_dir} was written: starting afresh")
            shutil.rmtree(run_dir)
        elif recorded.get("data", {}).get("digest") != data["digest"]:
            changed = _changed_files(recorded.get("data", {}), data)
            log.info(
                f"  the training data changed since {run_dir} was written ({', '.join(changed)}): "
                "starting afresh, not from its checkpoints"
            )
            shutil.rmtree(run_dir)
    atomic_write_text(marker, json.dumps({"fingerprint": step.fingerprint, "data": data}, indent=2) + "\n")
    resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))
    spec = ctx.recipe.train
    assert spec is not None
    # Inside a Slurm job the trainer spans the allocation (`srun ... torchrun ...`, recipe_job.py).
    from tokenmill.infra.slurm import TRAIN_LAUNCHER_ENV

    launcher = shlex.split(os.environ.get(TRAIN_LAUNCHER_ENV, "")) or [sys.executable]
    argv = [*launcher, "-m", "tokenmill.cli", "train", str(config_path), *spec.extra_args]
    if resume:
        argv.append("--resume")
        log.info(f"  config and data unchanged: {_resume_note(run_dir)}")
    if not ctx.progress:
        argv.append("--no-progress")
    log.info(f"  $ {' '.join(argv[argv.index('tokenmill.cli') + 1 :])}")
    from tokenmill.train.launch import child_env
    from tokenmill.train.lifecycle import LAUNCHER_PID_ENV, PIPELINE_PID_ENV

    # The trainer imports the installed package whatever the cwd holds, and ends with this run.
    env = {
        **child_env(spec.world_size),
        PIPELINE_PID_ENV: str(os.getpid()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    env.pop(LAUNCHER_PID_ENV, None)
    process = subprocess.Popen(argv, env=env)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the trainer below is stopped with us, not orphaned

    import threading

    from tokenmill.train.stop import STOPPED_EXIT, TrainingStopped, request_stop

    def on_sigusr1(signum: int, frame: Any) -> None:
        request_stop(run_dir)  # the trainer checkpoints and stops (train/stop.py)

    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    previous_usr1 = signal.signal(signal.SIGUSR1, on_sigusr1) if in_main else None
    uploaded = None
    try:
        while True:
            try:
                rc = process.wait(timeout=None if ctx.remote is None else CHECKPOINT_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                uploaded = ctx.remote.push_checkpoint(step, run_dir, uploaded)
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGUSR1, previous_usr1)
    if ctx.remote is not None and rc != 0:
        # The checkpoint a stop (or a failure) left, for a rerun on any machine to resume from.
        ctx.remote.push_checkpoint(step, run_dir, uploaded)
    if rc == STOPPED_EXIT:
        raise TrainingStopped(f"training stopped at a checkpoint on request in {run_dir}; re-run to resume it")
    if rc != 0:
        raise TokenmillError(
            f"training failed (exit status {rc}); fix the cause and re-run: it resumes from the last checkpoint"
        )
    metrics = read_metrics(run_dir)
    last = metrics[-1] if metrics else {}
    return {
        "run_dir": str(run_dir.relative_to(ctx.workdir)),
        "steps": last.get("step"),
        "loss": last.get("loss"),
        "val_loss": next((m["val_loss"] for m in reversed(metrics) if "val_loss" in m), None),
    }


def _eval(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.pipelines.evaluate import run_eval

    spec = ctx.recipe.eval
    assert spec is not None
    return run_eval(ctx, step, spec)


RUNNERS = {
    "ingest": _ingest,
    "classifier": _classifier,
    "curate": _curate,
    "tokenizer": _tokenizer,
    "encode": _encode,
    "blend": _blend,
    "train": _train,
    "eval": _eval,
}


def summarise(step: Step, result: dict[str, Any]) -> str:
    counts = result.get("counts") if isinstance(result, dict) else None
    if step.kind == "encode":
        return f"{result.get('documents')} documents, {result.get('tokens')} tokens"
    if counts and "in" in counts:
        rejected = sum(counts.get("rejected", {}).values())
        return f"in {counts['in']}, kept {counts['kept']}, rejected {rejected}"
    if step.kind == "classifier":
        accuracy = result.get("holdout_accuracy")
        return f"held-out accuracy {accuracy:.3f}" if isinstance(accuracy, (int, float)) else "trained"
    if step.kind == "tokenizer":
        return f"vocab {result.get('vocab_size')}"
    if step.kind == "blend":
        return ", ".join(f"{k} {v:.3f}" for k, v in result.get("weights", {}).items())
    if step.kind == "train":
        loss = result.get("loss")
        return f"step {result.get('steps')}, loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
    if step.kind == "eval":
        return f"{len(result.get('results', []))} result(s)"
    return ""


@contextmanager
def _disk_full_is_an_error(what: str, workdir: Path) -> Iterator[None]:
    """A full disk (here or in a Dask worker) as one line: every output is published atomically,
    so what earlier steps finished is intact and a re-run after freeing space resumes; a stage
    that met it says which of its partitions are kept (`tokenmill.infra.faults`)."""
    intact = "finished steps and previous outputs are intact"
    hint = f"free space under {workdir} and run again to resume"
    try:
        yield
    except DiskFullError as error:
        raise DiskFullError(what, error.target, "; ".join(filter(None, (error.kept, intact))), hint) from error
    except OSError as error:
        if not faults.is_disk_full(error):
            raise
        raise DiskFullError(what, error.filename, intact, hint) from error


# --------------------------------------------------------------------------------------------
# The run


def run_recipe(
    recipe: Recipe,
    workdir: str | Path | None = None,
    *,
    from_: list[str] | None = None,
    until: list[str] | None = None,
    force: list[str] | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    report: bool = True,
    client: Any = None,
) -> RunResult:
    """Run the steps of `recipe` that are selected and out of date; write the report.
    `client`: an existing Dask client for the curation and encoding steps (else one is opened
    from `scheduler`/`workers`, or the recipe's, and closed before training)."""
    started = time.time()
    workdir, remote = _open_workdir(workdir or default_workdir(recipe))
    try:
        steps = build_plan(recipe, workdir)
        selection = select(steps, from_, until, force)
        lock = _lock_workdir(recipe, workdir, remote)
    except BaseException:
        if remote is not None:
            remote.release()  # the lock object outlives the process: never leave it behind
        raise
    ctx = Context(
        recipe,
        workdir,
        steps,
        scheduler=scheduler or recipe.scheduler,
        workers=workers or recipe.workers,
        progress=progress,
        client=client,
    )
    ctx.remote = remote
    result = RunResult(workdir)
    try:
        for index, step in enumerate(steps, start=1):
            result.steps.append(_run_step(ctx, step, f"[{index}/{len(steps)}] {step.name}", selection))
    finally:
        ctx.close_client()
        lock.__exit__()
        _close_run(recipe, workdir, steps, remote, result, report)
    result.seconds = time.time() - started
    _log_summary(result, remote)
    return result


def _open_workdir(workdir: str | Path) -> tuple[Path, RemoteWorkdir | None]:
    """The local work directory to run in and, for a URL, the remote one: its lock taken and
    its local copy brought up to date (the lock released again if that fails)."""
    workdir = resolve_workdir(workdir)
    if not storage.is_url(workdir):
        assert isinstance(workdir, Path)
        return workdir, None
    remote = RemoteWorkdir(str(workdir))
    remote.acquire()
    try:
        remote.pull()
    except BaseException:
        remote.release()
        raise
    return remote.local, remote


def _lock_workdir(recipe: Recipe, workdir: Path, remote: RemoteWorkdir | None) -> WorkdirLock:
    """Take the work directory for this run and record the recipe as run in it."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / STATE_DIR).mkdir(exist_ok=True)
    lock = WorkdirLock(workdir).__enter__()
    # The recipe as run, for the report and for whoever opens the directory later (atomic: a
    # full disk leaves the previous one).
    with _disk_full_is_an_error("recipe.json", workdir):
        atomic_write_text(workdir / "recipe.json", recipe.model_dump_json(indent=2) + "\n")
    if remote is not None:
        remote.push_files([workdir / "recipe.json"])
    return lock


def _run_step(ctx: Context, step: Step, tag: str, selection: Selection) -> StepResult:
    """Run `step` if it is selected and out of date (or forced); say why not otherwise."""
    fresh = is_fresh(ctx.workdir, step)
    if step.name not in selection.runnable:
        note = _not_selected(ctx, step, selection, fresh)
        log.info(f"{tag}: {note}")
        return StepResult(step.name, "skipped" if fresh else "not-selected", summary=note)
    if fresh and step.name not in selection.forced:
        state = read_state(ctx.workdir, step) or {}
        log.info(f"{tag}: up to date, skipped ({state.get('summary', '')})")
        return StepResult(step.name, "skipped", summary=state.get("summary", ""))
    log.info(f"{tag}: {step.description}")
    result = _execute(ctx, step)
    log.info(f"{tag}: done in {result.seconds:.1f}s: {result.summary}")
    return result


def _not_selected(ctx: Context, step: Step, selection: Selection, fresh: bool) -> str:
    """What a step left out by --from/--until is; an error if selected steps need its output
    and it has none."""
    if fresh:
        return "up to date, not selected"
    if read_state(ctx.workdir, step) and step.output.exists():
        return "not selected; out of date, its previous output is used"
    if any(step.name in s.deps for s in ctx.steps.values() if s.name in selection.runnable):
        raise TokenmillError(
            f"{step.name} has never finished but selected steps need it; run without --from/--until first"
        )
    return "not selected"


def _execute(ctx: Context, step: Step) -> StepResult:
    """Run a step: it stops counting as finished, runs, and records its fingerprint (and, for a
    remote work directory, publishes its output and then its state)."""
    workdir, remote = ctx.workdir, ctx.remote
    state_path(workdir, step).unlink(missing_ok=True)
    if remote is not None:
        remote.forget(step)
    _remove_leftovers(step)
    t0 = time.time()
    with _disk_full_is_an_error(step.name, workdir):
        outcome = RUNNERS[step.kind](ctx, step)
    seconds = time.time() - t0
    summary = summarise(step, outcome)
    state = {
        "step": step.name,
        "fingerprint": step.fingerprint,
        "finished": time.time(),
        "seconds": round(seconds, 3),
        "summary": summary,
        "version": __version__,
        "result": outcome,
    }
    with _disk_full_is_an_error(step.name, workdir):
        atomic_write_text(state_path(workdir, step), json.dumps(state, indent=2, default=str) + "\n")
    if remote is not None:
        remote.push_step(step)
    return StepResult(step.name, "ran", seconds, summary)


def _close_run(
    recipe: Recipe, workdir: Path, steps: list[Step], remote: RemoteWorkdir | None, result: RunResult, report: bool
) -> None:
    """After the run, whatever its end: the report written (and uploaded), the remote lock
    released. Neither hides the run's own error."""
    if report:
        from tokenmill.pipelines.report import write_report

        try:
            result.report_md, result.report_html = write_report(recipe, workdir, steps)
        except Exception as error:  # a report must never hide the run's own error
            log.warning(f"report: could not be written: {error}")
    if remote is not None:
        try:
            remote.push_files([result.report_md, result.report_html])
        except TokenmillError as error:  # nor must its upload
            log.warning(f"report: could not be uploaded: {error}")
        finally:
            remote.release()


def _log_summary(result: RunResult, remote: RemoteWorkdir | None) -> None:
    """What ran and how long it took, the evaluation's scores (on stdout) and the report."""
    workdir = result.workdir
    ran = [s for s in result.steps if s.status == "ran"]
    skipped = [s for s in result.steps if s.status == "skipped"]
    log.info("")
    log.info(
        f"tokenmill run: {len(ran)} step(s) ran, {len(skipped)} up to date, in {result.seconds:.1f}s; "
        f"work directory {remote.url if remote is not None else workdir}"
    )
    for s in ran:
        log.info(f"  {s.name:<32} {s.seconds:7.1f}s  {s.summary}")
    results_path = workdir / "eval" / "results.json"
    if any(s.name == StepRef.eval() for s in ran) and results_path.exists():
        from tokenmill.eval.results import markdown_table

        log.info("")
        # the scores are the run's result: stdout, as `tokenmill eval` prints them
        print(markdown_table(json.loads(results_path.read_text())["results"]), end="", flush=True)
    if result.report_html:
        log.info(f"report: {result.report_html} (and {result.report_md.name})")


def format_plan(
    recipe: Recipe,
    workdir: str | Path,
    from_: list[str] | None = None,
    until: list[str] | None = None,
    force: list[str] | None = None,
) -> str:
    """What `--dry-run` prints: every step with its status, inputs and output; the training
    layout with the planner's memory estimate. A work directory URL is brought into its local
    copy first (under its lock, as a run would)."""
    if storage.is_url(workdir):
        remote = RemoteWorkdir(str(workdir))
        remote.acquire()
        try:
            remote.pull()
        finally:
            remote.release()
        workdir = remote.local
    steps = build_plan(recipe, workdir)
    selection: Selection = select(steps, from_, until, force)
    lines = [f"recipe {recipe.name}: {len(steps)} steps; work directory {workdir}", ""]
    for index, step in enumerate(steps, start=1):
        if step.name not in selection.runnable:
            status = "not selected"
        elif step.name in selection.forced:
            status = "will run (forced)"
        elif is_fresh(workdir, step):
            status = "up to date"
        else:
            status = "will run"
        lines.append(f"{index:>3}. {step.name}  [{status}]  fingerprint {step.fingerprint}")
        lines.append(f"       {step.description}")
        for item in step.inputs:
            lines.append(f"       in:  {item}")
        lines.append(f"       out: {step.output}")
    if recipe.train is not None:
        from tokenmill.pipelines.layout import describe_layout

        lines += ["", *describe_layout(recipe)]
    return "\n".join(lines)
