"""Slurm: sbatch scripts for `tokenmill run --slurm` and `tokenmill train --slurm`, and their
submission (optionally as a chain of jobs, each resuming the previous one's work).

The scripts are plain bash, kept in the work (or run) directory under ``slurm/`` so a user can
read them, edit them and resubmit them with ``sbatch`` alone.

- A recipe's job starts a Dask cluster inside the allocation (``dask scheduler`` on the first
  node, one ``dask worker`` per node, both under ``srun``; the scheduler file on the shared work
  directory), runs the curation and tokenization steps against it (``--scheduler``), stops it,
  then runs training and evaluation.
- Training runs under ``srun`` (one task per node) with torchrun's c10d rendezvous on the first
  node of the allocation. tokenmill's own launcher (train/launch.py) is single-node by design
  (``--standalone``), while torchrun with a shared rendezvous endpoint is what joins the nodes,
  so the script calls it directly; each worker then runs ``tokenmill train`` as usual.
- Every job resumes: finished recipe steps are skipped by their fingerprints and training
  always passes ``--resume`` (a fresh run directory simply starts). A chain of K jobs is K
  submissions of the same script, each with ``--dependency=afterany`` on the previous one,
  so a job ended by its partition's time limit is continued by the next.
- Training stops at a checkpoint before the job's end: the script asks Slurm for a warning
  (``--signal=B:USR1@SECONDS``, sent to the batch shell) and traps it, and the SIGTERM of the
  time limit or of pre-emption, by creating the run's ``STOP`` file (tokenmill.train.stop),
  which rank 0 reads every step: the ranks on every node finish the step, write a checkpoint
  and exit, and the job exits with ``STOPPED_EXIT`` (99); the next job resumes from there.
"""

from __future__ import annotations

import argparse
import logging
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import storage

if TYPE_CHECKING:  # at run time recipe.py imports this module
    from tokenmill.pipelines.recipe import Recipe
    from tokenmill.train.config import TrainConfig

log = logging.getLogger(__name__)

SLURM_DIR = "slurm"
RUN_SCRIPT = "run.sbatch"
TRAIN_SCRIPT = "train.sbatch"
# The runner starts the trainer with this command prefix instead of `python` when it is set
# (by a recipe's sbatch script): `srun ... torchrun ...`, so training spans the allocation.
TRAIN_LAUNCHER_ENV = "TOKENMILL_TRAIN_LAUNCHER"
# torchrun's rendezvous port on the first node: offset by the job id, so two jobs that share a
# node do not collide.
RDZV_BASE_PORT = 29500


class SlurmSpec(BaseModel):
    """A recipe's `slurm:` section; the CLI options of `--slurm` override each field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    partition: str | None = None
    account: str | None = None
    nodes: int | None = Field(default=None, ge=1)  # default: the recipe's train.nnodes, else 1
    gpus_per_node: int = Field(default=0, ge=0)
    cpus_per_node: int | None = Field(default=None, ge=1)
    time: str | None = Field(default=None, pattern=r"^[0-9:\-]+$")  # sbatch --time: 4:00:00, 2-00:00:00
    job_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    chain: int = Field(default=1, ge=1)  # jobs to submit, each after the previous one (afterany)
    # Seconds before the time limit at which training is asked to checkpoint and stop (0: not asked).
    stop_seconds: int = Field(default=300, ge=0, le=65535)
    sbatch: list[str] = Field(default_factory=list)  # extra `#SBATCH` options: ["--qos=high", ...]
    setup: list[str] = Field(default_factory=list)  # shell lines run first: `module load ...`, `source venv`

    def merged(self, overrides: dict[str, object]) -> SlurmSpec:
        """This spec with the CLI's options (those not None; list options extend)."""
        data = self.model_dump()
        for key, value in overrides.items():
            if value is None:
                continue
            data[key] = data[key] + list(value) if isinstance(data.get(key), list) else value
        try:
            return SlurmSpec(**data)
        except ValidationError as error:
            first = error.errors()[0]
            key = ".".join(str(part) for part in first["loc"])
            raise ConfigError(f"slurm option {key} = {first.get('input')!r}: {first['msg']}") from None


@dataclass
class Submitted:
    script: Path
    job_ids: list[str]


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _header(spec: SlurmSpec, name: str, nodes: int, log_dir: Path, workdir: Path) -> list[str]:
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_name or name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --chdir={workdir}",
        # One log per job, appended to across a requeue.
        f"#SBATCH --output={log_dir}/%x-%j.out",
        "#SBATCH --open-mode=append",
    ]
    if spec.cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={spec.cpus_per_node}")
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    for key in ("partition", "account", "time"):
        value = getattr(spec, key)
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    if spec.stop_seconds:
        # To the batch shell (B:), which passes it on to every node through the STOP file:
        # sent to the steps, it would end torchrun's agents, for whom SIGUSR1 is fatal.
        lines.append(f"#SBATCH --signal=B:USR1@{spec.stop_seconds}")
    for extra in spec.sbatch:
        extra = extra.strip()
        if extra.startswith("#SBATCH"):
            extra = extra[len("#SBATCH") :].strip()
        if not extra.startswith("-") or "\n" in extra:
            raise ConfigError(f"slurm sbatch line {extra!r}: expected an sbatch option such as --qos=high")
        lines.append(f"#SBATCH {extra}")
    return lines


def _prologue(spec: SlurmSpec) -> list[str]:
    return [
        "set -euo pipefail",
        *spec.setup,
        f"PYTHON={_q(sys.executable)}",
        "export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1",
        # The first node of the allocation hosts the Dask scheduler and the c10d rendezvous.
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "CPUS=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}",
        'echo "tokenmill: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) ($SLURM_JOB_NODELIST), head $HEAD"',
    ]


def _stop_on_signal(run_dir: Path) -> list[str]:
    """Trap Slurm's warning (SIGUSR1) and the SIGTERM of the time limit or of pre-emption:
    the ranks, on whatever node, learn of it from the run's STOP file."""
    from tokenmill.train.stop import STOP_FILE

    return [
        "# The time limit is near, or the job is pre-empted: training checkpoints and stops.",
        f"STOP_FILE={_q(run_dir / STOP_FILE)}",
        'rm -f "$STOP_FILE"  # a request left by an earlier job',
        "STOP_REQUESTED=",
        'stop_training() { STOP_REQUESTED=1; echo "tokenmill: job $SLURM_JOB_ID: $1: training stops at a checkpoint";'
        ' mkdir -p "$(dirname "$STOP_FILE")"; touch "$STOP_FILE"; }',
        "trap 'stop_training SIGUSR1' USR1",
        "trap 'stop_training SIGTERM' TERM",
    ]


def _run_stoppable(command: str) -> list[str]:
    """Run ``command`` in the background so the traps above run while it does (bash runs a
    trap only after a foreground command ends); exit with its status, or with STOPPED_EXIT when
    training stopped at a checkpoint on request (rank 0 removes the STOP file once it has)."""
    from tokenmill.train.stop import STOPPED_EXIT

    return [
        f"{command} &",
        "CHILD=$!",
        "STATUS=0",
        'wait "$CHILD" || STATUS=$?',
        "# A trapped signal ends `wait` early: wait again for the command itself.",
        'while kill -0 "$CHILD" 2>/dev/null; do STATUS=0; wait "$CHILD" || STATUS=$?; done',
        'if [ "$STATUS" -ne 0 ] && [ -n "$STOP_REQUESTED" ] && [ ! -e "$STOP_FILE" ]; then',
        f'  echo "tokenmill: job $SLURM_JOB_ID: training stopped at a checkpoint (exit status {STOPPED_EXIT});'
        ' the next job resumes it"',
        f"  exit {STOPPED_EXIT}",
        "fi",
        'exit "$STATUS"',
    ]


def torchrun_prefix(nodes: int, nproc_per_node: int) -> str:
    """`srun ... torchrun ...` up to (not including) `-m tokenmill.cli train ...`: one torchrun
    agent per node, all meeting at the c10d rendezvous on the first node."""
    return (
        f"srun --overlap --nodes={nodes} --ntasks-per-node=1 --cpus-per-task=$CPUS --kill-on-bad-exit=1"
        f" $PYTHON -m torch.distributed.run --nnodes={nodes} --nproc-per-node={nproc_per_node}"
        " --rdzv-backend=c10d --rdzv-endpoint=$HEAD:$((RDZV_BASE_PORT + SLURM_JOB_ID % 1000))"
        " --rdzv-id=$SLURM_JOB_ID"
    )


def _nproc_per_node(world_size: int, nodes: int, spec: SlurmSpec) -> int:
    if world_size % nodes:
        raise ConfigError(
            f"tp x pp x dp = {world_size} processes do not divide over {nodes} nodes; change --nodes or the layout"
        )
    per_node = world_size // nodes
    if spec.gpus_per_node and per_node != spec.gpus_per_node:
        log.warning("%d training processes per node but --gpus-per-node %d", per_node, spec.gpus_per_node)
    return per_node


def run_script(
    recipe_arg: str,
    workdir: Path,
    spec: SlurmSpec,
    *,
    name: str,
    dask_steps: list[str],
    world_size: int | None,
    nodes: int,
    run_args: list[str],
    train_run: Path | None = None,
) -> str:
    """The sbatch script of a recipe: a Dask cluster in the allocation for the steps named in
    ``dask_steps`` (prefixes `--until` accepts), then the rest of the recipe (training under
    srun + torchrun when ``world_size`` is set; ``train_run``: its run directory)."""
    log_dir = workdir / SLURM_DIR
    lines = _header(spec, f"tokenmill-{name}", nodes, log_dir, Path.cwd())
    lines += [
        f"# `tokenmill run` of {recipe_arg} as a Slurm job; resubmit with: sbatch {log_dir / RUN_SCRIPT}",
        *_prologue(spec),
        f"RUN=($PYTHON -m tokenmill.cli run {_q(recipe_arg)} --workdir {_q(workdir)} --no-progress"
        + "".join(f" {_q(a)}" for a in run_args)
        + ")",
    ]
    if dask_steps:
        until = " ".join(f"--until {_q(s)}" for s in dask_steps)
        lines += [
            "",
            "# Curation and tokenization on a Dask cluster inside the allocation.",
            f'SCHEDULER_FILE={_q(log_dir)}/dask-scheduler-"$SLURM_JOB_ID".json',
            'rm -f "$SCHEDULER_FILE"',
            'srun --overlap --nodes=1 --ntasks=1 --nodelist="$HEAD" $PYTHON -m distributed.cli.dask_scheduler'
            ' --scheduler-file "$SCHEDULER_FILE" --port 0 --dashboard-address :0 &',  # free ports: jobs may share a node
            "DASK_SCHEDULER=$!",
            'for _ in $(seq 600); do [ -s "$SCHEDULER_FILE" ] && break; sleep 0.2; done',
            f"srun --overlap --nodes={nodes} --ntasks-per-node=1 --cpus-per-task=$CPUS"
            ' $PYTHON -m distributed.cli.dask_worker --scheduler-file "$SCHEDULER_FILE" --nworkers "$CPUS"'
            " --nthreads 1 --local-directory /tmp --no-dashboard &",
            "DASK_WORKERS=$!",
            "# Stop the Dask cluster whatever happens, so training gets the cores and the job can end.",
            'trap \'kill "$DASK_WORKERS" "$DASK_SCHEDULER" 2>/dev/null || true\' EXIT',
            "ADDRESS=$($PYTHON -c 'import json, sys; print(json.load(open(sys.argv[1]))[\"address\"])'"
            ' "$SCHEDULER_FILE")',
            'echo "tokenmill: Dask scheduler at $ADDRESS"',
            f'echo "+ ${{RUN[*]}} --scheduler $ADDRESS {until}"',
            f'"${{RUN[@]}}" --scheduler "$ADDRESS" {until}',
            'kill "$DASK_WORKERS" "$DASK_SCHEDULER" 2>/dev/null || true',
            "wait || true",
            "trap - EXIT",
        ]
    lines.append("")
    if world_size is not None:
        nproc = _nproc_per_node(world_size, nodes, spec)
        lines += [
            "# Training (and what follows it) with the trainer under srun + torchrun.",
            f"export RDZV_BASE_PORT={RDZV_BASE_PORT}",
            f'export {TRAIN_LAUNCHER_ENV}="{torchrun_prefix(nodes, nproc)}"',
        ]
    lines.append('echo "+ ${RUN[*]}"')
    if train_run is not None:
        lines += [*_stop_on_signal(train_run), *_run_stoppable('"${RUN[@]}"')]
    else:
        lines.append('"${RUN[@]}"')
    return "\n".join(lines) + "\n"


def train_script(train_argv: list[str], out: Path, spec: SlurmSpec, *, name: str, world_size: int, nodes: int) -> str:
    """The sbatch script of `tokenmill train`: every rank under srun + torchrun, resuming from
    the run directory's latest checkpoint when there is one."""
    log_dir = out / SLURM_DIR
    nproc = _nproc_per_node(world_size, nodes, spec)
    argv = " ".join(_q(a) for a in train_argv)
    lines = _header(spec, f"tokenmill-{name}", nodes, log_dir, Path.cwd())
    lines += [
        f"# `tokenmill train` as a Slurm job; resubmit with: sbatch {log_dir / TRAIN_SCRIPT}",
        *_prologue(spec),
        f"RDZV_BASE_PORT={RDZV_BASE_PORT}",
        *_stop_on_signal(out),
        # Every job resumes from the latest checkpoint (a fresh run directory simply starts).
        *_run_stoppable(
            f"{torchrun_prefix(nodes, nproc)} -m tokenmill.cli {argv}"
            + ("" if "--resume" in train_argv else " --resume")
        ),
    ]
    return "\n".join(lines) + "\n"


def find_sbatch() -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise TokenmillError("--slurm needs `sbatch` on PATH (run on a Slurm login node, or use --dry-run)")
    return sbatch


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def submit(script: Path, chain: int = 1) -> Submitted:
    """``sbatch`` the script ``chain`` times, each job after the previous one ends (afterany:
    finished, failed, cancelled or out of time alike), each resuming the previous one's work."""
    sbatch = find_sbatch()
    job_ids: list[str] = []
    for _ in range(chain):
        command = [sbatch, "--parsable"]
        if job_ids:
            command.append(f"--dependency=afterany:{job_ids[-1]}")
        done = subprocess.run([*command, str(script)], capture_output=True, text=True)
        if done.returncode != 0:
            message = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
            raise TokenmillError(f"sbatch {script} failed: {message[-1]}")
        job_id = done.stdout.strip().split(";")[0]
        if not re.fullmatch(r"\d+", job_id):
            raise TokenmillError(f"sbatch {script}: unexpected reply {done.stdout.strip()!r}")
        job_ids.append(job_id)
        log.info("submitted job %s", job_id)
    return Submitted(script, job_ids)


def chain_commands(script: Path, chain: int) -> list[str]:
    """What `submit` runs, for `--dry-run`."""
    commands = [f"sbatch --parsable {script}"]
    commands += [f"sbatch --parsable --dependency=afterany:<job {i}> {script}" for i in range(1, chain)]
    return commands


# --------------------------------------------------------------------------------------------
# Command-line options, shared by `tokenmill run` and `tokenmill train`


def add_slurm_options(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """The Slurm options; ``dry_run``: also `--dry-run` (commands that have none of their own)."""
    group = parser.add_argument_group(
        "Slurm", "with --slurm: write an sbatch script (kept under slurm/ in the work or run directory) and submit it"
    )
    group.add_argument("--slurm", action="store_true", help="submit as a Slurm batch job instead of running here")
    group.add_argument("--partition", help="sbatch --partition")
    group.add_argument("--account", help="sbatch --account")
    group.add_argument("--nodes", type=int, help="nodes to allocate (default: the recipe's train.nnodes, else 1)")
    group.add_argument("--gpus-per-node", type=int, help="sbatch --gpus-per-node")
    group.add_argument("--cpus-per-node", type=int, help="CPUs per node (sbatch --cpus-per-task, one task per node)")
    group.add_argument("--time", help="time limit per job (sbatch --time), e.g. 4:00:00")
    group.add_argument("--job-name", help="sbatch --job-name (default: tokenmill-NAME)")
    group.add_argument(
        "--chain",
        type=int,
        help="submit K jobs, each starting when the previous one ends (--dependency=afterany) and resuming its work",
    )
    group.add_argument(
        "--stop-seconds",
        type=int,
        metavar="SECONDS",
        help="ask training to checkpoint and stop this long before the time limit "
        "(sbatch --signal=B:USR1@SECONDS; default 300, 0: not asked)",
    )
    group.add_argument(
        "--sbatch",
        action="append",
        metavar="OPTION",
        help="an extra sbatch option for the script's #SBATCH lines, e.g. --sbatch=--qos=high; repeatable",
    )
    if dry_run:
        group.add_argument("--dry-run", action="store_true", help="with --slurm: print the script; submit nothing")


def slurm_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "partition": args.partition,
        "account": args.account,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "cpus_per_node": args.cpus_per_node,
        "time": args.time,
        "job_name": args.job_name,
        "chain": args.chain,
        "stop_seconds": args.stop_seconds,
        "sbatch": args.sbatch,
    }


def check_slurm_only_options(args: argparse.Namespace) -> None:
    """Slurm options without --slurm are a mistake, not something to ignore silently."""
    given = [key for key, value in slurm_overrides(args).items() if value is not None]
    if given and not args.slurm:
        raise ConfigError(f"--{given[0].replace('_', '-')} needs --slurm")


def emit(script: Path, text: str, chain: int, dry_run: bool) -> Submitted | None:
    """--dry-run: print the script and the sbatch commands; else write it and submit it."""
    if dry_run:
        print(f"# {script}")
        print(text, end="")
        print("# submitted with:")
        for command in chain_commands(script, chain):
            print(f"#   {command}")
        return None
    find_sbatch()  # before writing anything
    write_script(script, text)
    submitted = submit(script, chain)
    print(f"sbatch script: {script}")
    print(f"submitted job(s): {' '.join(submitted.job_ids)}" + (" (a chain, afterany)" if chain > 1 else ""))
    print(f"logs: {script.parent}/<job-name>-<job id>.out")
    return submitted


# --------------------------------------------------------------------------------------------
# The two commands


def submit_recipe(
    recipe: Recipe,
    recipe_arg: str,
    workdir: Path,
    args: argparse.Namespace,
) -> Submitted | None:
    """`tokenmill run RECIPE --slurm`: the recipe's job script, written to WORKDIR/slurm/ and
    submitted (or printed with --dry-run)."""
    from tokenmill.pipelines.plan import build_plan, select

    if storage.is_url(workdir):
        # The job script and the nodes' steps live in the work directory: it must be shared disk.
        raise ConfigError(f"--workdir {workdir}: a Slurm job needs a work directory on a shared filesystem")
    if args.from_ or args.force:
        # Every job of a chain runs the same script: a forced step would be redone by each.
        raise ConfigError("--from and --force do not go with --slurm: run them here, then submit the rest")
    if args.scheduler:
        raise ConfigError("--scheduler does not go with --slurm: the job starts its own Dask cluster in the allocation")
    spec = (recipe.slurm or SlurmSpec()).merged(slurm_overrides(args))
    steps = build_plan(recipe, workdir)
    runnable = select(steps, None, args.until, None).runnable
    selected = [s for s in steps if s.name in runnable]
    on_dask = [s.name for s in selected if s.kind not in ("train", "eval")]
    if not args.until:
        on_dask = list(dict.fromkeys(name.split(".")[0] for name in on_dask))  # prefixes: a shorter line
    train_steps = [s for s in selected if s.kind == "train"]
    trains = bool(train_steps)
    nodes = spec.nodes or (recipe.train.nnodes if recipe.train else 1)
    run_args = [f"--until={u}" for u in args.until or []]
    if args.workers:
        run_args.append(f"--workers={args.workers}")
    if Path(recipe_arg).is_file():
        recipe_arg = str(Path(recipe_arg).resolve())
    text = run_script(
        recipe_arg,
        workdir,
        spec,
        name=recipe.name,
        dask_steps=on_dask,
        world_size=recipe.train_world_size() if trains and recipe.train else None,
        nodes=nodes,
        run_args=run_args,
        train_run=train_steps[0].output / "run" if train_steps else None,
    )
    return emit(workdir / SLURM_DIR / RUN_SCRIPT, text, spec.chain, args.dry_run)


def submit_training(cfg: TrainConfig, train_argv: list[str], args: argparse.Namespace) -> Submitted | None:
    """`tokenmill train CONFIG --slurm`: the training job script, written to RUN/slurm/ and
    submitted (or printed with --dry-run)."""
    if storage.is_url(cfg.out):
        # The ranks of several nodes write one checkpoint together into the run directory, so it
        # must be a filesystem they share; a URL's copy lives in each node's own cache.
        raise ConfigError(f"out: {cfg.out}: a Slurm training job needs a run directory on a shared filesystem")
    spec = SlurmSpec().merged(slurm_overrides(args))
    out = Path(cfg.out).resolve()
    nodes = spec.nodes or 1
    text = train_script(train_argv, out, spec, name=out.name, world_size=cfg.world_size, nodes=nodes)
    return emit(out / SLURM_DIR / TRAIN_SCRIPT, text, spec.chain, args.dry_run)
