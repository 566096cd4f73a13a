"""Proxy models: small training runs that answer a data question for `tokenmill ablate` and
`tokenmill mix`.

A proxy job is a blend of token shards, a training config and a seed. Its result is the
held-out text's bits per byte (the target) and/or an ICL suite's score (scored by the trainer's
`eval:` section at the last step), the loss on each source's held-out split, and the training
loss curve. Each result is a record `WORKDIR/proxies/<fingerprint>.json`, written
after the proxy finished; the fingerprint hashes the shards' own step fingerprints (not their
paths), the weights, the config, the seed and the target files, so a later run in the same work
directory (more mixtures, another variant, a killed run started again) trains only the proxies
it has no record of. Proxies are independent: they train side by side in worker processes, as
the tasks of one Slurm job array (`train_on_slurm`) or as tasks of a Dask cluster
(`train_on_dask`), each writing its own record.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill import __version__
from tokenmill.entry import run_reported
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.eval.suites import BUNDLED_SUITES
from tokenmill.infra import records
from tokenmill.infra.atomic import atomic_write_text
from tokenmill.infra.slurm import SLURM_DIR, SlurmSpec, header, prologue, quote, submit, write_script
from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.report import train_split_tokens
from tokenmill.pipelines.schema import SuiteTarget
from tokenmill.pipelines.step_graph import StepRef, build_plan
from tokenmill.pipelines.steps import blend_weights
from tokenmill.tokenize import DEFAULT_SPLIT

log = logging.getLogger(__name__)

PROXIES_DIR = "proxies"
# Points of the training loss curve kept in a result (the report draws them).
CURVE_POINTS = 50
# Samples of each source's held-out split scored for its loss.
HELDOUT_SAMPLES = 32
# The job array's script and its list of proxies, in WORKDIR/slurm/.
ARRAY_SCRIPT = "proxies.sbatch"
ARRAY_JOBS = "proxies.json"
# Seconds between looks for the array's results.
POLL_SECONDS = 1.0
# A difference of mean scores counts when it exceeds this many standard errors of the difference.
NOISE_MULTIPLE = 2.0


@dataclass(frozen=True)
class Shard:
    """One source's token shard, with the fingerprint of the step that encoded it: the same
    data has the same fingerprint in any work directory, so proxies of it are shared."""

    source: str
    prefix: str
    fingerprint: str
    train_tokens: int


@dataclass(frozen=True)
class TokenizedData:
    """What a recipe's curation and tokenization produced: one shard per blended source."""

    shards: dict[str, Shard]
    tokenizer: str
    weights: dict[str, float]  # the recipe's blend (token-proportional without one), summing to 1

    def token_shares(self) -> dict[str, float]:
        total = sum(s.train_tokens for s in self.shards.values())
        return {name: s.train_tokens / total for name, s in self.shards.items()}


@dataclass
class ProxyJob:
    label: str
    shards: list[Shard]
    weights: list[float]
    seed: int
    config: dict[str, Any]  # the proxy's training config, without its data, output and seed
    tokenizer: str
    targets: list[str]
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = records.digest(
            {
                "data": [[s.fingerprint, round(w, 6)] for s, w in zip(self.shards, self.weights)],
                "seed": self.seed,
                "config": self.config,
                "targets": records.identity(self.targets),
                "version": __version__,
            }
        )


@dataclass(frozen=True)
class Scoring:
    """What the proxies are scored on: held-out text files (bits per byte, lower is better)
    and an ICL suite (its aggregate, higher is better), either or both."""

    files: list[str]
    suite: SuiteTarget | None

    def objective(self) -> tuple[str, float, str]:
        """The score a decision rests on, when there is one: the record's key, the sign that
        makes lower better, and its name. The text's bits per byte, else the suite's score."""
        if self.files:
            return "target_bpb", 1.0, "target bits/byte"
        assert self.suite is not None
        return "suite_score", -1.0, f"{self.suite.suite} score"


@dataclass
class VariantScore:
    """The scores of one candidate over seeds: a variant of `tokenmill ablate`, or a blend of
    `tokenmill mix`'s check."""

    name: str
    scores: list[float]  # one per seed: the target's bits per byte, or the suite's score
    curves: list[list[list[float]]]  # training loss curves, one per seed

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.scores) if len(self.scores) > 1 else 0.0


@dataclass
class Comparison:
    better: str
    worse: str
    difference: float  # how much better, in `unit` (>= 0)
    noise: float  # NOISE_MULTIPLE standard errors of the difference
    significant: bool
    unit: str = "bits/byte"

    @property
    def verdict(self) -> str:
        if self.significant:
            return f"{self.better} beats {self.worse} by {self.difference:.4f} {self.unit} (noise {self.noise:.4f})"
        return (
            f"no difference between {self.better} and {self.worse}"
            f" ({self.difference:.4f} {self.unit}, noise {self.noise:.4f})"
        )


def compare(scores: list[VariantScore], unit: str = "bits/byte", higher_is_better: bool = False) -> list[Comparison]:
    """Every pair's verdict: the difference of their means counts when it exceeds NOISE_MULTIPLE
    standard errors of that difference (each one's spread over seeds, sd / sqrt(seeds), combined)."""
    out = []
    for i, a in enumerate(scores):
        for b in scores[i + 1 :]:
            better, worse = (a, b) if (a.mean >= b.mean if higher_is_better else a.mean <= b.mean) else (b, a)
            error = math.sqrt(a.sd**2 / len(a.scores) + b.sd**2 / len(b.scores))
            noise = NOISE_MULTIPLE * error
            difference = abs(worse.mean - better.mean)
            # Identical runs (zero spread, zero difference) are no difference, not a tie broken by order.
            significant = difference > noise and difference > 0 and len(a.scores) > 1 and len(b.scores) > 1
            out.append(Comparison(better.name, worse.name, difference, noise, significant, unit))
    return out


def proxy_config(recipe: Recipe, steps: int | None = None, suite: SuiteTarget | None = None) -> dict[str, Any]:
    """The proxies' training config: the recipe's `proxies.config` with the budget in steps, no
    checkpoint before the last step, no validation and one log line per proxy; with `suite`, its
    `eval:` section scores the suite at the last step (checked here: one line for an unknown
    suite or task, or a missing folder)."""
    from tokenmill.train.config import apply_overrides
    from tokenmill.train.preflight import check_eval

    steps = steps or recipe.proxies.steps
    evaluation = {}
    if suite is not None:
        evaluation = {
            "eval.suite": suite.suite if suite.suite in BUNDLED_SUITES else str(recipe.resolve(suite.suite)),
            "eval.tasks": suite.tasks,
            "eval.data_dir": str(recipe.resolve(suite.data_dir)) if suite.data_dir else None,
            "eval.limit": suite.limit,
            "eval.every": steps,
        }
    config = apply_overrides(
        recipe.config_data(recipe.proxies.config),
        {
            "schedule.steps": steps,
            "schedule.global_batch_size": recipe.proxies.batch_size,
            "schedule.micro_batch_size": recipe.proxies.batch_size,  # one micro-batch: a proxy is small
            "dataset.seq_len": recipe.proxies.seq_len,
            # Common random numbers: proxies differ only by their weights, not by data order.
            "dataset.same_source_order": True,
            "checkpoint.interval": steps,
            "checkpoint.keep_last": 1,
            "logging.interval": steps,
            "logging.eval_interval": 0,
            "logging.tensorboard": False,
            "logging.progress": False,
            **evaluation,
        },
    )
    if suite is not None:
        check_eval(train_config(config))
    return config


def train_config(config: dict[str, Any]) -> Any:
    """The proxies' config as the trainer reads it, its data (each proxy's own) left out."""
    from tokenmill.train.config import config_from_dict

    return config_from_dict({**config, "dataset": {**config.get("dataset", {}), "path": "unused"}})


def budget_tokens(config: dict[str, Any]) -> int:
    """Tokens one proxy trains on: steps x global batch x sequence length."""
    cfg = train_config(config)
    return cfg.schedule.steps * cfg.schedule.global_batch_size * cfg.sequence_length


def tokenize_recipe(
    recipe: Recipe, workdir: Path, *, workers: int | None = None, scheduler: str | None = None, progress: bool = True
) -> TokenizedData:
    """Run (or find done) the recipe's curation and tokenization in `workdir` (on the Dask cluster
    at `scheduler`, else the recipe's): its shards."""
    from tokenmill.pipelines.runner import run_recipe

    if recipe.tokenize is None:
        raise ConfigError(f"recipe {recipe.name}: proxies need a `tokenize:` section (a tokenizer for the sources)")
    run_recipe(
        recipe, workdir, until=["tokenize"], scheduler=scheduler, workers=workers, progress=progress, report=False
    )
    steps = {s.name: s for s in build_plan(recipe, workdir)}
    blended = [b.source for b in recipe.blend] if recipe.blend else [s.name for s in recipe.sources]
    split = str(_dataset_section(recipe).get("split", DEFAULT_SPLIT))
    shards = {}
    for name in blended:
        step = steps[StepRef.encode(name)]
        prefix = str(step.output / name)
        shards[name] = Shard(name, prefix, step.fingerprint, train_split_tokens(prefix, split))
    tokens = {name: s.train_tokens for name, s in shards.items()}
    if recipe.blend:
        weights = blend_weights([b.model_dump() for b in recipe.blend], tokens)
    else:
        weights = {name: n / sum(tokens.values()) for name, n in tokens.items()}
    tokenizer = str(steps[StepRef.tokenizer()].output / "tokenizer.json")
    return TokenizedData(shards, tokenizer, weights)


def _dataset_section(recipe: Recipe) -> dict[str, Any]:
    section = recipe.config_data(recipe.proxies.config).get("dataset")
    return section if isinstance(section, dict) else {}


def check_targets(recipe: Recipe, targets: list[str | SuiteTarget], command: str) -> Scoring:
    """The held-out text files, absolute, each checked to exist (one line for a missing one),
    and the suite, if one is named."""
    if not targets:
        raise ConfigError(
            f"{command}: nothing to score the proxies on; give --target FILE or proxies.target (text or a suite)"
        )
    resolved = [str(recipe.resolve(t)) for t in targets if isinstance(t, str)]
    for path in resolved:
        if not Path(path).exists():
            raise ConfigError(f"{command}: the target {path} does not exist")
    return Scoring(resolved, next((t for t in targets if isinstance(t, SuiteTarget)), None))


def describe(record: dict[str, Any]) -> str:
    """A proxy's scores in a few words."""
    parts = []
    if record.get("target_bpb") is not None:
        parts.append(f"target {record['target_bpb']:.4f} bits/byte")
    if record.get("suite_score") is not None:
        parts.append(f"suite {record['suite_score']:.4f}")
    return ", ".join(parts)


def result_path(workdir: Path, job: ProxyJob) -> Path:
    return workdir / PROXIES_DIR / f"{job.fingerprint}.json"


def job_spec(job: ProxyJob) -> dict[str, Any]:
    """The job as JSON, for a process that trains it elsewhere (`job_from_spec` reads it)."""
    return {
        "label": job.label,
        "shards": [vars(s) for s in job.shards],
        "weights": job.weights,
        "seed": job.seed,
        "config": job.config,
        "tokenizer": job.tokenizer,
        "targets": job.targets,
    }


def job_from_spec(spec: dict[str, Any]) -> ProxyJob:
    return ProxyJob(**{**spec, "shards": [Shard(**s) for s in spec["shards"]]})


def run_proxies(
    jobs: list[ProxyJob],
    workdir: Path,
    workers: int,
    on_result: Callable[[ProxyJob, dict[str, Any]], None] | None = None,
    slurm: SlurmSpec | None = None,
    scheduler: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Every job's result by fingerprint: recorded ones read back, the others trained, `workers`
    at a time (in this process when 1), as one Slurm job array (`slurm`) or as tasks of the Dask
    cluster at `scheduler`, each recorded as soon as it finishes."""
    unique: dict[str, ProxyJob] = {}
    for job in jobs:
        unique.setdefault(job.fingerprint, job)
    results: dict[str, dict[str, Any]] = {}
    for fingerprint, job in unique.items():
        record = records.read_record(result_path(workdir, job), key=fingerprint)
        if record is not None:
            results[fingerprint] = record
    pending = [job for fp, job in unique.items() if fp not in results]
    log.info(
        f"proxies: {len(results)} of {len(unique)} found done in {workdir / PROXIES_DIR}, {len(pending)} to train"
        + (f" ({workers} at a time)" if pending and workers > 1 else "")
    )

    def finished(job: ProxyJob, record: dict[str, Any]) -> None:
        results[job.fingerprint] = record
        log.info(f"proxy {job.label}: {describe(record)} ({record['seconds']:.0f}s)")
        if on_result is not None:
            on_result(job, record)

    # With workers, every proxy trains in one (one thread each when workers = cores): a rerun
    # that has one proxy left trains it as the first run would have, to the same numbers.
    if slurm is not None and pending:
        for job, record in train_on_slurm(pending, workdir, slurm):
            finished(job, record)
    elif scheduler is not None and pending:
        train_on_dask(pending, workdir, scheduler, finished)
    elif workers <= 1:
        for job in pending:
            finished(job, train_proxy(job, workdir))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        threads = max(1, (os.cpu_count() or 1) // workers)
        context = multiprocessing.get_context("spawn")  # torch in a forked child is unsafe
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_limit_threads, initargs=(threads,)) as pool:
            futures = {pool.submit(train_proxy, job, workdir): job for job in pending}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    return {job.fingerprint: results[job.fingerprint] for job in jobs}


def array_script(jobs_file: Path, count: int, workdir: Path, spec: SlurmSpec) -> str:
    """The sbatch script of a job array of `count` proxies: task i trains the i-th job of
    `jobs_file` on one node and writes its record."""
    # A proxy has no checkpoint to stop at: the time limit's warning signal would only kill it.
    spec = spec.model_copy(update={"stop_seconds": 0})
    lines = header(spec, "tokenmill-proxies", 1, workdir / SLURM_DIR, workdir)
    lines += [
        f"#SBATCH --array=0-{count - 1}",
        f"# {count} proxy models of `tokenmill ablate` or `tokenmill mix`, one per task",
        *prologue(spec),
        f'exec $PYTHON -m tokenmill.pipelines.proxies {quote(jobs_file)} "$SLURM_ARRAY_TASK_ID"',
    ]
    return "\n".join(lines) + "\n"


def train_on_slurm(
    pending: list[ProxyJob], workdir: Path, spec: SlurmSpec
) -> Iterator[tuple[ProxyJob, dict[str, Any]]]:
    """Train `pending` as one Slurm job array and yield each result as its record appears. A
    task that leaves the queue without a record is one line naming its log; the array is
    cancelled when the command stops waiting for it (as the local workers end with it)."""
    log_dir = workdir / SLURM_DIR
    jobs_file = log_dir / ARRAY_JOBS
    log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(jobs_file, json.dumps({"workdir": str(workdir), "jobs": [job_spec(j) for j in pending]}))
    script = write_script(log_dir / ARRAY_SCRIPT, array_script(jobs_file, len(pending), workdir, spec))
    array = submit(script).job_ids[0]
    log.info(f"proxies: Slurm job array {array} of {len(pending)} tasks, logs in {log_dir}")
    waiting = {job.fingerprint: job for job in pending}
    try:
        while waiting:
            queued = _in_queue(array)  # before the records: a task's record precedes its leaving
            for fingerprint, job in list(waiting.items()):
                record = records.read_record(result_path(workdir, job), key=fingerprint)
                if record is not None:
                    del waiting[fingerprint]
                    yield job, record
            if waiting and not queued:
                failed = [i for i, job in enumerate(pending) if job.fingerprint in waiting]
                raise TokenmillError(
                    f"proxies: {len(failed)} of {len(pending)} tasks of Slurm job array {array} ended without a"
                    f" result (tasks {', '.join(map(str, failed))}); see {log_dir}/*.out, then rerun: the others are kept"
                )
            if waiting:
                time.sleep(POLL_SECONDS)
    finally:
        if waiting:
            subprocess.run(["scancel", array], capture_output=True)


def train_on_dask(
    pending: list[ProxyJob],
    workdir: Path,
    scheduler: str,
    finished: Callable[[ProxyJob, dict[str, Any]], None],
) -> None:
    """Train each of `pending` as one task of the Dask cluster at `scheduler`: the task runs
    `train_proxy`, as a local worker does, and writes the proxy's record in `workdir` (a disk the
    workers share), so a run stopped midway keeps every proxy that finished. `finished` takes
    each result as it arrives."""
    from tokenmill.infra.cluster import dask_client, submit_and_collect
    from tokenmill.infra.machine_faults import reported_faults

    done = 0

    def arrived(i: int, record: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        finished(pending[i], record)

    def kept() -> str:
        return f"{done} of {len(pending)} proxies finished and are recorded in {workdir / PROXIES_DIR}"

    # A lost scheduler or a full disk is one line saying what a rerun keeps.
    with reported_faults("the proxies' training", None, kept, lambda: scheduler), dask_client(scheduler) as client:
        log.info(f"proxies: {len(pending)} tasks on the Dask cluster at {scheduler}")
        submit_and_collect(
            client,
            train_proxy,
            ((i, (job, workdir)) for i, job in enumerate(pending)),
            arrived,
            desc="proxies",
            unit="proxy",
            progress=False,  # each proxy logs a line as it finishes
        )


def _in_queue(job_id: str) -> bool:
    """Whether any task of the job is pending, running or completing."""
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True)
    return done.returncode == 0 and bool(done.stdout.strip())


def train_array_task(jobs_file: Path, index: int) -> None:
    """One task of the job array: train the `index`-th proxy of `jobs_file`."""
    listed = json.loads(jobs_file.read_text())
    job = job_from_spec(listed["jobs"][index])
    record = train_proxy(job, Path(listed["workdir"]))
    print(f"proxy {job.label}: {describe(record)} ({record['seconds']:.0f}s)")


def _limit_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def train_proxy(job: ProxyJob, workdir: Path) -> dict[str, Any]:
    """Train one proxy, score it, record the result; the run directory is removed afterwards
    (a proxy killed midway starts over: it is seconds to minutes of work)."""
    from tokenmill.eval.bpb import bits_per_byte, read_documents
    from tokenmill.eval.models import NativeModel
    from tokenmill.eval.suites import load_suite
    from tokenmill.train.config import apply_overrides, config_from_dict
    from tokenmill.train.loop import train

    started = time.time()
    run_dir = workdir / PROXIES_DIR / job.fingerprint
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    blend_file = run_dir / "blend.json"
    blend_file.write_text(
        json.dumps([{"prefix": s.prefix, "weight": w} for s, w in zip(job.shards, job.weights) if w > 0])
    )
    data = apply_overrides(
        job.config,
        {
            "dataset.path": str(blend_file),
            "dataset.tokenizer": job.tokenizer,
            "out": str(run_dir),
            "schedule.seed": job.seed,
        },
    )
    cfg = config_from_dict(data, origin=f"proxy {job.label}")
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer's log lines: the proxy's record says it all
        trained = train(cfg)
    if trained.checkpoint is None:
        raise TokenmillError(f"proxy {job.label}: training ended without a checkpoint in {run_dir}")
    # Windows of the trained length: positions past it were never trained.
    model = NativeModel(trained.checkpoint, max_length=cfg.sequence_length)
    documents = [d for path in job.targets for d in read_documents(path)]
    target = bits_per_byte(model, documents, progress=False)["bits_per_byte"] if documents else None
    # The trainer's eval section scored the suite at the last step: `eval/<suite>`, `eval/<task>/...`.
    scores = trained.eval_scores.get(cfg.schedule.steps, {}) if cfg.eval.suite else {}
    suite = load_suite(cfg.eval.suite).name if cfg.eval.suite else None
    step_every = max(1, len(trained.losses) // CURVE_POINTS)
    record = {
        "key": job.fingerprint,
        "label": job.label,
        "weights": {s.source: w for s, w in zip(job.shards, job.weights)},
        "seed": job.seed,
        "target_bpb": target,
        "suite_score": scores.get(f"eval/{suite}"),
        "suite_tasks": {k[5:-13]: v for k, v in scores.items() if k.endswith("/centered_acc")},
        "source_loss": {s.source: heldout_loss(model, s.prefix, cfg) for s in job.shards},
        "curve": [[step, loss] for step, loss in sorted(trained.losses.items()) if step % step_every == 0],
        "tokens": cfg.schedule.steps * cfg.schedule.global_batch_size * cfg.sequence_length,
        "seconds": time.time() - started,
    }
    records.write_record(result_path(workdir, job), record)
    shutil.rmtree(run_dir, ignore_errors=True)
    return record


def heldout_loss(model: Any, prefix: str, cfg: Any) -> float | None:
    """Mean loss per token on samples of the shard's validation split (the proxies train on its
    train split), or None when that split is empty."""
    import torch

    from tokenmill.tokenize.loader import build_dataset
    from tokenmill.train.engine import cross_entropy

    try:
        dataset = build_dataset(
            prefix,
            seq_len=cfg.sequence_length,
            num_samples=HELDOUT_SAMPLES,
            seed=0,
            split="valid",
            split_ratios=cfg.dataset.split,
        )
    except TokenmillError:
        return None
    rows = [dataset[i] for i in range(min(HELDOUT_SAMPLES, len(dataset)))]
    if not rows:
        return None
    tokens = torch.tensor([list(r) for r in rows], dtype=torch.long)
    with torch.no_grad():
        logits = model.model(tokens[:, :-1])
    return float(cross_entropy(logits, tokens[:, 1:]))


def proxy_slurm_spec(recipe: Recipe, requested: bool, overrides: dict[str, object]) -> SlurmSpec | None:
    """Where the proxies' job array runs (the recipe's `slurm:` section with the command line's
    options), when `--slurm` or `proxies.slurm` asks for one; None: they train here."""
    if not (requested or recipe.proxies.slurm):
        return None
    spec = (recipe.slurm or SlurmSpec()).merged(overrides)
    if spec.nodes not in (None, 1) or spec.chain != 1:
        raise ConfigError("proxies on Slurm: each task of the array trains one proxy on one node; drop nodes and chain")
    return spec


def proxy_scheduler(recipe: Recipe, scheduler: str | None, slurm: SlurmSpec | None) -> str | None:
    """The Dask scheduler the proxies train on: `--scheduler`'s, else the recipe's `scheduler:`
    unless they go to Slurm; None: they train in local processes."""
    if scheduler:
        return scheduler
    return recipe.scheduler if slurm is None else None


def default_workers(recipe: Recipe, workers: int | None) -> int:
    """Proxies trained at once: the flag's, the recipe's, else one per two cores (each proxy's
    matrix products use the two)."""
    return workers or recipe.proxies.workers or max(1, (os.cpu_count() or 1) // 2)


def compute_spent(runs: Iterable[dict[str, Any]], budget: int, started: float) -> dict[str, float]:
    """What a command's proxies cost: how many distinct ones, the tokens they trained, their
    proxy-seconds (those found done at their original cost) and this run's wall time."""
    unique = {r["key"]: r for r in runs}
    return {
        "proxies": len(unique),
        "tokens": budget * len(unique),
        "proxy_seconds": sum(r["seconds"] for r in unique.values()),
        "wall_seconds": time.time() - started,
    }


def check_budget(data: TokenizedData, config: dict[str, Any], what: str) -> int:
    """The proxy budget in tokens, refused when it exceeds the train split's tokens."""
    budget = budget_tokens(config)
    available = sum(s.train_tokens for s in data.shards.values())
    if budget > available:
        raise ConfigError(
            f"{what}: the proxy budget ({budget:,} tokens: steps x global_batch_size x seq_len) is larger than"
            f" its {available:,} training tokens; lower proxies.steps or --steps"
        )
    return budget


if __name__ == "__main__":
    sys.exit(run_reported(lambda: train_array_task(Path(sys.argv[1]), int(sys.argv[2])), "proxy"))
