"""A Dask cluster over three hosts (network namespaces): the scheduler and the commands on host
1, a worker on each of hosts 2 and 3, every process started as a user starts it on its own
machine. `tokenmill curate dedup` and `tokenmill curate chain` there equal the LocalCluster's
runs, and a worker's host cut off from the network in the middle of both does not change their
outputs (its tasks run again on the other worker) nor hang them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from curate.dask_processes import DASK, REPO_ROOT, assert_same_stage, tokenmill
from hosts import Hosts, hosts_or_skip, listening_addresses, wait_listening

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCHEDULER_PORT = 8786
STAGE_TIMEOUT_S = 120
LOCAL_HTTP = ["--dashboard-address", "127.0.0.1:0"]  # without it Dask serves HTTP on 0.0.0.0


def dask_env() -> dict[str, str]:
    """Each host's processes import tokenmill from this checkout; none is told the session's
    LocalCluster."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    # A host that stops answering is given up after 10 s of silence, not Dask's 5 minutes.
    env["DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL"] = "10s"
    return env


def start_cluster(hosts: Hosts, directory: Path) -> str:
    """`dask scheduler` on host 1, `dask worker` on hosts 2 and 3, each on its host's address
    and its HTTP server (health, dashboard) on the host's loopback, as a Slurm job starts them."""
    directory.mkdir(parents=True, exist_ok=True)
    env = dask_env()
    scheduler = hosts.address(1)
    hosts.start(
        1,
        [str(DASK), "scheduler", "--host", scheduler, "--port", str(SCHEDULER_PORT), *LOCAL_HTTP],
        directory / "scheduler.log",
        env,
    )
    wait_listening(hosts, 2, 1, SCHEDULER_PORT)
    address = f"tcp://{scheduler}:{SCHEDULER_PORT}"
    for host in (2, 3):
        name = f"worker-{host}"
        hosts.start(
            host,
            [str(DASK), "worker", address, "--host", hosts.address(host), "--name", name]
            + ["--nthreads", "1", "--no-nanny", *LOCAL_HTTP, "--memory-limit", "0"]
            + ["--local-directory", str(directory / name)],
            directory / f"{name}.log",
            env,
        )
    wait_code = f"from distributed import Client\nwith Client({address!r}, timeout='30s') as c: c.wait_for_workers(2, timeout=90)\n"
    result = hosts.run(1, [sys.executable, "-c", wait_code], timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    for host in (1, 2, 3):  # the scheduler and each worker: on its own host's address, and loopback
        assert listening_addresses(hosts, host) == {hosts.address(host), "127.0.0.1"}
    return address


def tokenmill_on(hosts: Hosts, host: int, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        hosts.exec_argv(host, [sys.executable, "-m", "tokenmill", *argv, "--no-progress"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dask_env(),
    )


@pytest.fixture(scope="module")
def raw_plays(shared_data, tmp_path_factory) -> Path:
    """Shakespeare's speeches in four JSONL files, with a few near-duplicates planted."""
    raw = tmp_path_factory.mktemp("raw")
    speeches = [s.strip() for s in (shared_data / "corpus" / "tinyshakespeare.txt").read_text().split("\n\n")]
    speeches = [s for s in speeches if len(s) > 100]
    speeches += [s.replace(" the ", " a ", 1) for s in speeches[::40] if " the " in s]
    per_file = -(-len(speeches) // 4)
    for part in range(4):
        texts = speeches[part * per_file : (part + 1) * per_file]
        (raw / f"plays-{part}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return raw


@pytest.fixture(scope="module")
def plays(raw_plays, tmp_path_factory) -> Path:
    """The speeches ingested: four partitions."""
    ingested = tmp_path_factory.mktemp("ingested") / "plays"
    tokenmill("curate", "ingest", "--input", str(raw_plays), "--output", str(ingested), "--source", "plays")
    return ingested


def fuzzy_dedup_argv(source: Path, output: Path) -> list[str]:
    return ["curate", "dedup", "--input", str(source), "--output", str(output), "--method", "fuzzy"]


@pytest.fixture(scope="module")
def local_dedup(plays, tmp_path_factory) -> Path:
    """The stage on the session's LocalCluster."""
    local = tmp_path_factory.mktemp("local") / "dedup"
    tokenmill(*fuzzy_dedup_argv(plays, local))
    return local


# Ingest and per-document stages in one pass, as the common-crawl recipe's fused steps run.
CHAIN_STAGES = ["ingest", "normalize", "pii", "filter"]
CHAIN_TASK_KEY = "-+-".join(CHAIN_STAGES)  # the pass's Dask keys (infra.cluster.submit_and_collect)


def chain_argv(raw: Path, output: Path) -> list[str]:
    """Every stage's kept documents written, to compare them all."""
    argv = ["curate", "chain", "--stages", ",".join(CHAIN_STAGES), "--option", "ingest.source=plays"]
    return [*argv, "--input", str(raw), "--output", str(output), "--keep-intermediate"]


@pytest.fixture(scope="module")
def local_chain(raw_plays, tmp_path_factory) -> Path:
    """The chain on the session's LocalCluster."""
    local = tmp_path_factory.mktemp("local") / "chain"
    tokenmill(*chain_argv(raw_plays, local))
    return local


def assert_same_chain(actual: Path, expected: Path) -> list[dict]:
    """Every stage directory of the two chains holds the same documents and counts; their
    manifests."""
    names = sorted(path.name for path in expected.iterdir())
    assert sorted(path.name for path in actual.iterdir()) == names
    assert len(names) == len(CHAIN_STAGES)
    return [assert_same_stage(actual / name, expected / name) for name in names]


@pytest.fixture(scope="module")
def cluster_on_hosts(tmp_path_factory):
    """The three hosts and their cluster, shared by this module's tests: the last one cuts host
    3 off."""
    hosts = hosts_or_skip(3)
    try:
        yield hosts, start_cluster(hosts, tmp_path_factory.mktemp("dask"))
    finally:
        hosts.close()


def test_fuzzy_dedup_across_three_hosts_equals_the_local_cluster(cluster_on_hosts, plays, local_dedup, tmp_path):
    three_hosts, address = cluster_on_hosts
    local = local_dedup
    remote = tmp_path / "hosts"
    command = tokenmill_on(three_hosts, 1, [*fuzzy_dedup_argv(plays, remote), "--scheduler", address])
    _, stderr = command.communicate(timeout=STAGE_TIMEOUT_S)
    assert command.returncode == 0, stderr
    manifest = assert_same_stage(remote, local)
    assert manifest["counts"]["kept"] > 1000 and manifest["counts"]["rejected"].get("near_duplicate", 0) > 0


def test_a_chain_across_three_hosts_equals_the_local_cluster(cluster_on_hosts, raw_plays, local_chain, tmp_path):
    three_hosts, address = cluster_on_hosts
    remote = tmp_path / "hosts"
    command = tokenmill_on(three_hosts, 1, [*chain_argv(raw_plays, remote), "--scheduler", address])
    _, stderr = command.communicate(timeout=STAGE_TIMEOUT_S)
    assert command.returncode == 0, stderr
    manifests = assert_same_chain(remote, local_chain)
    counts = [manifest["counts"] for manifest in manifests]
    assert [stage["in"] for stage in counts[1:]] == [stage["kept"] for stage in counts[:-1]]
    assert 0 < counts[-1]["kept"] < counts[-1]["in"]  # the filter rejected some


def executing_on_worker(
    hosts: Hosts, address: str, worker: str, timeout: float, key: str = "", unfinished: int = 1
) -> bool:
    """Wait (on host 1) until the worker at ``worker`` runs a task whose key starts with ``key``
    while at least ``unfinished`` such tasks run in the cluster (so that, the one task ending
    first, the others still keep their command running); whether it did in time."""
    code = (
        "import sys,time\nfrom distributed import Client\n"
        f"with Client({address!r}, timeout='30s') as c:\n"
        f"    end=time.time()+{timeout}\n"
        "    while time.time()<end:\n"
        f"        busy={{w: [k for k in keys if k.startswith({key!r})] for w,keys in c.processing().items()}}\n"
        f"        on_worker=any(w.startswith({worker!r}) and keys for w,keys in busy.items())\n"
        f"        if on_worker and sum(map(len, busy.values()))>={unfinished}: sys.exit(0)\n"
        "        time.sleep(0.02)\n"
        "sys.exit(1)\n"
    )
    return hosts.run(1, [sys.executable, "-c", code], timeout=timeout + 40, env=dask_env()).returncode == 0


def test_a_worker_host_cut_off_mid_dedup_and_mid_chain_leaves_their_outputs_undisturbed_or_one_line(
    cluster_on_hosts, plays, local_dedup, raw_plays, local_chain, tmp_path
):
    """Both commands at once, so one cut (and one wait for the scheduler to give the host up)
    serves both: host 3 is cut off while its worker holds a task of the chain, the dedup still
    running, and another task of the chain unfinished."""
    three_hosts, address = cluster_on_hosts
    runs = {
        "dedup": (fuzzy_dedup_argv(plays, tmp_path / "dedup"), tmp_path / "dedup", local_dedup, assert_same_stage),
        "chain": (chain_argv(raw_plays, tmp_path / "chain"), tmp_path / "chain", local_chain, assert_same_chain),
    }
    commands = {
        name: tokenmill_on(three_hosts, 1, [*argv, "--scheduler", address]) for name, (argv, *_) in runs.items()
    }
    started = time.monotonic()
    worker = f"tcp://{three_hosts.address(3)}:"
    assert executing_on_worker(three_hosts, address, worker, timeout=60, key=CHAIN_TASK_KEY, unfinished=2)
    three_hosts.cut(3)
    ended = {name: command.poll() for name, command in commands.items() if command.poll() is not None}
    assert not ended, f"ended before host 3 was cut off: {ended}"
    # The commands (clients, on host 1) and the cluster listen on no other address than before.
    for host in (1, 2, 3):
        assert listening_addresses(three_hosts, host) == {three_hosts.address(host), "127.0.0.1"}, host
    for name, command in commands.items():
        try:
            _, stderr = command.communicate(timeout=STAGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            command.kill()
            pytest.fail(f"{name} hung for {STAGE_TIMEOUT_S} s after a worker's host was cut off")
        print(f"{name} ended {time.monotonic() - started:.1f} s after it started, status {command.returncode}")
        _, output, expected, assert_same = runs[name]
        if command.returncode == 0:
            assert_same(output, expected)
        else:
            lines = stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("tokenmill: error: "), stderr
            assert "Traceback" not in stderr
