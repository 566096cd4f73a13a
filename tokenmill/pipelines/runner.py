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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill import __version__
from tokenmill.errors import DiskFullError, TokenmillError
from tokenmill.infra import machine_faults, records, storage
from tokenmill.infra.atomic import atomic_write_text, remove_leftovers
from tokenmill.infra.document_dirs import kept_written
from tokenmill.infra.outputs import check_output
from tokenmill.pipelines.context import Context
from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.step_graph import (
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
from tokenmill.pipelines.steps import RUNNERS, curate_in_one_pass, summarise
from tokenmill.pipelines.workdir import WORKDIR_OUTPUT, RemoteWorkdir, WorkdirLock, default_workdir, resolve_workdir

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


def _remove_leftovers(step: Step) -> None:
    """Temporary siblings (`.NAME.tmp-*`) a killed run left beside this step's output, so they do
    not pile up over resumes; a curate stage's `.NAME.partial-KEY/` stays for the stage to
    resume from (it removes those of other keys itself)."""
    if step.output.parent.is_dir():
        remove_leftovers(step.output)


@contextmanager
def _disk_full_is_an_error(what: str, workdir: Path) -> Iterator[None]:
    """A full disk (here or in a Dask worker) as one line: every output is published atomically,
    so what earlier steps finished is intact and a re-run after freeing space resumes; a stage
    that met it says which of its partitions are kept (`tokenmill.infra.machine_faults`)."""
    intact = "finished steps and previous outputs are intact"
    hint = f"free space under {workdir} and run again to resume"
    try:
        yield
    except DiskFullError as error:
        raise DiskFullError(what, error.target, "; ".join(filter(None, (error.kept, intact))), hint) from error
    except OSError as error:
        if not machine_faults.is_disk_full(error):
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
    ran_in_a_pass: dict[str, StepResult] = {}  # steps that ran in one pass with an earlier one
    try:
        for index, step in enumerate(steps, start=1):
            tag = f"[{index}/{len(steps)}] {step.name}"
            if step.name in ran_in_a_pass:
                result.steps.append(ran_in_a_pass.pop(step.name))
                log.info(f"{tag}: ran in the pass of {step.chain[0]}: {result.steps[-1].summary}")
                continue
            first, *others = _run_step(ctx, step, tag, selection)
            result.steps.append(first)
            ran_in_a_pass.update((other.name, other) for other in others)
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
    location = check_output(resolve_workdir(workdir), WORKDIR_OUTPUT, flag="--workdir")
    if location.is_local:
        return location.local_path, None
    remote = RemoteWorkdir(location.path)
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
        # The recipe as run, its sources' URLs without credentials (a presigned URL's signature).
        atomic_write_text(workdir / "recipe.json", storage.redact(recipe.model_dump_json(indent=2)) + "\n")
    if remote is not None:
        remote.push_files([workdir / "recipe.json"])
    return lock


def _run_step(ctx: Context, step: Step, tag: str, selection: Selection) -> list[StepResult]:
    """Run `step` if it is selected and out of date (or forced), with the steps after it that
    share its pass and must run too; say why not otherwise."""
    if not _must_run(ctx, step, selection):
        fresh = is_fresh(ctx.workdir, step)
        if step.name not in selection.runnable:
            note = _not_selected(ctx, step, selection, fresh)
            log.info(f"{tag}: {note}")
            return [StepResult(step.name, "skipped" if fresh else "not-selected", summary=note)]
        state = read_state(ctx.workdir, step) or {}
        log.info(f"{tag}: up to date, skipped ({state.get('summary', '')})")
        return [StepResult(step.name, "skipped", summary=state.get("summary", ""))]
    log.info(f"{tag}: {step.description}")
    results = _execute_chain(ctx, step, selection) if step.chain else [_execute(ctx, step)]
    log.info(f"{tag}: done in {results[0].seconds:.1f}s: {results[0].summary}")
    return results


def _must_run(ctx: Context, step: Step, selection: Selection) -> bool:
    return step.name in selection.runnable and (step.name in selection.forced or not is_fresh(ctx.workdir, step))


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
    _forget(ctx, step)
    t0 = time.time()
    with _disk_full_is_an_error(step.name, ctx.workdir):
        outcome = RUNNERS[step.kind](ctx, step)
    return _record(ctx, step, outcome, time.time() - t0)


def _execute_chain(ctx: Context, step: Step, selection: Selection) -> list[StepResult]:
    """Run `step` and the steps after it in its chain that must run too, in one pass. The chain's
    steps before it are up to date; the pass starts from the last of them that kept its documents
    (or the chain's input) and runs the others again in memory."""
    chain = [ctx.steps[name] for name in step.chain]
    start = chain.index(step)
    running = [step]
    for later in chain[start + 1 :]:
        if not _must_run(ctx, later, selection):
            break
        running.append(later)
    replay_from = next((i + 1 for i in range(start - 1, -1, -1) if kept_written(chain[i].output)), 0)
    for member in running:
        _forget(ctx, member)
    t0 = time.time()
    with _disk_full_is_an_error(" + ".join(member.name for member in running), ctx.workdir):
        manifests = curate_in_one_pass(ctx, running, chain[replay_from:start])
    seconds = time.time() - t0
    # The pass's time goes to its first step; the others say they ran in it.
    return [
        _record(ctx, member, manifest, seconds if member is step else 0.0)
        for member, manifest in zip(running, manifests)
    ]


def _forget(ctx: Context, step: Step) -> None:
    """A step about to run stops counting as finished; a killed run's temporaries go."""
    state_path(ctx.workdir, step).unlink(missing_ok=True)
    if ctx.remote is not None:
        ctx.remote.forget(step)
    _remove_leftovers(step)


def _record(ctx: Context, step: Step, outcome: dict[str, Any], seconds: float) -> StepResult:
    """Record a finished step's fingerprint (and, for a remote work directory, publish its
    output and then its state)."""
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
    with _disk_full_is_an_error(step.name, ctx.workdir):
        records.write_record(state_path(ctx.workdir, step), state, indent=2)
    if ctx.remote is not None:
        ctx.remote.push_step(step)
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
    local, remote = _open_workdir(workdir)
    if remote is not None:
        remote.release()
        workdir = local
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
        if len(step.chain) > 1:
            lines.append(f"       one pass: {' -> '.join(step.chain)}")
        for item in step.inputs:
            lines.append(f"       in:  {item}")
        lines.append(f"       out: {step.output}")
    if recipe.train is not None:
        from tokenmill.pipelines.dry_run_training import describe_layout

        lines += ["", *describe_layout(recipe)]
    return "\n".join(lines)
