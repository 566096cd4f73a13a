"""Run a test's worker script in N local ranks, as `torchrun --nproc-per-node=N SCRIPT ARGS...`
would, but forked from the trainer's own rank server (tokenmill/train/rank_server.py), started
once per test process with torch and the parallel engine imported.

Importing torch and the parallel engine costs a few CPU seconds per process; on a 2-core
machine an 8-rank launch spent most of its time there. The ranks get the environment torchrun
gives them (RANK, WORLD_SIZE, MASTER_ADDR, ...) and run the script as `__main__` with its
arguments, so the scripts stay runnable under torchrun by hand. What the launcher itself does
(supervisor, restarts, signals, multi-node rendezvous) is tested through `tokenmill train` and
`torch.distributed.run` elsewhere.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from pathlib import Path

from local_ports import free_port

from tokenmill.train.rank_server import RankServer

PRELOAD = (
    "torch",
    "torch.distributed",
    "pytest",
    "tokenmill.train.engine",
    "tokenmill.train.checkpoint",
)
ERROR_FILE_ENV = "TEST_RANK_ERROR_FILE"

# Runs the script as `python SCRIPT ARGS...` would, and leaves its traceback where the test
# reads it (a rank's stderr is the server's, not the test's).
_RUN_SCRIPT = """
import os, runpy, sys, traceback
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except BaseException:
    with open(os.environ["TEST_RANK_ERROR_FILE"], "w") as handle:
        handle.write(traceback.format_exc())
    raise
"""

_server: RankServer | None = None


def _rank_server() -> RankServer:
    """This test process's server; it ends with the process."""
    global _server
    if _server is None:
        _server = RankServer(dict(os.environ, OMP_NUM_THREADS="1"), preload=PRELOAD)
        atexit.register(_server.close)
    return _server


def launch(out: Path, nproc: int, args: list[str], script: str, timeout: float = 400) -> None:
    """Run `script OUT ARGS...` in nproc ranks (a gloo world on 127.0.0.1); fails the test
    with each failed rank's traceback if any rank fails or the launch outlives `timeout`."""
    server = _rank_server()
    port = free_port()
    errors = [Path(out) / f".rank{rank}.error" for rank in range(nproc)]
    procs = []
    for rank in range(nproc):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            **{ERROR_FILE_ENV: str(errors[rank])},
        )
        command = [sys.executable, "-c", _RUN_SCRIPT, str(script), str(out), *map(str, args)]
        procs.append(server.start(command, env))
    deadline = time.monotonic() + timeout  # for the launch as a whole, not per rank
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    hung = [rank for rank, proc in enumerate(procs) if proc.poll() is None]
    for rank in hung:
        os.killpg(procs[rank].pid, signal.SIGKILL)  # each rank leads a session of its own
    while any(proc.poll() is None for proc in procs):
        time.sleep(0.05)
    failed = {rank: proc.returncode for rank, proc in enumerate(procs) if proc.returncode != 0 and rank not in hung}
    if hung or failed:
        reports = [f"rank {rank}:\n{path.read_text()[-4000:]}" for rank, path in enumerate(errors) if path.exists()]
        raise AssertionError(
            f"{Path(script).name} {' '.join(args)}: ranks {hung} still running after {timeout}s, "
            f"exit codes {failed}\n" + "\n".join(reports)
        )
