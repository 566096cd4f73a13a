"""`tokenmill run RECIPE --slurm`: the recipe as one Slurm batch job (tokenmill.infra.slurm
writes and submits it).

The job starts a Dask cluster inside the allocation (``dask scheduler`` on the first node's
address, one ``dask worker`` per node, both under ``srun``, all three with the job's own TLS
certificates; the scheduler file on the shared work directory), runs the curation and tokenization steps against it (``--scheduler``), stops it,
then runs training (under ``srun`` + torchrun, spanning the allocation) and evaluation. Every
job resumes: finished steps are skipped by their fingerprints, so a chain of jobs continues
where the previous one ended.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenmill.errors import ConfigError
from tokenmill.infra import storage
from tokenmill.infra.slurm import (
    RDZV_BASE_PORT,
    RUN_SCRIPT,
    SLURM_DIR,
    TRAIN_LAUNCHER_ENV,
    SlurmSpec,
    Submitted,
    emit,
    header,
    nproc_per_node,
    prologue,
    quote,
    run_stoppable,
    stop_on_signal,
    torchrun_prefix,
)
from tokenmill.infra.slurm_options import slurm_overrides
from tokenmill.infra.tls import CA_FILE, CERT_FILE, KEY_FILE
from tokenmill.pipelines.schema import Recipe
from tokenmill.pipelines.step_graph import build_plan, select
from tokenmill.train.stop import STOP_FILE, STOPPED_EXIT


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
    lines = header(spec, f"tokenmill-{name}", nodes, log_dir, Path.cwd())
    lines += [
        f"# `tokenmill run` of {recipe_arg} as a Slurm job; resubmit with: sbatch {log_dir / RUN_SCRIPT}",
        *prologue(spec),
        f"RUN=($PYTHON -m tokenmill.cli run {quote(recipe_arg)} --workdir {quote(workdir)} --no-progress"
        + "".join(f" {quote(a)}" for a in run_args)
        + ")",
    ]
    if dask_steps:
        until = " ".join(f"--until {quote(s)}" for s in dask_steps)
        lines += [
            "",
            "# Curation and tokenization on a Dask cluster inside the allocation.",
            f'SCHEDULER_FILE={quote(log_dir)}/dask-scheduler-"$SLURM_JOB_ID".json',
            'rm -f "$SCHEDULER_FILE"',
            *dask_tls_lines(log_dir),
            # On the head node's address (the one the allocation names), over TLS; free ports:
            # jobs may share a node. The dashboard is the head node's alone (an ssh tunnel).
            'srun --overlap --nodes=1 --ntasks=1 --nodelist="$HEAD" $PYTHON -m distributed.cli.dask_scheduler'
            ' --scheduler-file "$SCHEDULER_FILE" --host "tls://$HEAD" --port 0'
            f" --dashboard-address 127.0.0.1:0 {TLS_FLAGS} &",
            "DASK_SCHEDULER=$!",
            'for _ in $(seq 600); do [ -s "$SCHEDULER_FILE" ] && break; sleep 0.2; done',
            # Each node's workers on that node's address (SLURMD_NODENAME, set in each task).
            "export PYTHON SCHEDULER_FILE CPUS TLS_DIR",
            f"srun --overlap --nodes={nodes} --ntasks-per-node=1 --cpus-per-task=$CPUS"
            ' bash -c \'exec $PYTHON -m distributed.cli.dask_worker --scheduler-file "$SCHEDULER_FILE"'
            ' --host "tls://$SLURMD_NODENAME" --nworkers "$CPUS" --nthreads 1 --local-directory /tmp'
            f" --dashboard-address 127.0.0.1:0 {TLS_FLAGS}' &",
            "DASK_WORKERS=$!",
            "# Stop the Dask cluster whatever happens, so training gets the cores and the job can end.",
            'trap \'kill "$DASK_WORKERS" "$DASK_SCHEDULER" 2>/dev/null || true\' EXIT',
            "ADDRESS=$($PYTHON -c 'import json, sys; print(json.load(open(sys.argv[1]))[\"address\"])'"
            ' "$SCHEDULER_FILE")',
            'echo "tokenmill: Dask scheduler at $ADDRESS"',
            f'echo "+ ${{RUN[*]}} --scheduler $ADDRESS {until}"',
            f'env "${{DASK_CLIENT_TLS[@]}}" "${{RUN[@]}}" --scheduler "$ADDRESS" {until}',
            'kill "$DASK_WORKERS" "$DASK_SCHEDULER" 2>/dev/null || true',
            "wait || true",
            "trap - EXIT",
        ]
    lines.append("")
    if world_size is not None:
        nproc = nproc_per_node(world_size, nodes, spec)
        lines += [
            "# Training (and what follows it) with the trainer under srun + torchrun.",
            f"export RDZV_BASE_PORT={RDZV_BASE_PORT}",
            f'export {TRAIN_LAUNCHER_ENV}="{torchrun_prefix(nodes, nproc)}"',
        ]
    lines.append('echo "+ ${RUN[*]}"')
    if train_run is not None:
        lines += [*stop_on_signal(train_run / STOP_FILE), *run_stoppable('"${RUN[@]}"', STOPPED_EXIT)]
    else:
        lines.append('"${RUN[@]}"')
    return "\n".join(lines) + "\n"


# The scheduler's and the workers' certificate flags (the files dask_tls_lines makes).
TLS_FLAGS = f'--tls-ca-file "$TLS_DIR/{CA_FILE}" --tls-cert "$TLS_DIR/{CERT_FILE}" --tls-key "$TLS_DIR/{KEY_FILE}"'


def dask_tls_lines(log_dir: Path) -> list[str]:
    """Make the job's certificates (tokenmill.infra.tls) in ``TLS_DIR``; ``DASK_CLIENT_TLS``:
    the Dask configuration variables with which the command's client presents them (with
    encryption required: it refuses a plain connection too). Given to that command alone, so
    that a later step's LocalCluster runs as it does anywhere else."""
    return [
        "# Mutual TLS with certificates made for this job (0600): no other process can submit tasks or join.",
        f'TLS_DIR={quote(log_dir)}/tls-"$SLURM_JOB_ID"',
        '$PYTHON -m tokenmill.infra.tls "$TLS_DIR"',
        "# The command's client: Dask's configuration, for the steps on this cluster only.",
        "DASK_CLIENT_TLS=(DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True"
        f' DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$TLS_DIR/{CA_FILE}"'
        f' DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT="$TLS_DIR/{CERT_FILE}"'
        f' DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY="$TLS_DIR/{KEY_FILE}")',
    ]


def submit_recipe(
    recipe: Recipe,
    recipe_arg: str,
    workdir: Path,
    args: argparse.Namespace,
) -> Submitted | None:
    """`tokenmill run RECIPE --slurm`: the recipe's job script, written to WORKDIR/slurm/ and
    submitted (or printed with --dry-run)."""
    if not storage.Location(workdir).is_local:
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
