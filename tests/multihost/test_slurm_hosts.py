"""`tokenmill run --slurm` on a Slurm cluster of two hosts (network namespaces): slurmctld and
a slurmd on node1, a slurmd on node2, each daemon named after its host. The job runs the
recipe's curation on a Dask cluster spread over both nodes (TLS) and its training under one
torchrun per node (dp=2, a rank on each), and gives what the same recipe gives run here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from curate.dask_processes import REPO_ROOT
from hosts import hosts_or_skip
from pipelines.pipeline_outputs import documents
from slurm_conf import RECIPE, TERMINAL, losses, write_slurm_conf

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "nsenter", "unshare")
JOB_TIMEOUT_S = 300


def env_for(conf: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    if conf is not None:
        env["SLURM_CONF"] = str(conf)
    return env


@pytest.fixture(scope="module")
def slurm_hosts(tmp_path_factory):
    """Two hosts running Slurm; yields them and the environment of Slurm's clients."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm on several hosts needs {', '.join(missing)} (apt-get install slurmctld slurmd)")
    hosts = hosts_or_skip(2)
    try:
        directory = tmp_path_factory.mktemp("slurm")
        nodes = {hosts.hostname(i): hosts.address(i) for i in (1, 2)}
        conf = write_slurm_conf(directory, f"{hosts.hostname(1)}({hosts.address(1)})", nodes)
        env = env_for(conf)
        hosts.start_node(1, ["slurmctld", "-D", "-i"], directory / "slurmctld.stderr", env)
        for host in (1, 2):
            hosts.start_node(host, ["slurmd", "-D"], directory / f"slurmd-{host}.stderr", env)
        deadline = time.monotonic() + 60
        while (states := hosts.run(1, ["sinfo", "-h", "-N", "-o", "%T"], 30, env).stdout.split()) != ["idle"] * 2:
            if time.monotonic() > deadline:
                logs = "".join(p.read_text()[-1500:] for p in sorted(directory.glob("*.stderr")))
                pytest.fail(f"the two-node Slurm cluster did not come up (sinfo: {states}):\n{logs}")
            time.sleep(0.5)
        yield hosts, env
    finally:
        hosts.close()


def job_field(hosts, env: dict[str, str], job: str, name: str) -> str:
    out = hosts.run(1, ["scontrol", "-o", "show", "job", job], 30, env).stdout
    return next((field.split("=", 1)[1] for field in out.split() if field.startswith(f"{name}=")), "UNKNOWN")


def test_a_recipe_job_on_two_slurm_nodes_gives_the_outputs_of_a_local_run(slurm_hosts, shared_data, tmp_path):
    hosts, env = slurm_hosts
    # test_slurm's recipe, its training on two nodes with a rank on each
    spec = yaml.safe_load(textwrap.dedent(RECIPE.format(corpus=shared_data / "corpus")))
    spec["name"] = "twonodes"
    spec["train"]["nnodes"] = 2
    spec["train"]["config"]["parallel"]["dp"] = 2
    recipe = tmp_path / "twonodes.yaml"
    recipe.write_text(yaml.safe_dump(spec))
    python = [sys.executable, "-m", "tokenmill.cli", "run", str(recipe)]
    local, work = tmp_path / "local", tmp_path / "work"
    done = subprocess.run(
        [*python, "--workdir", str(local), "--no-progress", "--workers", "2"],
        env=env_for(),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    submitted = hosts.run(1, [*python, "--workdir", str(work), "--slurm", "--cpus-per-node", "2"], 120, env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    line = next(line for line in submitted.stdout.splitlines() if line.startswith("submitted job(s):"))
    (job,) = line.split(":", 1)[1].split("(")[0].split()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (state := job_field(hosts, env, job, "JobState")) not in TERMINAL:
        assert time.monotonic() < deadline, f"job {job} still {state} after {JOB_TIMEOUT_S} s"
        time.sleep(1)
    log = (work / "slurm" / f"tokenmill-twonodes-{job}.out").read_text()
    assert state == "COMPLETED", log[-5000:]
    assert job_field(hosts, env, job, "NodeList") == "node[1-2]"
    assert "train under torchrun, tp=1 pp=1 dp=2" in log and "train: done in" in log, log[-5000:]
    for stage in ("00-ingest", "01-normalize", "02-dedup"):
        assert documents(work / "curate" / "wiki" / stage) == documents(local / "curate" / "wiki" / stage), stage
    for name in ("tokenizer/tokenizer.json", "shards/wiki/wiki.bin", "shards/wiki/wiki.idx"):
        assert (work / name).read_bytes() == (local / name).read_bytes(), name
    assert sorted(losses(work / "train" / "run")) == list(range(1, 13))
    assert losses(work / "train" / "run") == pytest.approx(losses(local / "train" / "run"), rel=1e-5)
