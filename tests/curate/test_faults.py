"""Faults of the machines said in one line: a Dask scheduler SIGKILLed in the middle of a stage
(exit 75, the finished partitions or phases kept, the rerun on a restarted cluster resumes and
publishes what an undisturbed run publishes), an unreachable scheduler (nothing left beside
the output) and a full disk under a stage (a real tmpfs; exit 1, the finished partitions kept,
the rerun after freeing space resumes byte for byte)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from dask_processes import assert_same_stage, cluster, tokenmill, write_partitions, write_web_like_corpus

from tokenmill.cli import main
from tokenmill.curate.registry import phases_text
from tokenmill.errors import TEMPFAIL_EXIT

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

N_PARTITIONS = 6


def kill_scheduler_when(processes, ready, timeout: float = 300) -> threading.Thread:
    """SIGKILL the scheduler, from a thread, as soon as `ready()` holds."""

    def watch() -> None:
        deadline = time.time() + timeout
        while not ready() and time.time() < deadline:
            time.sleep(0.02)
        os.kill(processes.scheduler.pid, signal.SIGKILL)
        processes.scheduler.wait()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def rerun_on_a_restarted_cluster(tmp_path, argv: list[str], capfd) -> str:
    """The same command on a new scheduler and worker, as the error line says; its messages."""
    restarted = cluster(tmp_path / "dask-again", workers=1)
    try:
        capfd.readouterr()
        tokenmill(*argv, "--scheduler", restarted.address)
        return capfd.readouterr().err
    finally:
        restarted.close()


def test_a_lost_scheduler_is_one_line_and_the_rerun_resumes(tmp_path, shared_data, capfd):
    source = write_partitions(shared_data, tmp_path / "in", n=N_PARTITIONS, docs=500)
    output, expected = tmp_path / "out", tmp_path / "expected"
    argv = ["curate", "filter", "--input", str(source), "--output", str(output)]

    def some_finished() -> bool:
        return bool(list(tmp_path.glob(".out.partial-*/.tasks/task-*.json")))

    processes = cluster(tmp_path / "dask", workers=1)
    try:
        tokenmill(
            "curate", "filter", "--input", str(source), "--output", str(expected), "--scheduler", processes.address
        )
        watcher = kill_scheduler_when(processes, some_finished)
        capfd.readouterr()
        code = main([*argv, "--scheduler", processes.address, "--no-progress"])
        err = capfd.readouterr().err
        watcher.join(timeout=60)
    finally:
        processes.close()
    (partial,) = tmp_path.glob(".out.partial-*")
    finished = len(list((partial / ".tasks").glob("task-*.json")))
    assert code == TEMPFAIL_EXIT, err
    assert 0 < finished < N_PARTITIONS
    (line,) = err.strip().splitlines()
    said = re.fullmatch(
        re.escape(f"tokenmill: error: lost the Dask scheduler at {processes.address} during curate filter; ")
        + rf"(\d+) of {N_PARTITIONS} partitions are kept in "
        + re.escape(f"{partial}; restart the scheduler and workers and rerun to resume"),
        line,
    )
    # The worker may finish the partition it was running after the command has stopped.
    assert said and 0 < int(said.group(1)) <= finished, line
    assert not output.exists()

    assert f"resumed {finished} of {N_PARTITIONS} partitions" in rerun_on_a_restarted_cluster(tmp_path, argv, capfd)
    manifest = assert_same_stage(output, expected)
    assert manifest["resumed_partitions"] == finished
    assert not list(tmp_path.glob(".out.partial-*"))


def test_a_scheduler_lost_during_dedup_names_the_phase_and_the_rerun_resumes_it(tmp_path, shared_data, capfd):
    raw = write_web_like_corpus(shared_data, tmp_path / "raw")
    docs, expected = tmp_path / "docs", tmp_path / "expected"
    output, work = tmp_path / "out", tmp_path / ".out.work"
    argv = ["curate", "dedup", "--input", str(docs), "--output", str(output)]

    processes = cluster(tmp_path / "dask", workers=1)
    try:
        tokenmill("curate", "ingest", "--input", str(raw), "--output", str(docs), "--scheduler", processes.address)
        tokenmill("curate", "dedup", "--input", str(docs), "--output", str(expected), "--scheduler", processes.address)
        # After the signatures phase: the candidates shuffle is under way.
        watcher = kill_scheduler_when(processes, lambda: (work / "signatures.done").exists())
        capfd.readouterr()
        code = main([*argv, "--scheduler", processes.address, "--no-progress"])
        err = capfd.readouterr().err
        watcher.join(timeout=60)
    finally:
        processes.close()
    assert code == TEMPFAIL_EXIT, err
    phases = [p for p in ("signatures", "candidates", "components", "decisions") if (work / f"{p}.done").exists()]
    assert phases[0] == "signatures" and len(phases) < 4, phases
    running = ("candidates", "components", "decisions")[len(phases) - 1]
    (line,) = err.strip().splitlines()
    assert line == (
        f"tokenmill: error: lost the Dask scheduler at {processes.address} during curate dedup {running};"
        f" {phases_text(phases)} {'is' if len(phases) == 1 else 'are'} kept in {work};"
        " restart the scheduler and workers and rerun to resume"
    )
    assert not output.exists()

    assert f"resumed {phases_text(phases)} from an earlier run" in rerun_on_a_restarted_cluster(tmp_path, argv, capfd)
    manifest = assert_same_stage(output, expected)
    assert manifest["resumed_phases"] == phases
    assert not work.exists()


def test_an_unreachable_scheduler_leaves_nothing_beside_the_output(tmp_path, shared_data, capfd, monkeypatch):
    monkeypatch.setattr("tokenmill.infra.cluster.SCHEDULER_CONNECT_TIMEOUT", "1s")  # nothing listens there
    source = write_partitions(shared_data, tmp_path / "in", n=1, docs=10)
    address = "tcp://127.0.0.1:9"  # discard: nothing listens
    output = tmp_path / "out"
    code = main(["curate", "dedup", "--input", str(source), "--output", str(output), "--scheduler", address])
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"tokenmill: error: cannot reach the Dask scheduler at {address}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def part_bytes(stage_dir: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(stage_dir)): path.read_bytes()
        for sub in ("kept", "rejected")
        for path in sorted((stage_dir / sub).glob("*.parquet"))
    }


def test_a_full_disk_is_one_line_naming_what_is_kept_and_the_rerun_resumes_byte_for_byte(
    tmp_path, shared_data, small_disk, fill_disk, curate_cli, capfd
):
    source = write_partitions(shared_data, tmp_path / "in", n=N_PARTITIONS, docs=1500)
    expected = tmp_path / "expected"
    assert curate_cli("filter", source, expected) == 0
    written = part_bytes(expected)
    per_partition = sum(len(data) for data in written.values()) // N_PARTITIONS

    output = small_disk / "out"
    filler = fill_disk(small_disk, leave=int(2.5 * per_partition))  # room for two or three partitions
    capfd.readouterr()
    # A LocalCluster of this command: its worker's log (a failed task) would reach this stderr.
    code = main(
        ["curate", "filter", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    )
    err = capfd.readouterr().err
    assert code == 1, err
    (partial,) = small_disk.glob(".out.partial-*")
    finished = len(list((partial / ".tasks").glob("task-*.json")))
    assert 0 < finished < N_PARTITIONS
    assert err.strip().splitlines() == [
        f"tokenmill: error: curate filter: no space left on the device for {output};"
        f" {finished} of {N_PARTITIONS} partitions are kept in {partial}; free space and rerun"
    ]
    assert not output.exists()

    filler.unlink()
    capfd.readouterr()
    assert curate_cli("filter", source, output) == 0
    assert f"resumed {finished} of {N_PARTITIONS} partitions" in capfd.readouterr().err
    assert part_bytes(output) == written
    assert_same_stage(output, expected)
    assert not list(small_disk.glob(".out.partial-*"))
