"""Ctrl-C during a curate stage: one line, exit code 130, no worker tracebacks, nothing published."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigint_to_the_process_group_stops_a_stage_cleanly(tmp_path: Path):
    # ~110 MB of JSONL: four 32 MiB partitions, several seconds of work for two workers.
    line = json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 20}) + "\n"
    source = tmp_path / "big.jsonl"
    with source.open("w") as handle:
        handle.writelines(line for _ in range(120_000))
    output = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenmill.cli",
            "curate",
            "ingest",
            "--input",
            str(source),
            "--output",
            str(output),
            "--workers",
            "2",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        # The stage has started when its workers have written a first part into the hidden
        # temporary directory; then Ctrl-C, as a terminal sends it, to the whole process group.
        deadline = time.time() + 120
        while not list(tmp_path.glob(".out.partial-*/kept/*.parquet")):
            assert process.poll() is None, process.communicate()
            assert time.time() < deadline, "the stage did not start"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len([line for line in lines if "interrupted" in line]) == 1, stderr
    assert lines == ["tokenmill: interrupted; rerun to resume"], stderr
    # Nothing published; at most the hidden partial directory that a rerun resumes from.
    assert not output.exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "big.jsonl")
    assert left == [] or (len(left) == 1 and left[0].startswith(".out.partial-")), left
    # No worker process outlives the command (a dead one waiting to be reaped does not count, nor
    # one the kernel is still tearing down, which can take a moment on a loaded machine).
    deadline = time.time() + 5
    while _live_members(process.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert _live_members(process.pid) == [], "Dask worker processes outlived the interrupted command"


def _live_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that are not zombies (Linux /proc; none elsewhere)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            live.append(int(stat.parent.name))
    return live
