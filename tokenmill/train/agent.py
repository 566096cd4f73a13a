"""The torchrun agent `tokenmill train` starts:
``python -m tokenmill.train.agent NPROC [--max-restarts N] [--run-dir RUN] -- ARGV...``, ARGV
being the arguments of `tokenmill train` (see docs/processes.md).

It is torchrun (`torch.distributed.run`, standalone rendezvous, one process per rank running
``python -m tokenmill.train.worker ARGV``), whose elastic agent restarts every rank when one
fails, up to ``--max-restarts`` times (each worker then resumes from the run's latest complete
checkpoint: tokenmill.train.cli). What it adds for a user at a terminal:

- it ends with its launcher (`die_with_parent`), and tells its workers its pid so they end
  with it too;
- every failed rank is said in one line (rank, pid, the signal that killed it or its exit
  status, and whether the job restarts) and recorded in ``RUN/failures.jsonl``;
- a rank stopped by a signal (SIGSTOP) cannot act on the SIGTERM that ends a job: once
  another rank has ended (tokenmill.train.watchdog ends a rank that waits too long for it),
  it is named and killed, so the job ends at once instead of after torchrun's grace period;
- a failed or stopped worker ends it with the worker's exit status and no traceback of its
  own (the worker has already said what went wrong, as one line);
- torchrun's own log lines (rendezvous, "closing signal SIGTERM", ...) are not printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tokenmill.logs import configure_logging
from tokenmill.train.lifecycle import AGENT_PID_ENV, LAUNCHER_PID_ENV, die_with_parent, env_pid
from tokenmill.train.stop import STOPPED_EXIT
from tokenmill.train.watchdog import PEER_FAILED_EXIT

log = logging.getLogger("tokenmill.train.agent")  # also when run as __main__
FAILURES = "failures.jsonl"


def process_state(pid: int) -> str | None:
    """The one-letter state of a Linux process (R, S, D, T, Z, ...), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def record_failure(run_dir: str | Path | None, event: dict[str, Any]) -> None:
    """Append one event to ``RUN/failures.jsonl`` (nothing without a run directory)."""
    if not run_dir:
        return
    path = Path(run_dir) / FAILURES
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **event}) + "\n")


def root_causes(failures: dict[int, Any], collateral: set[int] = frozenset()) -> list[tuple[int, Any]]:
    """The failures that ended an attempt, by rank. Effects are left out: the ranks torchrun
    SIGTERMs as soon as one fails, stopped ones this agent killed (``collateral`` pids), and
    ranks whose collective failed because a peer did (`PEER_FAILED_EXIT`)."""
    effects = (-signal.SIGTERM, PEER_FAILED_EXIT)
    causes = [
        (rank, f) for rank, f in sorted(failures.items()) if f.pid not in collateral and f.exitcode not in effects
    ]
    return causes or sorted(failures.items())


def describe(failure: Any) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with status {failure.exitcode}"


def _elastic_agent_class(run_dir: str | None) -> type:
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class Agent(LocalElasticAgent):
        """torchrun's agent, unchanged in what it decides; it says and records each failure."""

        _attempt = 0
        collateral: set[int] = set()
        stopped = False  # the ranks stopped at a checkpoint on request

        def _rank_pids(self) -> dict[int, int]:
            """The pids of the current attempt's ranks, by local rank (a worker's ``id`` is its
            pid under this agent; None before it starts)."""
            return {w.local_rank: w.id for w in self.get_worker_group().workers if isinstance(w.id, int)}

        def _kill_stopped(self, unless_all_alive: bool) -> None:
            """Kill the workers stopped by a signal (SIGSTOP): they cannot act on the SIGTERM
            that ends an attempt, and torchrun would wait its whole shutdown timeout for them.
            With ``unless_all_alive``, only once another worker has ended."""
            states = {local: (pid, process_state(pid)) for local, pid in self._rank_pids().items()}
            stopped = {local: pid for local, (pid, state) in states.items() if state in ("T", "t")}
            if not stopped or (unless_all_alive and not any(st in ("Z", "X", None) for _, st in states.values())):
                return
            ranks = {w.local_rank: w.global_rank for w in self.get_worker_group().workers}
            for local, pid in stopped.items():
                rank = ranks.get(local, local)
                log.error("training rank %d (pid %d) is stopped (SIGSTOP or a debugger); killing it", rank, pid)
                record_failure(
                    run_dir,
                    {"attempt": self._attempt, "rank": rank, "pid": pid, "state": "stopped", "action": "kill"},
                )
                self.collateral.add(pid)
                os.kill(pid, signal.SIGKILL)

        def _monitor_workers(self, worker_group):  # noqa: ANN001, ANN202 - torch's signature
            self._kill_stopped(unless_all_alive=True)
            result = super()._monitor_workers(worker_group)
            if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
                return result
            if all(f.exitcode == STOPPED_EXIT for f in result.failures.values()):
                # Ranks stopping at a checkpoint on request (stop.py): not a failure to restart
                # from. The job ends once every rank has written its part and exited.
                if any(process_state(pid) not in ("Z", "X", None) for pid in self._rank_pids().values()):
                    return RunResult(state=WorkerState.HEALTHY)
                Agent.stopped = True
                ranks = {worker.global_rank: None for worker in worker_group.workers}
                return RunResult(state=WorkerState.SUCCEEDED, return_values=ranks)
            # torch's count, not one of ours: torch may also take the restarts away (a rank stuck
            # in uninterruptible sleep), and has no public accessor for it.
            restart = self._remaining_restarts > 0
            total = worker_group.spec.max_restarts
            done = total - self._remaining_restarts + 1
            action = f"restarting all ranks (restart {done} of {total})" if restart else "stopping the job"
            causes = {rank for rank, _ in root_causes(result.failures, self.collateral)}
            for rank, failure in sorted(result.failures.items()):
                if rank in causes and total:  # without restarts the exit line says it (main)
                    log.warning("training rank %d (pid %d) %s; %s", rank, failure.pid, describe(failure), action)
                record_failure(
                    run_dir,
                    {
                        "attempt": self._attempt,
                        "rank": rank,
                        "pid": failure.pid,
                        "exitcode": failure.exitcode,
                        "signal": failure.signal_name() if failure.exitcode < 0 else None,
                        "cause": rank in causes,
                        "action": "restart" if restart else "stop",
                    },
                )
            if restart:
                self._attempt += 1
            return result

        def _shutdown(self, *args: Any, **kwargs: Any) -> None:
            # Passed through as given: torch 2.13 added a ``timeout`` argument that 2.11 lacks.
            self._kill_stopped(unless_all_alive=False)
            super()._shutdown(*args, **kwargs)

    return Agent


def silence_torch_logging() -> None:
    """Mute the handlers torch installs on its loggers ("torch", "torch.distributed", ...)."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger):
            for handler in logger.handlers:
                handler.setLevel(logging.CRITICAL + 1)


def parse_agent_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The agent's own options, and the worker's argv after ``--``."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m tokenmill.train.agent")
    parser.add_argument("nproc", type=int)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--run-dir")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def main(argv: list[str] | None = None) -> int:
    args, worker_argv = parse_agent_args(list(sys.argv[1:] if argv is None else argv))
    launcher = env_pid(LAUNCHER_PID_ENV)
    die_with_parent(expected_parent=launcher)
    os.environ[AGENT_PID_ENV] = str(os.getpid())  # inherited by the workers

    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    configure_logging(os.environ.get("TOKENMILL_DEBUG") == "1")
    silence_torch_logging()  # torchrun's messages; the workers and this agent print theirs
    # torchrun builds its agent from this name: ours decides nothing differently (restarts,
    # rendezvous, shutdown are torchrun's), it only reports and records each failure.
    agent_class = _elastic_agent_class(args.run_dir)
    launcher_api.LocalElasticAgent = agent_class
    # Restarted workers must not meet the previous attempt's addresses in a store shared with
    # the rendezvous (pytorch issue 135712: gloo then connects to dead ranks); each attempt's
    # rank 0 hosts a fresh store instead.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    torchrun_args = parse_args(
        [
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            f"--max-restarts={args.max_restarts}",
            "-m",
            "tokenmill.train.worker",
            *worker_argv,
        ]
    )
    try:
        run(torchrun_args)
    except ChildFailedError as error:
        rank, failure = root_causes(error.failures, agent_class.collateral)[0]
        if failure.exitcode < 0:  # killed by a signal: it could not say why, so say what happened
            name = failure.signal_name()
            print(f"tokenmill: error: training rank {rank} was killed by {name}", file=sys.stderr)
            return 128 - failure.exitcode
        return failure.exitcode or 1
    except SignalException as error:
        return 128 + int(error.sigval)
    return STOPPED_EXIT if agent_class.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
