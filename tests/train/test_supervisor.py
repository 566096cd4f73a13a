"""The supervisor of a multi-process `tokenmill train` (tokenmill/train/supervisor.py), with
ranks that are small Python processes doing what a training rank may do (fail, get killed,
stop, stop at a checkpoint, ignore SIGTERM): restarts and the environment of each attempt,
the root cause of a failure, stopped ranks, Ctrl-C. The same supervisor running real training
ranks over gloo: tests/train/test_elastic.py, test_launch.py and test_stop.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tokenmill.logs import configure_logging
from tokenmill.train.lifecycle import SUPERVISOR_PID_ENV
from tokenmill.train.supervisor import FAILURES, PeersLost, RankKilled, supervise
from tokenmill.train.watchdog import PEER_FAILED_EXIT

# A rank: records its environment, waits for the other ranks to start, then does what the plan says for its attempt and rank
# ("exit:N", "signal:NAME", "later:SECONDS,N", "interrupt", "ignore-term"; default "exit:0";
# anything but "exit" and "later" then waits to be ended).
RANK = """
import json, os, signal, socket, sys, time
plan, out = json.loads(sys.argv[1]), sys.argv[2]
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
action, _, arg = plan.get(attempt, {}).get(rank, "exit:0").partition(":")
if action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TOKENMILL_SUPERVISOR_PID")
seen = {"pid": os.getpid(), **{name: os.environ[name] for name in names}}
probe = socket.socket()  # the store's port is held for rank 0: no other process may bind it
try:
    probe.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
    seen["port_held"] = False
except OSError:
    seen["port_held"] = True
probe.close()
with open(os.path.join(out, f"{attempt}-{rank}.json.tmp"), "w") as handle:
    json.dump(seen, handle)
os.rename(os.path.join(out, f"{attempt}-{rank}.json.tmp"), os.path.join(out, f"{attempt}-{rank}.json"))
# Every rank of the attempt has started (and recorded) before any acts.
while not all(os.path.exists(os.path.join(out, f"{attempt}-{r}.json")) for r in range(int(os.environ["WORLD_SIZE"]))):
    time.sleep(0.01)
if action == "exit":
    sys.exit(int(arg))
if action == "later":
    seconds, status = arg.split(",")
    time.sleep(float(seconds))
    sys.exit(int(status))
if action == "signal":
    os.kill(os.getpid(), signal.Signals[arg])
if action == "interrupt":  # Ctrl-C to the supervisor
    os.kill(int(os.environ["TOKENMILL_SUPERVISOR_PID"]), signal.SIGINT)
time.sleep(120)
"""


def run(tmp_path: Path, plan: dict, world_size: int = 2, **options) -> int:
    command = [sys.executable, "-c", RANK, json.dumps(plan), str(tmp_path)]
    return supervise(world_size, command, run_dir=str(tmp_path), **options)


def seen(tmp_path: Path) -> dict[tuple[int, int], dict]:
    """What each rank of each attempt recorded, by (attempt, rank)."""
    found = {}
    for path in tmp_path.glob("*-*.json"):
        attempt, rank = path.stem.split("-")
        found[int(attempt), int(rank)] = json.loads(path.read_text())
    return found


def failures(tmp_path: Path) -> list[dict]:
    path = tmp_path / FAILURES
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def gone(pids: list[int]) -> bool:
    """Whether none of these pids is a process any more (they are reaped by the supervisor)."""
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_a_failed_rank_restarts_every_rank_with_a_fresh_store_until_the_job_ends(tmp_path: Path, capsys) -> None:
    configure_logging()
    plan = {"0": {"1": "signal:SIGKILL"}, "1": {"0": "exit:3"}}  # attempt 1: rank 0 fails with a status
    assert run(tmp_path, plan, world_size=3, max_restarts=2) == 0
    ranks = seen(tmp_path)
    assert sorted(ranks) == [(a, r) for a in range(3) for r in range(3)]
    for (attempt, rank), env in ranks.items():
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank),
            "3",
            "3",
        )
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == (str(attempt), "2")
        assert env[SUPERVISOR_PID_ENV] == str(os.getpid()) and env["MASTER_ADDR"] == "127.0.0.1"
    # One store port per attempt, shared by its ranks, and held while they start.
    ports = [{ranks[a, r]["MASTER_PORT"] for r in range(3)} for a in range(3)]
    assert all(len(p) == 1 for p in ports) and len(set.union(*ports)) == 3
    assert all(env["port_held"] for env in ranks.values())
    causes = [
        (f["attempt"], f["rank"], f["exitcode"], f["signal"], f["action"]) for f in failures(tmp_path) if f["cause"]
    ]
    assert causes == [(0, 1, -9, "SIGKILL", "restart"), (1, 0, 3, None, "restart")]
    err = capsys.readouterr().err
    assert (
        f"training rank 1 (pid {ranks[0, 1]['pid']}) was killed by SIGKILL; restarting all ranks (restart 1 of 2)"
        in err
    )
    assert (
        f"training rank 0 (pid {ranks[1, 0]['pid']}) exited with status 3; restarting all ranks (restart 2 of 2)" in err
    )
    assert gone([env["pid"] for env in ranks.values()])


@pytest.mark.parametrize(
    ("plan", "status", "causes"),
    [
        # rank 0 sees its peer go (EX_TEMPFAIL): an effect, not the cause (1 s after the peer, also
        # on a busy machine)
        ({"0": {"0": "later:1,75", "1": "signal:SIGKILL"}}, 137, [(1, "SIGKILL")]),
        ({"0": {"1": "exit:1"}}, 1, [(1, None)]),  # the rank said its own line: its status
        # every rank lost its peers, none failed on its own: each left its line to the supervisor
        ({"0": {"0": "exit:75", "1": "exit:75"}}, 75, [(0, None), (1, None)]),
    ],
    ids=["killed", "error", "peers-lost"],
)
def test_without_restarts_the_job_ends_with_its_root_cause(
    tmp_path: Path, plan: dict, status: int, causes: list[tuple]
) -> None:
    if causes[0][1]:
        with pytest.raises(RankKilled, match=r"^training rank 1 was killed by SIGKILL$") as raised:
            run(tmp_path, plan)
        assert raised.value.exit_status == status
    elif status == PEER_FAILED_EXIT:
        with pytest.raises(PeersLost, match=r"^training rank 0: a collective failed because another rank") as lost:
            run(tmp_path, plan)
        assert lost.value.exit_status == status
    else:
        assert run(tmp_path, plan) == status
    recorded = [(f["rank"], f["signal"], f["action"]) for f in failures(tmp_path) if f["cause"]]
    assert recorded == [(*cause, "stop") for cause in causes]
    assert sorted(seen(tmp_path)) == [(0, 0), (0, 1)]  # not restarted
    assert gone([env["pid"] for env in seen(tmp_path).values()])


def test_a_stopped_rank_is_killed_once_another_has_ended(tmp_path: Path) -> None:
    """Rank 1 stops (SIGSTOP); rank 0 gives up waiting for it (watchdog.HANG_EXIT): the job
    ends with rank 0's status at once, rank 1 named and killed rather than waited for."""
    begun = time.monotonic()
    assert run(tmp_path, {"0": {"0": "later:1,124", "1": "signal:SIGSTOP"}}) == 124
    assert time.monotonic() - begun < 20  # far from the 30 s grace a SIGTERM would get
    events = failures(tmp_path)
    assert [(e["rank"], e["state"], e["action"]) for e in events if "state" in e] == [(1, "stopped", "kill")]
    assert [(e["rank"], e["exitcode"]) for e in events if e.get("cause")] == [(0, 124)]
    assert gone([env["pid"] for env in seen(tmp_path).values()])


def test_ranks_stopped_at_a_checkpoint_end_the_job_with_their_status(tmp_path: Path) -> None:
    """A rank that ends first (0 or STOPPED_EXIT) is no failure: the job waits for the others."""
    assert run(tmp_path, {"0": {"0": "exit:99", "1": "later:0.3,99"}}, max_restarts=1) == 99
    assert failures(tmp_path) == [] and sorted(seen(tmp_path)) == [(0, 0), (0, 1)]


def test_ctrl_c_ends_every_rank_then_propagates(tmp_path: Path) -> None:
    """Rank 1 ignores SIGTERM: it is killed once the grace period is over."""
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, {"0": {"0": "interrupt", "1": "ignore-term"}}, max_restarts=1, interrupt_grace_s=1.0)
    ranks = seen(tmp_path)
    assert sorted(ranks) == [(0, 0), (0, 1)] and gone([env["pid"] for env in ranks.values()])
    assert failures(tmp_path) == []  # an interruption is not a failure


def test_an_interrupted_start_leaves_no_rank(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while the ranks are being started: the ones already started are ended."""
    from tokenmill.train.rank_server import RankServer

    started = []
    real = RankServer.start

    def start(server, *args, **kwargs):
        if started:
            raise KeyboardInterrupt
        started.append(real(server, *args, **kwargs))
        return started[-1]

    monkeypatch.setattr(RankServer, "start", start)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, {"0": {"0": "ignore-term"}})
    assert started[0].poll() == -signal.SIGKILL
    assert gone([started[0].pid])
