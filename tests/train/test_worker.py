"""The training processes' entry point, ``python -m tokenmill.train.worker``: small, and ended
the way `tokenmill train` is (one line, the same exit statuses)."""

from __future__ import annotations

import argparse
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmill.cli import main as tokenmill_main
from tokenmill.entry import said_by_parent
from tokenmill.errors import TEMPFAIL_EXIT, TokenmillError
from tokenmill.infra.flags import CommandParser
from tokenmill.train import worker
from tokenmill.train.cli import register, worker_argv
from tokenmill.train.stop import STOPPED_EXIT, TrainingStopped

HEAVY_MODULES = ("torch", "pandas", "pyarrow", "dask", "distributed", "numba", "numpy", "transformers", "datasets")

# Run in a fresh interpreter: the test process has loaded these modules long ago.
_IMPORT = """
import json, sys
import tokenmill.train.worker
tokenmill.train.worker.build_parser().format_help()  # what `--help` and an argument error build
heavy = {m.split(".")[0] for m in sys.modules} & set(%r)
commands = {m for m in sys.modules if m in ("tokenmill.cli", "tokenmill.curate", "tokenmill.eval", "tokenmill.pipelines")}
from tokenmill.train.config import SECTIONS, TrainConfig
validators = {m.__name__ for m in (TrainConfig, *SECTIONS.values()) if m.__pydantic_complete__}
print(json.dumps(sorted(heavy | commands | validators)))
"""


def test_the_entry_point_loads_no_heavy_library() -> None:
    """A rank starts from an entry point that loads none of pandas, pyarrow, Dask or numba,
    nor the other commands' packages and parsers (not even torch or numpy, until the training
    code does); its parser reads the config's keys without building their validators (more
    than half of the config module's import), which the first config that is read builds."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", _IMPORT % (HEAVY_MODULES,)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], f"loaded by tokenmill.train.worker: {done.stdout}"


def test_a_mistake_is_the_same_one_line_and_status_as_tokenmill_trains(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "missing.yaml")
    assert tokenmill_main(["train", missing]) == 1
    said = capsys.readouterr().err
    assert said.startswith("tokenmill: error: ") and missing in said and len(said.splitlines()) == 1, said
    assert worker.main([missing]) == 1
    assert capsys.readouterr().err == said


class _PeerFailed(TokenmillError):
    exit_status = TEMPFAIL_EXIT


def _full_disk() -> RuntimeError:
    """A library's error raised from the C library's ENOSPC."""
    error = RuntimeError("checkpoint write failed")
    error.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/r/ck")
    return error


@pytest.mark.parametrize(
    ("raised", "status", "line"),
    [
        (TrainingStopped("training stopped at a checkpoint"), STOPPED_EXIT, "tokenmill: error: training stopped at a checkpoint"),
        (_PeerFailed("rank 1 went away"), TEMPFAIL_EXIT, "tokenmill: error: rank 1 went away"),
        (_full_disk(), 1, "tokenmill: error: tokenmill train: no space left on the device for /r/ck; free space and rerun"),
        (KeyboardInterrupt("rerun with --resume to continue"), 130, "tokenmill: interrupted; rerun with --resume to continue"),
        # What the launcher (or `tokenmill run`) says in its own line: the status alone.
        (said_by_parent(_PeerFailed("rank 0: collective all_reduce failed")), TEMPFAIL_EXIT, None),
        (said_by_parent(KeyboardInterrupt()), 130, None),
    ],
    ids=["stopped", "peer-failed", "disk-full", "ctrl-c", "peer-failed-said-by-launcher", "ctrl-c-said-by-run"],
)  # fmt: skip
def test_what_ends_a_rank_is_one_line_and_its_exit_status(
    raised: BaseException, status: int, line: str | None, monkeypatch, capsys
) -> None:
    def train(args: argparse.Namespace) -> int:
        assert args.config == "c.yaml" and args.steps == 3
        raise raised

    monkeypatch.setattr(worker, "run_train", train)
    assert worker.main(["c.yaml", "--steps", "3"]) == status
    assert capsys.readouterr().err.splitlines() == ([line] if line else [])


def test_a_bug_keeps_its_traceback(monkeypatch) -> None:
    def train(args: argparse.Namespace) -> int:
        raise ValueError("a bug")

    monkeypatch.setattr(worker, "run_train", train)
    with pytest.raises(ValueError, match="a bug"):
        worker.main(["c.yaml"])


@pytest.mark.parametrize("flag", ["--tp", "--dp"])
def test_the_ranks_get_the_commands_training_arguments(flag: str) -> None:
    """The launcher's command line, passed to each rank, parses there to the same arguments;
    the Slurm options stay with the process that submits."""
    parser = CommandParser()
    register(parser.add_subparsers())
    given = parser.parse_args(["train", "c.yaml", flag, "2", "--zero", "1", "--resume", "--partition", "gpu"])
    argv = worker_argv(given)
    assert argv == ["c.yaml", flag, "2", "--zero", "1", "--resume"]
    ranks = worker.build_parser().parse_args(argv)
    for name in ("config", "data", "out", "steps", "resume", "tp", "pp", "dp", "zero", "device", "max_restarts"):
        assert getattr(ranks, name) == getattr(given, name), name
    assert not ranks.slurm and ranks.partition is None


def test_every_config_flag_reaches_the_ranks() -> None:
    """Each config key's flag, given to `tokenmill train`, reaches the ranks' config (--float8
    once stayed with the launcher)."""
    given = ["--out", "o", "--data", "d", "--steps", "7", "--tp", "2", "--pp", "2", "--dp", "2", "--cp", "2"]
    given += ["--zero", "1", "--activation-checkpointing", "full", "--compile", "--float8", "--precision", "bf16"]
    given += ["--attention-backend", "math", "--device", "cpu", "--max-restarts", "2", "--peak-tflops", "9.5"]
    given += ["--no-progress"]
    parser = CommandParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "c.yaml", *given])
    assert worker_argv(args) == ["c.yaml", *given]
    ranks = worker.build_parser().parse_args(worker_argv(args))
    assert vars(ranks) == {name: value for name, value in vars(args).items() if name != "func"}


# The launcher's side of `tokenmill train --dp 2 ...`: its checks, and a run it finds finished.
_LAUNCHER = """
import json, sys
from tokenmill.train.cli import load_train_config
from tokenmill.train.preflight import nothing_to_do, prepare, refuse_fresh_start
from tokenmill.train.worker import build_parser
import tokenmill.train.launch, tokenmill.train.supervisor
args = build_parser().parse_args(["tiny", "--data", sys.argv[1], "--out", sys.argv[2], "--tp", "2", "--pp", "2", "--dp", "2"])
_, cfg = load_train_config(args)
prepared = prepare(cfg, resume=True)
refuse_fresh_start(cfg, True)
print(json.dumps({"vocab": cfg.model.vocab_size, "done": nothing_to_do(cfg, prepared),
                  "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(%r))}))
"""


def test_the_launcher_checks_a_run_without_torch(shakespeare_shard: Path, tmp_path: Path) -> None:
    """A multi-rank run's launcher checks the config, the data, the layout and the run
    directory before starting any rank, without loading torch (each rank loads it once)."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", _LAUNCHER % (("torch",),), str(shakespeare_shard), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said == {"vocab": 512, "done": None, "heavy": []}, said
