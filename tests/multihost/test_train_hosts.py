"""`tokenmill train` on two nodes (network namespaces), each a torchrun agent with one rank,
meeting at the c10d rendezvous on node 1 and training over gloo across the bridge: the same
losses as one process, every socket on its own host's address, and a rank killed on node 2
restarting both nodes from the latest checkpoint (torchrun's --max-restarts 1) to the same
losses again. One run proves both: the steps before the kill and the steps after it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from curate.dask_processes import REPO_ROOT, tokenmill
from hosts import listening_sockets
from train.shard_files import text_documents, write_shard

from tokenmill.train.launch import FRESH_STORE_ENV

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

RENDEZVOUS_PORT = 29500
STEPS = 60
CHECKPOINT_INTERVAL = 20
RUN_TIMEOUT_S = 180
MAX_RESTARTS = 1


@pytest.fixture(scope="module")
def shard(shared_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shard")
    return write_shard(root / "shakespeare", text_documents(shared_data / "corpus" / "tinyshakespeare.txt"))


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """The bundled tiny config, logging every step and checkpointing every 20."""
    recipe = yaml.safe_load((REPO_ROOT / "tokenmill" / "recipes" / "train-tiny.yaml").read_text())
    recipe["logging"].update(interval=1, eval_interval=1000)
    recipe["checkpoint"].update(interval=CHECKPOINT_INTERVAL, keep_last=3)
    path = tmp_path_factory.mktemp("config") / "tiny-every-step.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def single_losses(config, shard, tmp_path_factory) -> dict[int, float]:
    """The losses of the same run in one process."""
    out = tmp_path_factory.mktemp("single") / "run"
    tokenmill("train", str(config), "--data", str(shard), "--out", str(out), "--steps", str(STEPS))
    return losses(out)


def losses(run: Path) -> dict[int, float]:
    """Step -> loss of ``run``'s metrics.jsonl (a step logged again after a restart: the last)."""
    from tokenmill.train.metrics import read_metrics

    return {row["step"]: row["loss"] for row in read_metrics(run) if "loss" in row}


def start_nodes(hosts, config: Path, shard: Path, out: Path) -> list[subprocess.Popen]:
    """One torchrun agent per host, as a user starts one on each machine (and as a Slurm job
    does), with restarts as docs/parallel.md says to start them: node 1 hosts the rendezvous;
    each agent gives its own address as the one its ranks are reached at; the ranks get
    --resume (torchrun restarts the healthy node's ranks as if afresh), and torchrun the
    variable that gives each attempt a store of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", FRESH_STORE_ENV: "1"}
    nodes = []
    for host in (1, 2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.address(1)}:{RENDEZVOUS_PORT}"]
        argv += ["--rdzv-id", "run", "--rdzv-conf", f"is_host={int(host == 1)}", "--local-addr", hosts.address(host)]
        argv += ["--max-restarts", str(MAX_RESTARTS)]
        argv += ["-m", "tokenmill.train.worker", str(config), "--data", str(shard), "--out", str(out)]
        argv += ["--steps", str(STEPS), "--dp", "2", "--no-progress", "--max-restarts", str(MAX_RESTARTS), "--resume"]
        nodes.append(hosts.start(host, argv, out.parent / f"node{host}.log", env))
    return nodes


def wait_all(hosts, nodes: list[subprocess.Popen], out: Path) -> str:
    """Wait for both nodes to end; their logs."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while any(node.poll() is None for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    logs = "\n".join((out.parent / f"node{host}.log").read_text() for host in (1, 2))
    assert all(node.poll() is not None for node in nodes), (
        f"the nodes did not end in {RUN_TIMEOUT_S} s:\n{logs[-6000:]}"
    )
    assert [node.returncode for node in nodes] == [0, 0], logs[-6000:]
    return logs


def rank_pids(hosts, host: int) -> list[int]:
    """The training ranks running on ``host``."""
    pids = subprocess.run(["ip", "netns", "pids", hosts.names[host - 1]], capture_output=True, text=True).stdout
    ranks = []
    for pid in pids.split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tokenmill.train.worker" in command and b"torch.distributed.run" not in command:
            ranks.append(int(pid))
    return ranks


def wait_until(reached: Callable[[], bool], what: str, out: Path, nodes: list[subprocess.Popen]) -> None:
    """Wait until ``reached()``, failing if a node ends first or after ``RUN_TIMEOUT_S``."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not reached():
        if any(node.poll() is not None for node in nodes):
            logs = "\n".join((out.parent / f"node{host}.log").read_text()[-3000:] for host in (1, 2))
            pytest.fail(f"a node ended before {what}:\n{logs}")
        assert time.monotonic() < deadline, f"no {what} in {RUN_TIMEOUT_S} s"
        time.sleep(0.05)


def logged_through(out: Path, step: int) -> bool:
    return (out / "metrics.jsonl").exists() and max(losses(out), default=0) >= step


def test_two_nodes_train_the_single_process_losses_and_restart_together_from_the_latest_checkpoint(
    two_hosts, config, shard, single_losses, tmp_path
):
    from tokenmill.train.checkpoint_files import list_checkpoints

    out = tmp_path / "run"
    nodes = start_nodes(two_hosts, config, shard, out)

    def checkpointed() -> bool:
        return bool(list_checkpoints(out)) and logged_through(out, CHECKPOINT_INTERVAL)

    wait_until(checkpointed, "complete checkpoint", out, nodes)
    before_the_kill = losses(out)
    # Every process of each node listens on the node's own address (gloo's connections, rank 0's
    # store, the agents), not 127.0.0.1 nor every interface; but torchrun's rendezvous store,
    # which torch binds to every interface.
    node1, node2 = (listening_sockets(two_hosts, host) for host in (1, 2))
    assert {(address, port) for address, port in node1 if address != two_hosts.address(1)} == {("*", RENDEZVOUS_PORT)}
    assert {address for address, _ in node2} == {two_hosts.address(2)}
    (victim,) = rank_pids(two_hosts, 2)
    os.kill(victim, signal.SIGKILL)
    logs = wait_all(two_hosts, nodes, out)
    resumed = [int(step) for step in re.findall(r"resuming from step (\d+)", logs)]
    assert resumed and min(resumed) >= CHECKPOINT_INTERVAL, logs[-6000:]
    after = losses(out)  # a step logged again after the restart: its new loss
    assert sorted(after) == list(range(1, STEPS + 1))
    for run in (before_the_kill, after):
        for step, loss in run.items():
            assert loss == pytest.approx(single_losses[step], rel=1e-5), step
