"""The ranks of a multi-process `tokenmill train` on one machine, started and watched by the
launcher itself (cli.run_launcher, launch.launch_ranks).

Each rank is ``python -m tokenmill.train.worker ARGV`` (ARGV: the arguments of `tokenmill
train`), forked from a server that has imported torch and the trainer once (rank_server.py), in
a session of its own, with the variables torchrun gives its workers (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` where rank 0 hosts the store,
``TORCHELASTIC_RESTART_COUNT``, ...; the store and gloo listen on loopback only), so a rank
runs the same whether this supervisor or torchrun started it (a Slurm job's ranks run under torchrun: infra/slurm.py). There is no
rendezvous: the supervisor knows every rank, and reserves a fresh port for each attempt's store.

When a rank fails, the supervisor ends the attempt (SIGKILL to a rank stopped by SIGSTOP,
which could not act on anything else, SIGTERM to the rest, SIGKILL after a grace period) and,
under ``max_restarts``, starts every rank again (each resumes from the run's latest complete
checkpoint: cli.restart_resume). What it says and records:

- every failed rank (rank, pid, the signal that killed it or its exit status, and whether the
  job restarts) in one line when restarts are asked for, and in ``RUN/failures.jsonl``;
- a rank stopped by SIGSTOP, once another rank has ended (watchdog.py ends a rank that waits
  too long for it): named, recorded and killed;
- when the job ends on a failure, the status of its root cause, the first rank that failed on
  its own (not a rank stopped because of it: `root_causes`); a rank killed by a signal
  cannot say why, so the supervisor says it in one line (`RankKilled`, 128 + the signal).

Ranks exiting with ``STOPPED_EXIT`` stopped at a checkpoint on request: not a failure.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmill.errors import TokenmillError
from tokenmill.train.lifecycle import SUPERVISOR_PID_ENV
from tokenmill.train.rank_server import RankProcess, RankServer
from tokenmill.train.stop import STOPPED_EXIT
from tokenmill.train.watchdog import PEER_FAILED_EXIT

log = logging.getLogger(__name__)

FAILURES = "failures.jsonl"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun's name: the ranks read it under either
MASTER_ADDR = "127.0.0.1"  # gloo's connections listen on its interface too (mesh.choose_gloo_interface)
POLL_S = 0.1
# Ranks of this supervisor end at once on SIGTERM (stop.stop_signals); the grace is for a rank
# busy in native code that does not return to the interpreter.
SHUTDOWN_GRACE_S = 30.0
# A rank that outlives SIGKILL this long is stuck in the kernel (uninterruptible sleep, a
# device that does not answer): the job is not restarted beside it.
REAP_TIMEOUT_S = 60.0


class RankKilled(TokenmillError):
    """A rank was killed by a signal and ended the job; the status a shell gives such a process."""

    def __init__(self, rank: int, signal_name: str, status: int) -> None:
        super().__init__(f"training rank {rank} was killed by {signal_name}")
        self.exit_status = status


class PeersLost(TokenmillError):
    """Every failed rank's collective failed because a peer did, and no rank failed on its own
    (the connection between them went away)."""

    exit_status = PEER_FAILED_EXIT

    def __init__(self, rank: int) -> None:
        super().__init__(
            f"training rank {rank}: a collective failed because another rank or the connection to it went away "
            "(rerun with --debug for each rank's error)"
        )


@dataclass(frozen=True)
class RankExit:
    """How one rank ended: ``status`` as `RankProcess.returncode` (-N: killed by signal N)."""

    rank: int
    pid: int
    status: int

    @property
    def signal_name(self) -> str | None:
        if self.status >= 0:
            return None
        try:
            return signal.Signals(-self.status).name
        except ValueError:
            return f"signal {-self.status}"

    def describe(self) -> str:
        return f"was killed by {self.signal_name}" if self.status < 0 else f"exited with status {self.status}"


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


def root_causes(failed: list[RankExit], collateral: set[int] = frozenset()) -> list[RankExit]:
    """The failures that ended an attempt, by rank. Effects are left out: ranks ended by
    SIGTERM (how an attempt is ended), stopped ranks the supervisor killed (``collateral``
    pids), and ranks whose collective failed because a peer did (`PEER_FAILED_EXIT`). Where
    nothing else is left, every failure."""
    effects = (-signal.SIGTERM, PEER_FAILED_EXIT)
    ordered = sorted(failed, key=lambda e: e.rank)
    return [e for e in ordered if e.pid not in collateral and e.status not in effects] or ordered


def reserve_port() -> socket.socket:
    """A socket bound to a free port, for rank 0's store, held until the attempt ends. Rank 0
    binds the port after it has imported torch, seconds later: a port merely found free could
    be taken by then (by any process's connection on a busy machine). Bound with SO_REUSEADDR
    and never listening, this socket keeps the kernel from handing the port to anyone else, and
    lets the store (which sets SO_REUSEADDR too) listen on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((MASTER_ADDR, 0))
    return sock


def rank_env(
    base: dict[str, str], rank: int, world_size: int, port: int, attempt: int, max_restarts: int
) -> dict[str, str]:
    """The environment of one rank on one machine: what torchrun (``--standalone``) sets."""
    return {
        **base,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(port),
        RESTART_COUNT_ENV: str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        # Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT (torchrun's agent may host it instead).
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


class Attempt:
    """Every rank, started once; ``attempt`` counts the restarts before it."""

    def __init__(
        self,
        server: RankServer,
        command: list[str],
        env: dict[str, str],
        world_size: int,
        attempt: int,
        max_restarts: int,
    ) -> None:
        self.attempt = attempt
        self.collateral: set[int] = set()  # pids of stopped ranks this supervisor killed
        self.procs: list[RankProcess] = []
        self.port = reserve_port()
        port = self.port.getsockname()[1]
        try:
            for rank in range(world_size):
                self.procs.append(server.start(command, rank_env(env, rank, world_size, port, attempt, max_restarts)))
        except OSError as error:
            self.kill()
            self.port.close()
            raise TokenmillError(f"could not start training rank {len(self.procs)}: {error}") from None
        except BaseException:  # Ctrl-C while starting them: none of them is left behind
            self.kill()
            self.wait(REAP_TIMEOUT_S)
            self.port.close()
            raise

    def ended(self) -> list[RankExit]:
        return [RankExit(rank, p.pid, p.returncode) for rank, p in enumerate(self.procs) if p.poll() is not None]

    def running(self) -> Iterator[tuple[int, RankProcess]]:
        return ((rank, p) for rank, p in enumerate(self.procs) if p.poll() is None)

    def kill_stopped(self, run_dir: str | None) -> None:
        """Kill the ranks stopped by a signal (SIGSTOP, a debugger): they cannot act on SIGTERM,
        and would hold the job until the grace period ends."""
        for rank, proc in list(self.running()):
            if process_state(proc.pid) in ("T", "t") and proc.pid not in self.collateral:
                log.error("training rank %d (pid %d) is stopped (SIGSTOP or a debugger); killing it", rank, proc.pid)
                record_failure(
                    run_dir,
                    {"attempt": self.attempt, "rank": rank, "pid": proc.pid, "state": "stopped", "action": "kill"},
                )
                self.collateral.add(proc.pid)
                self._signal(proc, signal.SIGKILL)

    def _signal(self, proc: RankProcess, sig: int) -> None:
        # The rank's whole session: what it started (compile workers, ...) ends with it.
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float, run_dir: str | None = None) -> bool:
        """End every rank still running: SIGTERM, SIGKILL after ``grace_s``. Whether all ended."""
        self.kill_stopped(run_dir)
        for _, proc in self.running():
            self._signal(proc, signal.SIGTERM)
        if not self.wait(grace_s):
            self.kill()
        return self.wait(REAP_TIMEOUT_S)

    def kill(self) -> None:
        for _, proc in self.running():
            self._signal(proc, signal.SIGKILL)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every rank to end; whether they all did."""
        deadline = time.monotonic() + timeout_s
        while any(True for _ in self.running()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True


def watch(attempt: Attempt, run_dir: str | None) -> list[RankExit]:
    """Wait until every rank has ended (returns []) or one has failed (returns the ranks that
    have failed by then)."""
    while True:
        ended = attempt.ended()
        failed = [e for e in ended if e.status not in (0, STOPPED_EXIT)]
        if failed or len(ended) == len(attempt.procs):
            return failed
        if ended:  # a rank stopped by SIGSTOP will never reach the end its peers reached
            attempt.kill_stopped(run_dir)
        time.sleep(POLL_S)


def report(
    attempt: Attempt,
    failed: list[RankExit],
    causes: list[RankExit],
    restart: bool,
    max_restarts: int,
    run_dir: str | None,
) -> None:
    """Say (with restarts asked for) and record each failed rank of an attempt."""
    action = (
        f"restarting all ranks (restart {attempt.attempt + 1} of {max_restarts})" if restart else "stopping the job"
    )
    for failure in sorted(failed, key=lambda e: e.rank):
        cause = failure in causes
        if cause and max_restarts:  # without restarts the job's last line says it
            log.warning("training rank %d (pid %d) %s; %s", failure.rank, failure.pid, failure.describe(), action)
        record_failure(
            run_dir,
            {
                "attempt": attempt.attempt,
                "rank": failure.rank,
                "pid": failure.pid,
                "exitcode": failure.status,
                "signal": failure.signal_name,
                "cause": cause,
                "action": "restart" if restart else "stop",
            },
        )


def interrupt(attempt: Attempt, grace_s: float) -> None:
    """Ctrl-C: end every rank (SIGTERM, then SIGKILL after ``grace_s`` or on a second Ctrl-C)."""
    try:
        attempt.stop(grace_s)
    except KeyboardInterrupt:
        attempt.kill()
        attempt.wait(REAP_TIMEOUT_S)


def supervise(
    world_size: int,
    command: list[str],
    *,
    max_restarts: int = 0,
    run_dir: str | None = None,
    env: dict[str, str] | None = None,
    interrupt_grace_s: float = 60.0,
    preload: tuple[str, ...] = (),
) -> int:
    """Run ``world_size`` ranks of ``command`` (``python -m tokenmill.train.worker ARGV``),
    forked from one server that has imported ``preload`` first, to their end, restarting them all when one fails, up to ``max_restarts`` times. Returns the
    job's exit status (0, or `STOPPED_EXIT` when the ranks stopped at a checkpoint on request,
    or a failed rank's own status); raises `RankKilled` when a rank killed by a signal ended
    the job. KeyboardInterrupt (Ctrl-C) ends the ranks, then propagates."""
    env = {**(os.environ if env is None else env), SUPERVISOR_PID_ENV: str(os.getpid())}
    attempts: list[Attempt] = []
    server = RankServer(env, preload)
    try:
        while True:
            attempts.append(Attempt(server, command, env, world_size, len(attempts), max_restarts))
            if len(attempts) > 1:  # held until now: the new attempt's port is another one
                attempts[-2].port.close()
            status = run_attempt(attempts[-1], max_restarts, run_dir, interrupt_grace_s)
            if status is not None:
                return status
    finally:
        for attempt in attempts:
            attempt.port.close()
        server.close()


def run_attempt(attempt: Attempt, max_restarts: int, run_dir: str | None, interrupt_grace_s: float) -> int | None:
    """Watch one attempt to its end: the job's exit status, or None to start the next attempt."""
    try:
        failed = watch(attempt, run_dir)
        if not failed:
            return STOPPED_EXIT if any(e.status == STOPPED_EXIT for e in attempt.ended()) else 0
        ended = attempt.stop(SHUTDOWN_GRACE_S, run_dir)
    except KeyboardInterrupt:
        interrupt(attempt, interrupt_grace_s)
        raise
    finally:  # any other way out of here: leave nothing running
        attempt.kill()
    causes = root_causes(failed, attempt.collateral)
    restart = attempt.attempt < max_restarts and ended
    if not ended:
        log.error("a training rank did not end after SIGKILL (stuck in the kernel?); not restarting")
    report(attempt, failed, causes, restart, max_restarts, run_dir)
    if restart:
        return None
    first = causes[0]
    if first.signal_name is not None:  # it could not say why, so say what happened
        raise RankKilled(first.rank, first.signal_name, 128 - first.status)
    if first.status == PEER_FAILED_EXIT:  # its own line is left to this process (entry.said_by_parent)
        raise PeersLost(first.rank)
    return first.status
