"""Resume inside a stage: `tokenmill curate filter` killed with SIGKILL after k of n partitions
finished reruns only the other n - k, and publishes what an undisturbed run publishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dask_processes import REPO_ROOT, assert_same_stage, tokenmill, write_partitions

N_PARTITIONS = 6


def filter_command(source: Path, output: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", "curate", "filter", "--input", str(source)] + [
        "--output",
        str(output),
        "--workers",
        "1",
        "--no-progress",
        *options,
    ]


def kill_after_some_partitions(command: list[str], output: Path, cwd: Path) -> Path:
    """Start the command, SIGKILL its whole process group (client and workers) once a
    partition has finished, and return the partial directory it left."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not list(output.parent.glob(f".{output.name}.partial-*/.tasks/task-*.json")):
            assert process.poll() is None, process.communicate()[1]
            assert time.time() < deadline, "no partition finished"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    (partial,) = output.parent.glob(f".{output.name}.partial-*")
    return partial


def part_files(directory: Path) -> dict[str, tuple[int, int]]:
    """kept/ and rejected/ part files -> (inode, mtime): a rewritten file changes either."""
    found = {}
    for sub in ("kept", "rejected"):
        for path in (directory / sub).glob("part-*.parquet"):
            stat = path.stat()
            found[f"{sub}/{path.name}"] = (stat.st_ino, stat.st_mtime_ns)
    return found


def task_of(name: str) -> int:
    return int(re.search(r"part-(\d+)-", name).group(1))


@pytest.mark.slow
def test_a_killed_stage_reruns_only_the_partitions_it_had_not_finished(tmp_path, shared_data, capsys):
    source = write_partitions(shared_data, tmp_path / "in", n=N_PARTITIONS)
    expected = tmp_path / "expected"
    tokenmill("curate", "filter", "--input", str(source), "--output", str(expected), "--workers", "1")

    output = tmp_path / "out"
    partial = kill_after_some_partitions(filter_command(source, output), output, tmp_path)
    finished = {int(p.stem.split("-")[1]) for p in (partial / ".tasks").glob("task-*.json")}
    assert 0 < len(finished) < N_PARTITIONS, finished
    assert not output.exists()
    before = part_files(partial)
    # What a worker killed in the middle of writing a part leaves (the kill above may miss one).
    unfinished = min(set(range(N_PARTITIONS)) - finished)
    (partial / "rejected" / f".part-{unfinished:05d}-0000.parquet.tmp-4242-0badc0de").write_bytes(b"")

    capsys.readouterr()
    tokenmill("curate", "filter", "--input", str(source), "--output", str(output), "--workers", "1")
    summary = capsys.readouterr().err  # status lines are logged to stderr
    assert f"resumed {len(finished)} of {N_PARTITIONS} partitions" in summary

    manifest = assert_same_stage(output, expected)
    assert manifest["resumed_partitions"] == len(finished)
    after = part_files(output)
    # The finished partitions' parts are the very files the killed run wrote (published by
    # rename); every other partition was processed again, exactly once.
    rewritten = {task_of(name) for name, identity in after.items() if before.get(name) != identity}
    kept_as_is = {task_of(name) for name, identity in after.items() if before.get(name) == identity}
    assert kept_as_is == finished
    assert rewritten == set(range(N_PARTITIONS)) - finished
    assert len(rewritten) == N_PARTITIONS - len(finished)
    assert not list(tmp_path.glob(".out.partial-*")) and not (output / ".tasks").exists()


@pytest.mark.slow
def test_a_changed_config_starts_over(tmp_path, shared_data):
    source = write_partitions(shared_data, tmp_path / "in", n=3, docs=1000)
    output = tmp_path / "out"
    old = kill_after_some_partitions(filter_command(source, output), output, tmp_path)
    expected = tmp_path / "expected"
    tokenmill("curate", "filter", "--input", str(source), "--output", str(expected), "--workers", "1", "--no-c4")
    tokenmill("curate", "filter", "--input", str(source), "--output", str(output), "--workers", "1", "--no-c4")
    manifest = assert_same_stage(output, expected)
    assert manifest["resumed_partitions"] == 0
    assert not old.exists()


def test_the_work_directory_key_follows_config_inputs_and_partitions(tmp_path):
    from tokenmill.curate.resume import partial_dir, stage_key

    source = tmp_path / "in"
    source.mkdir()
    (source / "a.parquet").write_bytes(b"one")
    key = stage_key("filter", {"min_words": 50}, [str(source)], {"tokenmill": "1"}, 2)
    assert key == stage_key("filter", {"min_words": 50}, [str(source)], {"tokenmill": "1"}, 2)
    assert key != stage_key("filter", {"min_words": 51}, [str(source)], {"tokenmill": "1"}, 2)
    assert key != stage_key("filter", {"min_words": 50}, [str(source)], {"tokenmill": "2"}, 2)
    assert key != stage_key("filter", {"min_words": 50}, [str(source)], {"tokenmill": "1"}, 3)
    (source / "a.parquet").write_bytes(b"two!")  # an input file changed
    changed = stage_key("filter", {"min_words": 50}, [str(source)], {"tokenmill": "1"}, 2)
    assert changed != key
    old = Path(partial_dir(tmp_path / "out", key))
    old.mkdir()
    # What a writer killed while swapping the finished directory in leaves, and another output's.
    (tmp_path / ".out.tmp-4242-0badc0de").mkdir()
    (tmp_path / ".other.partial-0badc0de").mkdir()
    new = Path(partial_dir(tmp_path / "out", changed))
    new.mkdir()
    assert new.name == f".out.partial-{changed}"
    assert Path(partial_dir(tmp_path / "out", changed)).is_dir()  # the current run's, resumed
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.partial-0badc0de", new.name, "in"]
