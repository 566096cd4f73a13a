"""A checkpoint is data, never code: a crafted ``meta.json`` or DCP ``.metadata`` whose pickle
would run a command is refused (or, for old pickled RNG states, ignored with a warning) and the
command never runs, through `train --resume`, `export-hf` and `eval` alike."""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest

from tokenmill.train.checkpoint_files import file_sha256


def main(*args: str) -> int:
    from tokenmill.cli import main as tokenmill_main

    return tokenmill_main(list(args))


def _train(shard: Path, run: Path, steps: int) -> tuple[str, ...]:
    """`tokenmill train`'s arguments for the bundled tiny config on ``shard``."""
    return ("train", "tiny", "--data", str(shard), "--out", str(run), "--steps", str(steps), "--no-progress")


@pytest.fixture(scope="module")
def trained_run(shakespeare_shard: Path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trusted") / "run"
    assert main(*_train(shakespeare_shard, run, steps=2)) == 0
    return run


@pytest.fixture
def run(trained_run: Path, tmp_path: Path) -> Path:
    """A copy of the trained run that a test may tamper with."""
    return Path(shutil.copytree(trained_run, tmp_path / "run"))


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def _replace_file(checkpoint: Path, name: str, data: bytes) -> None:
    """Write ``name`` and record its size and sha256 in meta.json, as a crafted checkpoint would."""
    (checkpoint / name).write_bytes(data)
    meta = json.loads((checkpoint / "meta.json").read_text())
    if name != "meta.json":
        meta["files"][name] = {"bytes": len(data), "sha256": file_sha256(checkpoint / name)}
        (checkpoint / "meta.json").write_text(json.dumps(meta))


class _RunsCommand:
    """Unpickled, it runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_crafted_dcp_metadata_is_refused_in_one_line_everywhere_a_checkpoint_loads(
    run: Path, tmp_path: Path, shakespeare_shard: Path, shared_data: Path, capsys
) -> None:
    marker = tmp_path / "ran"
    # A hand-written protocol 0 pickle naming os.system, as an attacker writes it.
    crafted = f"cos\nsystem\n(V touch {marker}\ntR.".encode()
    _replace_file(_checkpoint(run), ".metadata", crafted)
    capsys.readouterr()
    commands = [
        ("export-hf", str(run), str(tmp_path / "hf")),
        (
            "eval",
            "--model",
            str(run),
            "--tasks",
            "lambada_openai",
            "--data-dir",
            str(shared_data / "eval"),
            "--limit",
            "2",
        ),
        (*_train(shakespeare_shard, run, steps=3), "--resume"),
    ]
    for command in commands:
        assert main(*command) != 0, command
        lines = _error_lines(capsys)
        assert len(lines) == 1, (command, lines)
        assert (
            lines[0].startswith("tokenmill: error: checkpoint metadata ")
            and "refuses to load class os.system" in lines[0]
        )
        assert not marker.exists(), command
    assert not (tmp_path / "hf").exists()


def test_a_metadata_pickle_of_another_class_is_refused(run: Path, tmp_path: Path) -> None:
    from tokenmill.train.checkpoint import load_for_inference
    from tokenmill.train.checkpoint_files import CheckpointError

    marker = tmp_path / "ran"
    _replace_file(_checkpoint(run), ".metadata", pickle.dumps(_RunsCommand(marker)))
    with pytest.raises(CheckpointError, match=r"refuses to load class (posix|os)\.system"):
        load_for_inference(run)
    assert not marker.exists()


def test_pickled_rng_states_in_meta_json_are_never_unpickled(
    run: Path, tmp_path: Path, shakespeare_shard: Path, caplog
) -> None:
    """An old checkpoint's RNG states were pickles: resuming ignores them with one warning."""
    marker = tmp_path / "ran"
    checkpoint = _checkpoint(run)
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert isinstance(meta["rng"]["python"], list) and isinstance(meta["rng"]["numpy"], list)  # JSON, not pickles
    crafted = base64.b64encode(pickle.dumps(_RunsCommand(marker))).decode()
    meta["rng"]["python"] = meta["rng"]["numpy"] = crafted
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        assert main(*_train(shakespeare_shard, run, steps=3), "--resume") == 0
    assert not marker.exists()
    warnings = [r.getMessage() for r in caplog.records if "random states as pickles" in r.getMessage()]
    assert len(warnings) == 1 and str(checkpoint / "meta.json") in warnings[0]


def test_random_states_that_are_not_valid_are_one_line(run: Path, shakespeare_shard: Path, capsys) -> None:
    meta_path = _checkpoint(run) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["rng"]["python"] = [3, [1, 2], None]  # a state vector of the wrong size
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(*_train(shakespeare_shard, run, steps=3), "--resume") == 1
    lines = _error_lines(capsys)
    assert lines == [f"tokenmill: error: {meta_path}: its random states are not valid: state vector is the wrong size"]
