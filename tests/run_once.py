"""Build a test fixture once per test run, also when pytest-xdist workers share it."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_between_workers(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(directory)` run once for the whole test run, also when pytest-xdist workers share
    it: the first worker to get here builds `name` under the run's temporary root while the
    others wait on a lock, then all use it. A failed build fails each test that needs it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        directory = tmp_path_factory.mktemp(name)
        build(directory)
        return directory
    root = tmp_path_factory.getbasetemp().parent  # shared by the workers of this run
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            try:
                build(directory)
            except BaseException as error:
                done.write_text(f"failed: {error}")
                raise
            done.write_text("ok")
    if done.read_text() != "ok":
        pytest.fail(f"{name}: built by another worker, and that build {done.read_text()}")
    return directory
