"""Output ownership: a command replaces only its own earlier output, refuses in one line and
before any work an output it must not or cannot write, and one writer at a time writes an
output (`tokenmill/infra/outputs.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tokenmill.cli import main
from tokenmill.infra.lock import PidLock

REPO = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, n: int = 6, ids: str = "d") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"{ids}{i}", "text": f"document number {i} has a few words in it"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_error_line(capsys) -> str:
    """The command's stderr, checked to be one `tokenmill: error:` line."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokenmill: error: ") and "\n" not in err, err
    return err


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def stage_dir(tmp_path: Path) -> Path:
    """A stage directory written by `curate ingest`."""
    out = tmp_path / "ingested"
    assert main(["curate", "ingest", "--input", str(write_jsonl(tmp_path / "raw.jsonl")), "--output", str(out)]) == 0
    return out


def test_a_folder_that_is_not_a_stage_directory_is_refused_and_kept(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "unterminated\n')
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main(["curate", "ingest", "--input", str(bad), "--output", str(user), "--no-progress"]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output {user} exists and is not a stage directory (it has no manifest.json);"
        " choose another --output or remove it"
    )
    assert tree(user) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "userdir"]  # no partial output


def test_a_file_is_never_turned_into_a_stage_directory(tmp_path, stage_dir, capsys):
    existing = tmp_path / "existing.txt"
    existing.write_text("keep me")
    for stage in ("ingest", "normalize"):
        source = tmp_path / "raw.jsonl" if stage == "ingest" else stage_dir
        assert main(["curate", stage, "--input", str(source), "--output", str(existing), "--no-progress"]) == 1
        assert one_error_line(capsys) == (
            f"tokenmill: error: --output {existing} is a file, not a stage directory; choose another --output or remove it"
        )
    assert existing.read_text() == "keep me"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".existing.txt")]


def test_an_output_among_the_inputs_is_refused(tmp_path, stage_dir, capsys):
    raw = tmp_path / "rawdata"
    write_jsonl(raw / "a.jsonl")
    before = tree(raw)
    assert main(["curate", "ingest", "--input", str(raw), "--output", str(raw), "--no-progress"]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output {raw} is the input {raw}; write the output somewhere else"
    )
    assert main(["curate", "ingest", "--input", str(raw), "--output", str(raw / "out"), "--no-progress"]) == 1
    assert f"--output {raw / 'out'} is inside the input {raw}" in one_error_line(capsys)
    # A stage over its own output: normalize --input X --output X.
    assert main(["curate", "normalize", "--input", str(stage_dir), "--output", str(stage_dir), "--no-progress"]) == 1
    assert f"--output {stage_dir} is the input {stage_dir}" in one_error_line(capsys)
    # An input inside the output.
    assert main(["curate", "ingest", "--input", str(raw / "a.jsonl"), "--output", str(raw), "--no-progress"]) == 1
    assert f"--output {raw} holds the input {raw / 'a.jsonl'}" in one_error_line(capsys)
    assert tree(raw) == before


def test_an_earlier_output_of_the_same_command_is_replaced(tmp_path, stage_dir):
    # The rerun of a stage over its own earlier output (and an empty folder) stays allowed.
    first = json.loads((stage_dir / "manifest.json").read_text())
    assert main(["curate", "ingest", "--input", str(tmp_path / "raw.jsonl"), "--output", str(stage_dir)]) == 0
    assert json.loads((stage_dir / "manifest.json").read_text())["counts"] == first["counts"]
    (tmp_path / "empty").mkdir()
    assert main(["curate", "normalize", "--input", str(stage_dir), "--output", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "manifest.json").is_file()


def test_outputs_that_cannot_be_written_are_refused_before_the_work(tmp_path, stage_dir, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    (a_dir / "x").write_text("x")

    # train-tokenizer into a directory: refused before training, nothing written beside it.
    argv = ["tokenize", "train-tokenizer", "--input", str(stage_dir), "--vocab-size", "300", "--output", str(a_dir)]
    assert main(argv) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output {a_dir} is a directory, not a tokenizer; choose another --output or remove it"
    )
    assert tree(a_dir) == {"x": b"x"} and not list(tmp_path.glob("a-dir.meta.json"))

    # train-classifier into a directory: refused before the documents are read.
    argv = ["curate", "train-classifier", "--positive", str(stage_dir), "--negative", str(stage_dir)]
    assert main([*argv, "--output", str(a_dir)]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output {a_dir} is a directory, not a classifier model; choose another --output or remove it"
    )

    # encode under a file.
    argv = ["tokenize", "encode", "--input", str(stage_dir), "--tokenizer", str(a_file), "--output-prefix"]
    assert main([*argv, str(a_file / "shard")]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output-prefix {a_file / 'shard'} cannot be written: {a_file} is a file"
    )

    # train --out a regular file: refused before the data is read (the data does not exist).
    assert main(["train", "tiny", "--data", str(tmp_path / "no-data"), "--out", str(a_file), "--steps", "1"]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --out {a_file} is a file, not a run directory; choose another --out or remove it"
    )

    # eval --output a directory: refused before the model is evaluated.
    import tokenmill.eval.evaluator as evaluator

    monkeypatch.setattr(evaluator, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking --output"))
    assert main(["eval", "--model", str(tmp_path / "model"), "--tasks", "lambada", "--output", str(a_dir)]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --output {a_dir} is a directory, not eval results; choose another --output or remove it"
    )

    # export-hf into a file, and run --workdir a file.
    assert main(["export-hf", str(tmp_path / "run"), str(a_file)]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: export-hf OUTDIR {a_file} is a file, not a Hugging Face model directory;"
        " choose another export-hf OUTDIR or remove it"
    )
    assert main(["run", "demo", "--workdir", str(a_file)]) == 1
    assert one_error_line(capsys) == (
        f"tokenmill: error: --workdir {a_file} is a file, not a recipe work directory; choose another --workdir or remove it"
    )
    assert a_file.read_text() == "x" and tree(a_dir) == {"x": b"x"}


def test_every_kind_of_output_is_refused_while_another_process_holds_it(tmp_path, stage_dir, capsys):
    """The lock beside an output, held here by the test: each writer of that output refuses,
    naming this process's pid, and writes nothing."""
    pid = os.getpid()

    def refused_while_held(output: Path, flag: str, argv: list[str]) -> None:
        with PidLock(output.parent / f".{output.name}.lock", lambda holder: AssertionError(holder)):
            assert main(argv) == 1
        assert one_error_line(capsys) == (
            f"tokenmill: error: another tokenmill process (pid {pid}) is writing {flag} {output};"
            f" wait for it or choose another {flag}"
        )
        assert not output.exists()

    out = tmp_path / "normalized"
    refused_while_held(out, "--output", ["curate", "normalize", "--input", str(stage_dir), "--output", str(out)])
    tokenizer = tmp_path / "tokenizer.json"
    argv = ["tokenize", "train-tokenizer", "--input", str(stage_dir), "--vocab-size", "300", "--output"]
    refused_while_held(tokenizer, "--output", [*argv, str(tokenizer)])
    prefix = tmp_path / "shard"
    argv = ["tokenize", "encode", "--input", str(stage_dir), "--tokenizer", str(tokenizer), "--output-prefix"]
    refused_while_held(prefix, "--output-prefix", [*argv, str(prefix)])
    index = tmp_path / "index"
    argv = ["curate", "dedup", "--input", str(stage_dir), "--output", str(tmp_path / "deduped"), "--index", str(index)]
    refused_while_held(index, "--index", argv)
    assert not (tmp_path / "deduped").exists()
    # Released: the writer goes through.
    assert main(["curate", "normalize", "--input", str(stage_dir), "--output", str(out)]) == 0
    assert (out / "manifest.json").is_file()


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _together(*commands: list[str]) -> list[tuple[int, int, str]]:
    """Start the commands at once; (pid, status, stderr) each. Each takes its lock as it starts,
    seconds before it publishes (a stage's own one-worker cluster starts first; dedup's phases
    take seconds), so the two overlap."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tokenmill", *argv, "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for argv in commands
    ]
    return [(p.pid, p.wait(timeout=120), p.communicate()[1]) for p in procs]


def _one_winner(results: list[tuple[int, int, str]], flag: str, output: Path) -> int:
    """The index of the one command that succeeded; the other said who holds `output`."""
    assert sorted(status for _, status, _ in results) == [0, 1], results
    winner = 0 if results[0][1] == 0 else 1
    assert results[1 - winner][2].strip() == (
        f"tokenmill: error: another tokenmill process (pid {results[winner][0]}) is writing {flag} {output};"
        f" wait for it or choose another {flag}"
    )
    return winner


def _documents_on_disk(stage: Path) -> dict[str, int]:
    def rows(sub: str) -> int:
        return sum(len(pd.read_parquet(f)) for f in (stage / sub).glob("*.parquet"))

    return {"kept": rows("kept"), "rejected": rows("rejected")}


def test_two_stages_started_together_on_one_output_one_wins_and_its_output_is_whole(tmp_path, stage_dir):
    out = tmp_path / "normalized"
    argv = ["curate", "normalize", "--input", str(stage_dir), "--output", str(out), "--workers", "1"]
    _one_winner(_together(argv, argv), "--output", out)
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    on_disk = _documents_on_disk(out)
    assert counts["kept"] == on_disk["kept"] == 6
    assert sum(counts["rejected"].values()) == on_disk["rejected"]
    assert not list(tmp_path.glob(".normalized.partial-*"))


def test_two_dedups_started_together_on_one_index_one_wins_and_the_index_holds_its_batch(tmp_path, stage_dir):
    index = tmp_path / "index"
    outputs = [tmp_path / "a", tmp_path / "b"]
    argvs = [
        ["curate", "dedup", "--method", "exact", "--input", str(stage_dir), "--output", str(out), "--index", str(index)]
        for out in outputs
    ]
    winner = _one_winner(_together(*argvs), "--index", index)
    meta = json.loads((index / "index.json").read_text())
    assert len(meta["batches"]) == 1 and meta["documents"] == 6
    kept = json.loads((outputs[winner] / "manifest.json").read_text())["counts"]["kept"]
    assert kept == 6 and not outputs[1 - winner].exists()
    # The winner's documents are in the index: a later run over the same documents from
    # elsewhere keeps none of them.
    again = tmp_path / "again"
    other = tmp_path / "other.jsonl"
    write_jsonl(other, ids="e")  # the same texts under other ids
    assert main(["curate", "ingest", "--input", str(other), "--output", str(tmp_path / "other")]) == 0
    argv = ["curate", "dedup", "--method", "exact", "--input", str(tmp_path / "other"), "--output", str(again)]
    argv += ["--index", str(index)]
    assert main([*argv, "--no-index-update"]) == 0
    assert json.loads((again / "manifest.json").read_text())["counts"]["kept"] == 0
