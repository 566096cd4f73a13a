"""`tokenmill run --slurm` and `tokenmill train --slurm` on a real single-node Slurm cluster
(slurmctld + slurmd from Debian's slurm-wlm, configured for localhost in a temporary directory):
the recipe's job gives the outputs of a local run; a chain of two training jobs, the first
cancelled after a checkpoint, ends with the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_ports import free_port
from pipeline_outputs import documents
from slurm_conf import RECIPE, TERMINAL, losses, write_slurm_conf

REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "sinfo")
TRAIN_STEPS = 12  # the recipe's train.config.schedule.steps


def _env(slurm_conf: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    return env


def tokenmill(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A running single-node Slurm cluster; yields the environment its clients need."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurmctld slurmd)")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm cluster runs its daemons as root")
    directory = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname()
    ports = f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}"
    conf = write_slurm_conf(directory, f"{host}(127.0.0.1)", {host: "127.0.0.1"}, ports)
    env = _env(conf)
    daemons = []
    try:
        for command in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", host]):
            log = (directory / f"{command[0]}.stderr").open("w")
            daemons.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if state.strip() == "idle":
                break
            if time.time() > deadline or any(d.poll() is not None for d in daemons):
                logs = "".join((directory / f"{d}.stderr").read_text() for d in ("slurmctld", "slurmd"))
                pytest.fail(f"the test Slurm cluster did not come up (sinfo: {state!r}):\n{logs[-3000:]}")
            time.sleep(0.5)
        yield env
    finally:
        # No job and no daemon outlives the tests.
        subprocess.run(["scancel", "--full", f"--user={os.getuid()}"], env=env, capture_output=True)
        deadline = time.time() + 30
        while time.time() < deadline and daemons and daemons[0].poll() is None:
            queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout
            if not queue.strip():
                break
            time.sleep(0.5)
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def job_field(job_id: str, env: dict[str, str], name: str) -> str:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    for field in out.split():
        if field.startswith(f"{name}="):
            return field.split("=", 1)[1]
    return "UNKNOWN"


def job_state(job_id: str, env: dict[str, str]) -> str:
    return job_field(job_id, env, "JobState")


def wait_job(job_id: str, env: dict[str, str], log_dir: Path, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while (state := job_state(job_id, env)) not in TERMINAL:
        assert time.time() < deadline, f"job {job_id} still {state} after {timeout}s:\n{job_logs(log_dir)}"
        time.sleep(0.5)
    return state


def job_logs(log_dir: Path) -> str:
    return "".join(f"== {p.name}\n{p.read_text()[-4000:]}" for p in sorted(log_dir.glob("*.out")))


def submitted_jobs(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("submitted job(s):"))
    return line.split(":", 1)[1].split("(")[0].split()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, shared_data) -> tuple[Path, Path]:
    """The tiny recipe run here, without Slurm: the reference."""
    tmp = tmp_path_factory.mktemp("slurm-recipe")
    recipe = tmp / "tiny.yaml"
    recipe.write_text(textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus")))
    done = tokenmill("run", str(recipe), "--workdir", str(tmp / "local"), "--no-progress", "--workers", "2", env=_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return recipe, tmp / "local"


# --------------------------------------------------------------------------------------------
# Without a cluster: the scripts and the errors


def test_train_script_runs_torchrun_under_srun_with_c10d_on_the_first_node(tmp_path, capsys):
    from tokenmill.cli import main

    code = main(
        ["train", "tiny", "--slurm", "--dry-run", "--out", str(tmp_path / "run"), "--dp", "2", "--nodes", "2",
         "--gpus-per-node", "1", "--partition", "gpu", "--account", "lm", "--time", "4:00:00",
         "--sbatch=--qos=high", "--chain", "3"]
    )  # fmt: skip
    done = capsys.readouterr()
    assert code == 0, done.err
    script = done.out.split("# submitted with:")[0].split("\n", 1)[1]
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=lm",
        "#SBATCH --time=4:00:00",
        "#SBATCH --qos=high",
        f"#SBATCH --output={tmp_path / 'run' / 'slurm'}/%x-%j.out",
    ):
        assert line in script.splitlines(), line
    launch = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--nnodes=2 --nproc-per-node=1" in launch
    assert "--rdzv-backend=c10d --rdzv-endpoint=$HEAD:" in launch
    assert launch.endswith("--dp 2 --resume &")  # in the background: the stop traps run while it does
    assert "#SBATCH --signal=B:USR1@300" in script.splitlines()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # valid bash
    assert done.out.count("--dependency=afterany:") == 2  # a chain of 3
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_slurm_mistakes_are_one_line_errors(tmp_path, capsys, monkeypatch):
    from tokenmill.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no sbatch
    for args, message in (
        (["train", "tiny", "--slurm", "--out", str(tmp_path / "a")], "--slurm needs `sbatch` on PATH"),
        (["train", "tiny", "--nodes", "2"], "--nodes needs --slurm"),
        (["train", "tiny", "--slurm", "--dry-run", "--dp", "2", "--nodes", "3"], "do not divide over 3 nodes"),
        (["train", "tiny", "--slurm", "--dry-run", "--time", "soon"], "slurm option time = 'soon'"),
    ):
        assert main(args) == 1, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("tokenmill: error: ") and message in err, err
    assert not (tmp_path / "a").exists()


def test_recipe_slurm_section_is_checked_and_overridden_by_the_cli(tmp_path, shared_data, capsys):
    from tokenmill.cli import main

    recipe = tmp_path / "tiny.yaml"
    text = textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus"))
    recipe.write_text(text + "slurm: {partition: cpu, nodez: 2}\n")
    assert main(["run", str(recipe), "--slurm", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "slurm.nodez" in err and "did you mean `nodes`" in err, err

    recipe.write_text(text + "slurm: {partition: cpu, time: '1:00:00', sbatch: [--qos=low], setup: [module load x]}\n")
    work = tmp_path / "work"
    assert main(["run", str(recipe), "--workdir", str(work), "--slurm", "--dry-run", "--partition", "gpu"]) == 0
    script = capsys.readouterr().out.split("# submitted with:")[0]
    lines = script.splitlines()
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --partition=cpu" not in lines  # the CLI wins
    assert "#SBATCH --time=1:00:00" in lines and "#SBATCH --qos=low" in lines and "module load x" in lines
    until = next(line for line in lines if line.startswith('env "${DASK_CLIENT_TLS[@]}" "${RUN[@]}" --scheduler'))
    assert until.endswith("--until ingest --until curate --until tokenize")  # all but train on Dask
    assert "--nproc-per-node=1" in script  # the recipe's tp x pp x dp = 1
    assert not work.exists()
    assert main(["run", str(recipe), "--slurm", "--dry-run", "--scheduler", "tcp://h:8786"]) == 1
    assert "--scheduler does not go with --slurm" in capsys.readouterr().err


@pytest.mark.slow
def test_a_training_step_stopped_at_a_checkpoint_ends_the_run_with_status_99_and_a_rerun_resumes_it(
    local_run, tmp_path
):
    """What a recipe's job runs when its time limit is near: the trainer, asked to stop (here
    rank 0 sends itself SIGUSR1 after step 3), checkpoints and exits 99; `tokenmill run` ends
    with the same status in one line, and a rerun resumes the training to the local losses."""
    recipe, local = local_run
    work = tmp_path / "work"
    # The local run's curated shards, without its training and evaluation: only those run here.
    shutil.copytree(local, work, ignore=shutil.ignore_patterns("train", "eval", "train.json", "eval*.json"))
    argv = ["run", str(recipe), "--workdir", str(work), "--no-progress", "--workers", "2"]
    done = tokenmill(*argv, env={**_env(), "TOKENMILL_FAULT": "SIGUSR1@step=3"})
    assert done.returncode == 99, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("tokenmill: error:")]
    assert errors == [
        f"tokenmill: error: training stopped at a checkpoint on request in {work / 'train' / 'run'}; re-run to resume it"
    ]
    assert (work / "train" / "run" / "checkpoints" / "latest").read_text().strip() == "step_4"
    done = tokenmill(*argv, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from the latest checkpoint" in done.stderr
    assert losses(work / "train" / "run") == pytest.approx(losses(local / "train" / "run"), rel=1e-6)


def test_ctrl_c_in_the_training_step_is_one_line_for_the_run(local_run, tmp_path):
    """Ctrl-C reaches `tokenmill run` and its trainer together (one process group): the trainer
    used to say "rerun with --resume" (a flag `run` does not have) before the run's own line."""
    psutil = pytest.importorskip("psutil")
    recipe, local = local_run
    work = tmp_path / "work"
    shutil.copytree(local, work, ignore=shutil.ignore_patterns("train", "eval", "train.json", "eval*.json"))
    argv = [sys.executable, "-m", "tokenmill.cli", "run", str(recipe), "--workdir", str(work), "--no-progress"]
    # The trainer stops itself (SIGSTOP) after step 3: the Ctrl-C lands inside the training step.
    run = subprocess.Popen(
        argv, env={**_env(), "TOKENMILL_FAULT": "SIGSTOP@step=3"}, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    trainer = None
    while trainer is None and run.poll() is None and time.monotonic() < deadline:
        stopped = [p for p in psutil.Process(run.pid).children() if p.status() == psutil.STATUS_STOPPED]
        trainer = stopped[0] if stopped else None
        time.sleep(0.2)
    assert trainer is not None, run.communicate()[1][-3000:]
    os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    trainer.resume()  # the trainer, stopped, takes its SIGINT now
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("tokenmill:")]
    assert said == ["tokenmill: interrupted; rerun to resume"], stderr[-3000:]
    assert "Traceback" not in stderr


# --------------------------------------------------------------------------------------------
# On the cluster


@pytest.mark.slow
def test_recipe_job_gives_the_outputs_of_a_local_run(slurm, local_run, tmp_path):
    recipe, local = local_run
    work = tmp_path / "work"
    done = tokenmill("run", str(recipe), "--workdir", str(work), "--slurm", "--cpus-per-node", "2", env=slurm)
    assert done.returncode == 0, done.stderr
    (job,) = submitted_jobs(done.stdout)
    script = work / "slurm" / "run.sbatch"
    assert script.is_file() and "dask_scheduler" in script.read_text()
    state = wait_job(job, slurm, work / "slurm")
    log = (work / "slurm" / f"tokenmill-slurmtiny-{job}.out").read_text()
    assert state == "COMPLETED", log[-4000:]
    # Curation ran on the Dask cluster of the allocation (its scheduler file on the work
    # directory), then training under srun + torchrun.
    address = json.loads((work / "slurm" / f"dask-scheduler-{job}.json").read_text())["address"]
    assert f"tokenmill.cli run {recipe} --workdir {work} --no-progress --scheduler {address} --until ingest" in log
    assert "[7/7] train: not selected" in log  # not on Dask
    assert "train: done in" in log and "$ train " in log
    for stage in ("00-ingest", "01-normalize", "02-dedup"):
        assert documents(work / "curate" / "wiki" / stage) == documents(local / "curate" / "wiki" / stage), stage
    for name in ("tokenizer/tokenizer.json", "shards/wiki/wiki.bin", "shards/wiki/wiki.idx"):
        assert (work / name).read_bytes() == (local / name).read_bytes(), name
    assert sorted(losses(work / "train" / "run")) == list(range(1, 13))
    assert losses(work / "train" / "run") == pytest.approx(losses(local / "train" / "run"), rel=1e-6)


@pytest.mark.slow
def test_ablate_proxies_as_a_job_array_equal_the_local_ones_and_a_rerun_submits_nothing(
    slurm, local_run, shared_data, tmp_path
):
    recipe, _ = local_run
    target = tmp_path / "target.jsonl"
    held_out = (shared_data / "corpus" / "wikitext2_test.txt").read_text()[:4000]
    target.write_text(json.dumps({"text": held_out}) + "\n")
    proxies = f"proxies: {{config: tiny, steps: 8, batch_size: 4, seq_len: 32, seeds: 2, target: {target}}}\n"
    (tmp_path / "ablate.yaml").write_text(recipe.read_text() + proxies)
    argv = ["ablate", str(tmp_path / "ablate.yaml"), "--variant", "a:", "--variant", "b:", "--no-progress"]
    local = tokenmill(*argv, "--workdir", str(tmp_path / "local"), "--workers", "1", env=_env())
    assert local.returncode == 0, local.stderr[-3000:]
    work = tmp_path / "array"
    done = tokenmill(*argv, "--workdir", str(work), "--slurm", "--cpus-per-node", "1", env=slurm)
    assert done.returncode == 0, done.stderr[-3000:] + job_logs(work / "slurm")
    assert "Slurm job array" in done.stderr and "#SBATCH --array=0-1" in (work / "slurm" / "proxies.sbatch").read_text()
    # Two seeds, one proxy each (the variants are the same data): two tasks, the local numbers.
    assert done.stdout == local.stdout.replace(str(tmp_path / "local"), str(work))
    assert len(list((work / "proxies").glob("*.json"))) == 2
    again = tokenmill(*argv, "--workdir", str(work), "--slurm", env=slurm)
    assert again.returncode == 0 and "proxies: 2 of 2 found done" in again.stderr, again.stderr[-3000:]
    assert "Slurm job array" not in again.stderr


def submit_training_chain(local_run: tuple[Path, Path], tmp_path: Path, env: dict[str, str]) -> tuple[Path, str, str]:
    """A chain of 2 jobs training the local run's config (12 steps, a checkpoint every 2) into
    a new run directory; the first job has just saved its first checkpoint when this returns.
    Returns the run directory and the two job ids."""
    run = tmp_path / "run"
    done = tokenmill(
        "train", str(local_run[1] / "train" / "config.yaml"), "--out", str(run), "--no-progress", "--slurm",
        "--chain", "2", "--cpus-per-node", "1", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = submitted_jobs(done.stdout)
    assert job_state(second, env) == "PENDING"  # waits for the first (afterany)
    deadline = time.time() + 240
    while not (run / "checkpoints" / "step_2").is_dir():
        assert job_state(first, env) in {"PENDING", "RUNNING"}, job_logs(run / "slurm")
        assert time.time() < deadline, job_logs(run / "slurm")
        time.sleep(0.05)
    return run, first, second


def assert_next_job_resumed(job: str, run: Path, resumed_from: int, reference: Path, env: dict[str, str]) -> None:
    """The job completed, training only the steps after `resumed_from`, and the run ends with
    the losses of the uninterrupted `reference` run."""
    assert wait_job(job, env, run / "slurm") == "COMPLETED", job_logs(run / "slurm")
    log = (run / "slurm" / f"tokenmill-run-{job}.out").read_text()
    printed = [int(n) for n in re.findall(r"\bstep (\d+) \|", log)]
    assert printed and min(printed) == resumed_from + 1 and max(printed) == max(losses(reference)), log[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{max(printed)}"
    got, want = losses(run), losses(reference)
    assert sorted(got) == list(range(1, max(want) + 1))
    assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
def test_chained_training_job_resumes_the_cancelled_one(slurm, local_run, tmp_path):
    # Pre-empt the first job as soon as it has saved a checkpoint.
    run, first, second = submit_training_chain(local_run, tmp_path, slurm)
    subprocess.run(["scancel", first], env=slurm, check=True)
    assert wait_job(first, slurm, run / "slurm") == "CANCELLED"
    resumed_from = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert 2 <= resumed_from < TRAIN_STEPS
    # The local run's training is the uninterrupted reference.
    assert_next_job_resumed(second, run, resumed_from, local_run[1] / "train" / "run", slurm)


@pytest.mark.slow
def test_the_time_limit_warning_stops_training_at_a_checkpoint_and_the_next_job_resumes(slurm, local_run, tmp_path):
    run, first, second = submit_training_chain(local_run, tmp_path, slurm)
    # What Slurm sends the batch shell `--stop-seconds` before the time limit (#SBATCH --signal=B:USR1@...).
    subprocess.run(["scancel", "--signal=USR1", "--batch", first], env=slurm, check=True)
    wait_job(first, slurm, run / "slurm")
    log = (run / "slurm" / f"tokenmill-run-{first}.out").read_text()
    # The ranks finished their step, wrote a checkpoint there and exited: the job's status says so.
    assert job_field(first, slurm, "ExitCode") == "99:0", log[-3000:]
    (stopped,) = re.findall(r"stopped after step (\d+) on request", log)
    stopped = int(stopped)
    assert 2 <= stopped < TRAIN_STEPS, log[-3000:]
    assert "training stopped at a checkpoint (exit status 99)" in log
    assert max(int(n) for n in re.findall(r"\bstep (\d+) \|", log)) == stopped  # no step after it
    assert (run / "checkpoints" / f"step_{stopped}" / "meta.json").is_file()
    assert not (run / "STOP").exists()  # the request was acted on: the next job trains
    assert_next_job_resumed(second, run, stopped, local_run[1] / "train" / "run", slurm)


# The probe that stands for `tokenmill run` in the job script below: with --scheduler it runs a
# task through the command's own client, as the script configures it, and records what the job's
# Dask processes listen on; without, it records the Dask configuration it was given.
_PROBE = """
import json, os, sys
import psutil
from tokenmill.infra.cluster import dask_client

args, out = sys.argv[1:], os.environ["PROBE_OUT"]
if "--scheduler" not in args:
    given = sorted(name for name in os.environ if name.startswith("DASK_DISTRIBUTED"))
    open(os.path.join(out, "after.json"), "w").write(json.dumps(given))
    sys.exit(0)
address = args[args.index("--scheduler") + 1]
with dask_client(address) as client:
    client.wait_for_workers(1, timeout=120)
    total = client.submit(sum, [1, 2, 3]).result(timeout=120)
    started = [p for p in psutil.process_iter(["cmdline"]) if os.environ["TLS_MARK"] in " ".join(p.info["cmdline"] or [])]
    tree = {p.pid: p for s in started for p in [s, *s.children(recursive=True)]}
    listening = sorted({c.laddr.ip for p in tree.values() for c in p.net_connections("inet") if c.status == "LISTEN"})
result = {"address": address, "total": total, "processes": len(tree), "listening": listening}
open(os.path.join(out, "dask.json"), "w").write(json.dumps(result))
"""


def test_the_jobs_dask_cluster_listens_on_the_nodes_addresses_over_tls(tmp_path):
    """The Dask part of a recipe's job script, run by bash with `srun` and `scontrol` stood in for
    on one node whose address is 127.0.0.1: the scheduler and the worker listen there only, over
    TLS, and the command's client runs tasks with the job's certificates, which are given to
    that command alone."""
    pytest.importorskip("psutil")
    from tokenmill.infra.slurm import SlurmSpec
    from tokenmill.pipelines.recipe_job import run_script

    work = tmp_path / "work"
    (work / "slurm").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexport SLURMD_NODENAME=127.0.0.1\nexec "$@"\n'
    )
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    (tmp_path / "probe.py").write_text(_PROBE)
    script = run_script(
        "recipe.yaml", work, SlurmSpec(), name="t", dask_steps=["curate"], world_size=None, nodes=1, run_args=[]
    )
    assert '--host "tls://$HEAD"' in script and '--host "tls://$SLURMD_NODENAME"' in script
    run_line = next(line for line in script.splitlines() if line.startswith("RUN=("))
    script = script.replace(run_line, f"RUN=($PYTHON {tmp_path / 'probe.py'})")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_CPUS_PER_TASK": "1",
        "OMP_NUM_THREADS": "1",
        "PROBE_OUT": str(tmp_path),
        "TLS_MARK": str(work / "slurm" / "tls-7"),
    }
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    dask = json.loads((tmp_path / "dask.json").read_text())
    assert dask["address"].startswith("tls://127.0.0.1:") and dask["total"] == 6
    assert dask["processes"] >= 3  # the scheduler, the worker's nanny and its worker process
    assert dask["listening"] == ["127.0.0.1"]
    assert json.loads((tmp_path / "after.json").read_text()) == []  # the rest of the job: no TLS client settings
