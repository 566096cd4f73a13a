"""Bench: what starting the command line costs, `tokenmill --help` against plain Python.

    .venv/bin/python bench/cli_startup.py [--repeat 20] [--out bench/results/cli_startup.txt]

Each command runs `--repeat` times as a child process of its own, with this checkout first on
the path and its bytecode cached (one untimed run first writes it, as an installed package has
it). A run's cost is the CPU time of that child, user + system (`os.wait4`, the child's
`getrusage`), which load on the other cores changes less than wall time. The commands run in
turn, round after round; each one's median counts, with the spread of its runs.
Peak RSS is the largest `ru_maxrss` of the runs.

The baseline is `python -c "import argparse"`: an interpreter that starts and loads the parser
library, the least any Python command line costs. `tokenmill --help` builds every command's
parser, the curate stages' from their option dataclasses (docs/architecture.md, "The command
line"); `python -m tokenmill.train.worker --help` is the training ranks' entry point.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from measure import Timing, check_load

ROOT = Path(__file__).resolve().parents[1]

BASELINE = ("python -c 'import argparse'", ["-c", "import argparse"])
COMMANDS = (
    BASELINE,
    ("tokenmill --help", ["-m", "tokenmill", "--help"]),
    ("python -m tokenmill.train.worker --help", ["-m", "tokenmill.train.worker", "--help"]),
)


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, user + system, and peak RSS in MiB) of one `python ARGS` child."""
    pid = os.posix_spawn(
        sys.executable,
        [sys.executable, *args],
        env,
        file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)],
    )
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"python {' '.join(args)} failed with exit status {os.waitstatus_to_exitcode(status)}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # KiB on Linux


def measure(
    commands: tuple[tuple[str, list[str]], ...], repeat: int, env: dict[str, str]
) -> dict[str, tuple[Timing, float]]:
    """Each command's CPU seconds over `repeat` rounds of all of them in turn (after one untimed
    run of each) and its largest peak RSS (MiB)."""
    for _, args in commands:
        run_once(args, env)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in commands}
    for _ in range(repeat):
        for name, args in commands:
            runs[name].append(run_once(args, env))
    return {name: (Timing([cpu for cpu, _ in r]), max(rss for _, rss in r)) for name, r in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each command; the median counts")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cli_startup.txt")
    args = parser.parse_args()
    machine_load = check_load()
    # Bytecode written and read as an installed package's is: without it every run compiles.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    results = measure(COMMANDS, args.repeat, env)

    base_cpu = results[BASELINE[0]][0].median
    help_cpu = results["tokenmill --help"][0].median
    lines = [
        machine_load,
        f"# bench/cli_startup.py  ({time.strftime('%Y-%m-%d')}, Python {platform.python_version()},"
        f" {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})",
        f"CPU seconds (user + system) of one process, the median of {args.repeat} interleaved runs, bytecode"
        " cached; spread: (slowest - fastest) / median; peak RSS, the largest of the runs",
        "",
        f"{'':42s}{'CPU s':>8s}{'spread':>8s}{'peak RSS':>12s}",
    ]
    lines += [f"{name:42s}{cpu.median:8.3f}{cpu.spread:8.0%}{rss:8.0f} MiB" for name, (cpu, rss) in results.items()]
    lines += [
        "",
        f"tokenmill --help: {help_cpu - base_cpu:.3f} CPU s more than plain Python,"
        f" {help_cpu / base_cpu:.1f}x its CPU time",
    ]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
