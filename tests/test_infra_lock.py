"""The writer's lock (tokenmill.infra.lock): one holder at a time, the loser told the holder's
pid, and no stale lock after the holder is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tokenmill.errors import TokenmillError
from tokenmill.infra.lock import PidLock, pid_alive


def lock(path) -> PidLock:
    return PidLock(path, lambda holder: TokenmillError(f"held by pid {holder}"))


def test_one_holder_at_a_time_and_the_loser_names_it(tmp_path):
    path = tmp_path / "state" / "lock"
    lock(path).check_free()  # no lock file yet: free, and nothing is created
    assert not path.parent.exists()
    with lock(path):  # another open file description conflicts, as another process would
        with pytest.raises(TokenmillError, match=rf"^held by pid {os.getpid()}$"):
            lock(path).acquire()
        with pytest.raises(TokenmillError, match=rf"^held by pid {os.getpid()}$"):
            lock(path).check_free()
    with lock(path):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "lock"
    code = (
        "import sys, time; from tokenmill.errors import TokenmillError; from tokenmill.infra.lock import PidLock;"
        f"PidLock({str(path)!r}, TokenmillError).acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(TokenmillError, match=rf"^held by pid {holder.pid}$"):
            lock(path).acquire()
        assert pid_alive(holder.pid)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not pid_alive(holder.pid)
    with lock(path):  # the kernel released the flock with its holder
        assert path.read_text() == f"{os.getpid()}\n"


def test_pid_alive_reads_what_a_lock_file_may_hold():
    assert pid_alive(os.getpid()) and pid_alive(str(os.getpid()))
    assert not pid_alive(None) and not pid_alive("unknown")


def test_a_released_lock_leaves_no_file_and_a_writer_that_opened_the_old_one_locks_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / ".out.lock"
    with lock(path):
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()  # removed by its holder on release

    # A writer that opened the file just before its holder removed it and let it go: the flock
    # it then gets is on a file no longer at the path, so it starts again on the path's file.
    import tokenmill.infra.lock as lock_module

    real_open, opened = os.open, []

    def open_then_released_by_its_holder(name, *args):
        fd = real_open(name, *args)
        if not opened:
            os.unlink(name)
        opened.append(fd)
        return fd

    path.write_text("1\n")
    monkeypatch.setattr(lock_module.os, "open", open_then_released_by_its_holder)
    held = lock(path).acquire()
    monkeypatch.undo()
    assert len(opened) == 2 and path.read_text() == f"{os.getpid()}\n"
    with pytest.raises(TokenmillError, match=rf"^held by pid {os.getpid()}$"):
        lock(path).acquire()
    held.release()
