"""Faults in one line (tokenmill.infra.machine_faults): a full disk however it arrives (errno, pyarrow's
message without one, a worker's error re-raised in the client), a lost scheduler told apart from
one that still listens, and the CLI's one line for a full disk met anywhere else."""

from __future__ import annotations

import errno
import socket
import time

import pytest
from distributed.client import FutureCancelledError
from distributed.comm.core import CommClosedError

from tokenmill.cli import main
from tokenmill.errors import TEMPFAIL_EXIT, DiskFullError, SchedulerLostError
from tokenmill.infra.machine_faults import as_user_error, is_disk_full

NO_SPACE = OSError(errno.ENOSPC, "No space left on device", "/data/out/part-0.parquet")


def raised_from(cause: BaseException) -> RuntimeError:
    try:
        try:
            raise cause
        except BaseException as error:
            raise RuntimeError("task failed") from error
    except RuntimeError as error:
        return error


@pytest.mark.parametrize(
    "error",
    [
        NO_SPACE,
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),  # pyarrow
        raised_from(NO_SPACE),
    ],
    ids=["errno", "quota", "message", "chained"],
)
def test_a_full_disk_is_recognised_however_it_arrives(error):
    assert is_disk_full(error)


def test_other_errors_are_not_a_full_disk():
    assert not is_disk_full(FileNotFoundError(errno.ENOENT, "No such file or directory", "x"))
    assert not is_disk_full(ValueError("bad value"))


def test_a_full_disk_names_the_output_and_what_is_kept():
    fault = as_user_error(NO_SPACE, "curate filter", "/data/out", lambda: "6 of 9 partitions are kept in P", None)
    assert isinstance(fault, DiskFullError) and fault.exit_status == 1
    assert str(fault) == (
        "curate filter: no space left on the device for /data/out; 6 of 9 partitions are kept in P; free space and rerun"
    )


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once it is closed


def test_a_lost_scheduler_is_told_from_one_that_still_listens():
    kept = lambda: "the signatures phase is kept in W"  # noqa: E731
    cancelled = FutureCancelledError("dedup-1", "scheduler-connection-lost")
    gone = free_address()
    fault = as_user_error(cancelled, "curate dedup candidates", "/data/out", kept, gone)
    assert isinstance(fault, SchedulerLostError) and fault.exit_status == TEMPFAIL_EXIT == 75
    assert str(fault) == (
        f"lost the Dask scheduler at {gone} during curate dedup candidates; the signatures phase is kept in W;"
        " restart the scheduler and workers and rerun to resume"
    )
    assert isinstance(as_user_error(CommClosedError("closed"), "x", None, kept, gone), SchedulerLostError)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        assert as_user_error(CommClosedError("closed"), "x", None, kept, alive) is None
    assert as_user_error(ValueError("bad"), "x", None, kept, gone) is None


def test_the_cli_says_a_full_disk_anywhere_in_one_line(monkeypatch, capsys):
    import tokenmill.curate.cli as curate_cli

    def inspect_on_a_full_disk(args):
        raise raised_from(NO_SPACE)

    monkeypatch.setattr(curate_cli, "_inspect_command", inspect_on_a_full_disk)
    assert main(["inspect", "stage"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "tokenmill: error: tokenmill inspect: no space left on the device for /data/out/part-0.parquet;"
        " free space and rerun"
    ]


def log_a_missed_heartbeat() -> None:
    """What a worker logs when a heartbeat to a busy scheduler fails (distributed.worker)."""
    import logging

    try:
        raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker local=tcp://127.0.0.1:1>")
    except CommClosedError:
        logging.getLogger("distributed.worker").exception("Failed to communicate with scheduler during heartbeat.")


@pytest.mark.slow
def test_the_local_cluster_workers_log_no_traceback_the_command_does_not_report(capfd):
    from distributed import Client

    from tokenmill.infra.cluster import dask_client, external_scheduler

    with dask_client(workers=1) as client:
        capfd.readouterr()
        client.run(log_a_missed_heartbeat)
        time.sleep(0.5)  # the worker's stderr is its own
        err = capfd.readouterr().err
        # A LocalCluster's scheduler ends with the command: once it is closed, a failure is
        # never taken for a lost scheduler. One given by its address can be lost.
        assert external_scheduler(client) is None
        with Client(client.scheduler.address) as by_address:
            assert external_scheduler(by_address) == client.scheduler.address
    assert "heartbeat" not in err and "Traceback" not in err, err
