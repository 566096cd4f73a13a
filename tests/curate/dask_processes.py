"""A real Dask cluster of separate processes, started from the command line as users start one
(`dask scheduler`, `dask worker`), and helpers to compare stage outputs between runs."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from pandas.testing import assert_frame_equal

from tokenmill.curate.documents import write_documents

REPO_ROOT = Path(__file__).resolve().parents[2]
DASK = Path(sys.executable).with_name("dask")


class DaskProcesses:
    """`dask scheduler` plus `dask worker` subprocesses on localhost; `close` kills every one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.scheduler_file = directory / "scheduler.json"
        # The workers import tokenmill from this checkout, as the client does.
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
        self.workers: list[subprocess.Popen] = []
        self.scheduler = self._spawn(
            "scheduler",
            [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
            + ["--scheduler-file", str(self.scheduler_file)],
        )
        deadline = time.time() + 60
        while not self.scheduler_file.exists():
            if self.scheduler.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"dask scheduler did not start: {self._log('scheduler')}")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole before it is closed; let it be closed
        self.address: str = json.loads(self.scheduler_file.read_text())["address"]

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "w")  # noqa: SIM115 (kept open by the child)
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.directory, start_new_session=True
        )

    def _log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def add_worker(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        """One single-threaded worker process without a nanny, so SIGKILL ends it for good."""
        name = f"worker-{len(self.workers)}"
        worker = self._spawn(
            name,
            [str(DASK), "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard"]
            + ["--name", name, "--local-directory", str(self.directory / name), "--memory-limit", "0"],
        )
        self.workers.append(worker)
        return worker

    def wait_for_workers(self, n: int, timeout: float = 90) -> None:
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            try:
                client.wait_for_workers(n, timeout=timeout)
            except TimeoutError:
                logs = "\n".join(self._log(f"worker-{i}") for i in range(len(self.workers)))
                raise RuntimeError(f"{n} dask workers did not connect:\n{logs}") from None

    def worker_address(self, index: int) -> str:
        """The address of the worker started `index`-th (workers are named by their order)."""
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        return next(address for address, info in workers.items() if info["name"] == f"worker-{index}")

    def close(self) -> None:
        # The test's own cluster, of which nothing needs a graceful end: a nanny sent SIGTERM
        # closes its worker and waits on a scheduler that is going too, up to its timeouts
        # (30 s of a test's teardown once a worker had been killed).
        for process in [*self.workers, self.scheduler]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for process in [*self.workers, self.scheduler]:
            process.wait(timeout=15)


def write_web_like_corpus(shared_data: Path, directory: Path, files: int = 4) -> Path:
    """Real paragraphs (WikiText-2 test, Shakespeare) as JSONL files, with exact and near
    duplicates, a few empty and non-English records and a PIQA goal planted, so that every
    stage keeps some documents and rejects others."""
    wiki = [p.strip() for p in (shared_data / "corpus" / "wikitext2_test.txt").read_text().split("\n")]
    wiki = [p for p in wiki if len(p) > 200 and not re.fullmatch(r"=.*=", p)][:160]
    plays = [p.strip() for p in (shared_data / "corpus" / "tinyshakespeare.txt").read_text().split("\n\n")]
    plays = [p for p in plays if len(p) > 150][:100]
    piqa = [json.loads(line) for line in (shared_data / "eval" / "piqa_valid.jsonl").open()][:5]
    rng = random.Random(7)
    texts = wiki + plays
    texts += rng.sample(wiki, 12)  # exact duplicates
    texts += [t.replace(" the ", " a ", 2) for t in rng.sample(wiki, 12)]  # near duplicates
    texts += [f"{text} {row['goal']} {row['sol1']}" for text, row in zip(plays, piqa)]  # contamination
    texts += ["", "Der schnelle braune Fuchs springt über den faulen Hund und läuft in den Wald."]
    rng.shuffle(texts)
    directory.mkdir(parents=True)
    per_file = -(-len(texts) // files)
    for f in range(files):
        with (directory / f"web-{f}.jsonl").open("w") as handle:
            for text in texts[f * per_file : (f + 1) * per_file]:
                handle.write(json.dumps({"text": text}) + "\n")
    return directory


def write_partitions(shared_data: Path, directory: Path, n: int, docs: int = 1500) -> Path:
    """n Parquet files of real paragraphs, each a partition that takes a while to filter."""
    lines = [line.strip() for line in (shared_data / "corpus" / "wikitext2_valid.txt").read_text().split("\n")]
    lines = [line for line in lines if line and not line.startswith(" =")]
    directory.mkdir(parents=True)
    for part in range(n):
        texts = [lines[(part * docs + i) % len(lines)] for i in range(docs)]
        frame = pd.DataFrame({"id": [f"p{part}-{i:05d}" for i in range(docs)], "text": texts, "source": "wiki"})
        write_documents(frame, directory / f"part-{part}.parquet")
    return directory


def cluster(directory: Path, workers: int = 2) -> DaskProcesses:
    processes = DaskProcesses(directory)
    try:
        for _ in range(workers):
            processes.add_worker()
        processes.wait_for_workers(workers)
    except BaseException:
        processes.close()
        raise
    return processes


def tokenmill(*argv: str, quiet: bool = True) -> None:
    """Run a tokenmill command in this process and require success."""
    from tokenmill.cli import main

    code = main([*argv, "--no-progress"] if quiet else list(argv))
    assert code == 0, f"tokenmill {' '.join(argv)} exited with {code}"


def read_sorted(directory: Path) -> pd.DataFrame:
    files = sorted(directory.glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return frame.sort_values("id", kind="stable").reset_index(drop=True)


def assert_same_stage(actual: Path, expected: Path) -> dict:
    """Same kept and rejected documents, in the same part files, and the same counts and stats."""
    for sub in ("kept", "rejected"):
        assert sorted(p.name for p in (actual / sub).glob("*")) == sorted(p.name for p in (expected / sub).glob("*"))
        assert_frame_equal(read_sorted(actual / sub), read_sorted(expected / sub))
    got = json.loads((actual / "manifest.json").read_text())
    want = json.loads((expected / "manifest.json").read_text())
    assert got["counts"] == want["counts"]
    assert got["stats"] == want["stats"]
    counts = got["counts"]
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    return got
