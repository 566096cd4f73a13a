"""Slurm: the parts of an sbatch script every tokenmill job shares, the `--slurm` options, and
submission (optionally as a chain of jobs, each resuming the previous one's work).

The jobs themselves are built where their commands live: a recipe's by
tokenmill.pipelines.recipe_job (`tokenmill run --slurm`), training's by
tokenmill.train.train_job (`tokenmill train --slurm`). The scripts are plain bash, kept in the
work (or run) directory under ``slurm/`` so a user can read them, edit them and resubmit them
with ``sbatch`` alone.

- A chain of K jobs is K submissions of the same script, each with ``--dependency=afterany``
  on the previous one, so a job ended by its partition's time limit is continued by the next.
- Training stops at a checkpoint before the job's end: the script asks Slurm for a warning
  (``--signal=B:USR1@SECONDS``, sent to the batch shell) and traps it, and the SIGTERM of the
  time limit or of pre-emption, by creating the run's STOP file (`stop_on_signal`), which rank 0
  reads every step: the ranks on every node finish the step, write a checkpoint and exit, and
  the job exits with the trainer's stopped status (`run_stoppable`); the next job resumes.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenmill.errors import ConfigError, TokenmillError

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


def quote(value: str | Path) -> str:
    return shlex.quote(str(value))


def header(spec: SlurmSpec, name: str, nodes: int, log_dir: Path, workdir: Path) -> list[str]:
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


def prologue(spec: SlurmSpec) -> list[str]:
    return [
        "set -euo pipefail",
        *spec.setup,
        f"PYTHON={quote(sys.executable)}",
        "export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1",
        # The first node of the allocation hosts the Dask scheduler and the c10d rendezvous.
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "CPUS=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}",
        'echo "tokenmill: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) ($SLURM_JOB_NODELIST), head $HEAD"',
    ]


def stop_on_signal(stop_file: Path) -> list[str]:
    """Trap Slurm's warning (SIGUSR1) and the SIGTERM of the time limit or of pre-emption:
    the ranks, on whatever node, learn of it from the run's STOP file (``stop_file``)."""
    return [
        "# The time limit is near, or the job is pre-empted: training checkpoints and stops.",
        f"STOP_FILE={quote(stop_file)}",
        'rm -f "$STOP_FILE"  # a request left by an earlier job',
        "STOP_REQUESTED=",
        'stop_training() { STOP_REQUESTED=1; echo "tokenmill: job $SLURM_JOB_ID: $1: training stops at a checkpoint";'
        ' mkdir -p "$(dirname "$STOP_FILE")"; touch "$STOP_FILE"; }',
        "trap 'stop_training SIGUSR1' USR1",
        "trap 'stop_training SIGTERM' TERM",
    ]


def run_stoppable(command: str, stopped_exit: int) -> list[str]:
    """Run ``command`` in the background so the traps of `stop_on_signal` run while it does
    (bash runs a trap only after a foreground command ends); exit with its status, or with
    ``stopped_exit`` when training stopped at a checkpoint on request (rank 0 removes the STOP
    file once it has)."""
    return [
        f"{command} &",
        "CHILD=$!",
        "STATUS=0",
        'wait "$CHILD" || STATUS=$?',
        "# A trapped signal ends `wait` early: wait again for the command itself.",
        'while kill -0 "$CHILD" 2>/dev/null; do STATUS=0; wait "$CHILD" || STATUS=$?; done',
        'if [ "$STATUS" -ne 0 ] && [ -n "$STOP_REQUESTED" ] && [ ! -e "$STOP_FILE" ]; then',
        f'  echo "tokenmill: job $SLURM_JOB_ID: training stopped at a checkpoint (exit status {stopped_exit});'
        ' the next job resumes it"',
        f"  exit {stopped_exit}",
        "fi",
        'exit "$STATUS"',
    ]


def torchrun_prefix(nodes: int, nproc_per_node: int) -> str:
    """`srun ... torchrun ...` up to (not including) `-m tokenmill.train.worker CONFIG ...`: one
    torchrun agent per node, all meeting at the c10d rendezvous on the first node."""
    return (
        f"srun --overlap --nodes={nodes} --ntasks-per-node=1 --cpus-per-task=$CPUS --kill-on-bad-exit=1"
        f" $PYTHON -m torch.distributed.run --nnodes={nodes} --nproc-per-node={nproc_per_node}"
        " --rdzv-backend=c10d --rdzv-endpoint=$HEAD:$((RDZV_BASE_PORT + SLURM_JOB_ID % 1000))"
        " --rdzv-id=$SLURM_JOB_ID"
    )


def nproc_per_node(world_size: int, nodes: int, spec: SlurmSpec) -> int:
    if world_size % nodes:
        raise ConfigError(
            f"tp x pp x dp = {world_size} processes do not divide over {nodes} nodes; change --nodes or the layout"
        )
    per_node = world_size // nodes
    if spec.gpus_per_node and per_node != spec.gpus_per_node:
        log.warning("%d training processes per node but --gpus-per-node %d", per_node, spec.gpus_per_node)
    return per_node


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
