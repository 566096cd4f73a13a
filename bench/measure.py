"""What the benches that run a peer in its own process share: CPU timing, peak RSS, the worker's
result file, the common arguments and the report."""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """The fewest CPU seconds of the process over `repeat` calls, and the last call's result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = run()
        best = min(best, time.process_time() - start)
    return best, result


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_result(path: str | Path, **values: Any) -> None:
    """A worker's result, with its peak RSS, as JSON for the parent process."""
    Path(path).write_text(json.dumps({**values, "peak_rss_mib": peak_rss_mib()}))


def bench_parser(doc: str | None, ours_args: int, peer_args: int) -> argparse.ArgumentParser:
    """--repeat, --out, and the hidden flags that start a worker: --ours-worker ARG... (tokenmill's
    side, in this environment) and --datatrove-worker ARG... (the peer's, in .venv-bench)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed passes; the best counts")
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


def main_or_worker(main: Callable[[], None], worker: Callable[[Path], None]) -> None:
    """The entry point of a bench that `torchrun_rows` re-runs as its workers (`--worker OUT`)."""
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]))
    else:
        main()
