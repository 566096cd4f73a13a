"""What the benches share: the machine's load before they measure, timings repeated interleaved
and reported as their median and spread, CPU timing, peak RSS, the worker's result file, the
common arguments and the report.

A number measured on a busy machine is not the machine's: threads wait for a core, and two
contenders timed one after the other see different loads. Every bench calls `check_load` first
(it says when the machine is busy, and the report carries the load), times its contenders in
turn round after round (`interleaved`), and reports each median with the spread of its rounds
(`Timing`); the README and docs quote only numbers measured so, with their load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The 1-minute load average per core above which the machine counts as busy.
QUIET_LOAD_PER_CORE = 0.25


def check_load(when: str = "before the run") -> str:
    """The load line a bench prints before it measures (and may print after); it says when the
    machine is busy (its numbers are then not a quiet machine's, and the README does not quote
    them as such)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    line = f"load average {load:.1f} (1 min) on {cores} cores {when}"
    if load > QUIET_LOAD_PER_CORE * cores:
        line += f": BUSY (quiet is <= {QUIET_LOAD_PER_CORE * cores:.1f}); these numbers are not a quiet machine's"
    print(line, flush=True)
    return line


def spread(values: list[float]) -> float:
    """(largest - smallest) / median of repeated measurements: how far one of them may be off."""
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median else 0.0


@dataclass(frozen=True)
class Timing:
    """The seconds of each round of one contender."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median of the rounds: how far one run may be off."""
        return spread(self.seconds)

    def __str__(self) -> str:
        return f"median {self.median:.3f}s, spread {self.spread:.0%} over {len(self.seconds)} runs"


def interleaved(
    contenders: dict[str, Callable[[], Any]],
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
    alternate: bool = False,
) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Each contender once per round, `repeat` rounds, so that all see the same load: the
    timing of each (by `clock`) and the result of its last call. `alternate`: every other
    round in reverse order (A B, B A, A B, ...), so that no contender always runs first, on a
    device still warm (or hot) from the other."""
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    results: dict[str, Any] = {}
    for round_index in range(repeat):
        order = list(contenders.items())
        for name, run in order[::-1] if alternate and round_index % 2 else order:
            start = clock()
            results[name] = run()
            seconds[name].append(clock() - start)
    return {name: Timing(values) for name, values in seconds.items()}, results


def cpu_timed(repeat: int, run: Callable[[], Any]) -> tuple[Timing, Any]:
    """The process's CPU seconds over `repeat` calls of one contender, and the last result."""
    timings, results = interleaved({"run": run}, repeat, clock=time.process_time)
    return timings["run"], results["run"]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_result(path: str | Path, **values: Any) -> None:
    """A worker's result, with its peak RSS, as JSON for the parent process."""
    Path(path).write_text(json.dumps({**values, "peak_rss_mib": peak_rss_mib()}))


def bench_parser(doc: str | None, ours_args: int, peer_args: int) -> argparse.ArgumentParser:
    """--repeat, --out, and the hidden flags that start a worker: --ours-worker ARG... (tokenmill's
    side, in this environment) and --datatrove-worker ARG... (the peer's, in .venv-bench)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed passes; the median counts")
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--ours-worker", nargs=ours_args, help=argparse.SUPPRESS)
    parser.add_argument("--datatrove-worker", nargs=peer_args, help=argparse.SUPPRESS)
    return parser


def run_worker(args: argparse.Namespace, ours: Callable[..., None], peer: Callable[..., None]) -> bool:
    """Run the worker the flags ask for (with its arguments and --repeat); False when none."""
    for values, worker in ((args.ours_worker, ours), (args.datatrove_worker, peer)):
        if values:
            worker(*values, args.repeat)
            return True
    return False


def emit_report(lines: list[str], out: str | None) -> None:
    """Print a bench report and, with `out`, write it there too (bench/results/NAME.txt)."""
    report = "\n".join(lines)
    print(report)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report + "\n")


def torchrun_rows(script: str | Path, nproc: int, *args: str) -> Any:
    """Run `script --worker OUT ARGS...` in `nproc` local processes under torchrun (one thread
    each, this checkout first on the path) and return the Python literal rank 0 wrote to OUT."""
    import ast
    import os
    import socket
    import subprocess
    import sys
    import tempfile

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.txt"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
        command = [*launcher, f"--master-port={port}", "--master-addr=127.0.0.1", str(script), "--worker", str(out)]
        subprocess.run([*command, *args], env=env, check=True, stdout=subprocess.DEVNULL)
        return ast.literal_eval(out.read_text())


def main_or_worker(main: Callable[[], None], worker: Callable[..., None]) -> None:
    """The entry point of a bench that `torchrun_rows` re-runs as its workers (`--worker OUT
    ARGS...`: the worker is called with OUT and ARGS)."""
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), *sys.argv[3:])
    else:
        main()
