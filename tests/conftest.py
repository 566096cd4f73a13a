"""Shared fixtures: the real data under ../shared/data and Dask clusters for stage tests."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

# A test run started in the background by a non-interactive shell (`make test &` in a script)
# inherits SIGINT ignored, and so would every command a test starts: the Ctrl-C tests would
# then find their commands deaf to it. Commands get the default disposition, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# With several pytest-xdist workers (`make test`) each file runs whole on one worker, so a
# module's fixtures are built once; each doc page is a unit of its own (they share the README's
# workspace, built once per run). The tests that take longest start first (one started last
# would be the run's tail); the doc pages after them, as they wait for the README's workspace.
LONG_FIRST = (
    "test_docs.py::test_readme_blocks_run",
    "test_parallel.py::",
    "test_parallel_checkpoint.py::",
    "test_resume.py::",
    "test_elastic.py::",
    "test_parallel_cli.py::",
    "test_stop.py::",
    "test_slurm.py::",
    "test_docs.py::",
)


def _start_rank(item: pytest.Item) -> int:
    name = f"{item.path.name}::{item.name}"
    return next((rank for rank, prefix in enumerate(LONG_FIRST) if name.startswith(prefix)), len(LONG_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's scheduler
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path, _, name = nodeid.partition("::")
            return nodeid if name.startswith("test_doc_page_blocks_run[") else path

    config.option.loadscopereorder = False  # keep the order above, not largest-file-first
    return ByFile(config, log)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real corpora and benchmark files (`corpus/`, `eval/`); tests that need them skip without."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set TOKENMILL_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def dask_client():
    """A 2-worker LocalCluster shared by the tests of a session."""
    from tokenmill.infra.cluster import dask_client as make_client

    with make_client(workers=2) as client:
        yield client


@pytest.fixture(scope="session", autouse=True)
def commands_use_the_session_cluster(request):
    """Commands run by the tests, in this process or as subprocesses, send their Dask work to the
    session's LocalCluster through Dask's own DASK_SCHEDULER_ADDRESS, as a user's shell on a
    cluster does, instead of each starting a LocalCluster. A command given `--workers N` or
    `--scheduler` still starts or reaches its own, so the tests of LocalCluster start-up, worker
    counts, Ctrl-C and killed workers keep testing them."""
    if os.environ.get("DASK_SCHEDULER_ADDRESS"):
        yield
        return
    client = request.getfixturevalue("dask_client")
    os.environ["DASK_SCHEDULER_ADDRESS"] = client.scheduler.address
    try:
        yield
    finally:
        os.environ.pop("DASK_SCHEDULER_ADDRESS", None)


@pytest.fixture(scope="session")
def dask_client_1():
    """A 1-worker LocalCluster, to compare outputs with the 2-worker one."""
    from tokenmill.infra.cluster import dask_client as make_client

    with make_client(workers=1) as client:
        yield client


@pytest.fixture(scope="session")
def curate_cli(dask_client):
    """Run `tokenmill curate STAGE --input IN --output OUT OPTIONS...` on the session's Dask
    cluster, without progress bars; returns the exit code."""
    from tokenmill.cli import main

    def run(stage: str, input: Path, output: Path, *options: str) -> int:
        address = dask_client.scheduler.address
        argv = ["curate", stage, "--input", str(input), "--output", str(output), *options]
        return main([*argv, "--scheduler", address, "--no-progress"])

    return run


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 48 MiB tmpfs mounted for the test: a real file system that fills up (root only;
    skipped elsewhere). Fill it with `fill_disk`."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill_disk(disk: Path, leave: int) -> Path:
    """Fill ``disk`` until ``leave`` bytes are free; returns the filler file (unlink it to free them)."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    stats = os.statvfs(disk)
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler


@pytest.fixture(name="fill_disk")
def fill_disk_fixture():
    """`fill_disk(disk, leave)`: fill a `small_disk` until `leave` bytes are free."""
    return fill_disk
