"""Every `tokenmill curate ...` subcommand and `tokenmill inspect` describes itself and every option;
`inspect` of a directory that is not a stage says so in one line."""

from __future__ import annotations

import argparse
import subprocess
import sys

from tokenmill.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _curate_commands() -> dict[str, argparse.ArgumentParser]:
    top = _subparsers(build_parser())
    commands = {f"curate {name}": sub for name, sub in _subparsers(top["curate"]).items()}
    commands["curate"] = top["curate"]
    commands["inspect"] = top["inspect"]
    return commands


def test_every_documented_curate_command_is_there():
    """A missing module would hide its stage (descriptions and option help: test_command_line)."""
    assert {
        "curate ingest",
        "curate normalize",
        "curate langid",
        "curate filter",
        "curate train-classifier",
        "curate classify",
        "curate dedup",
        "curate decontaminate",
        "inspect",
    } <= set(_curate_commands())


def test_help_shows_description_and_option_help_as_typed():
    done = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "curate", "dedup", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert "near_duplicate" in done.stdout  # the description
    assert "MinHash permutations per signature" in done.stdout  # --num-perm's help
    done = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "curate", "train-classifier", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "fastText training epochs" in done.stdout and "held-out" in done.stdout


def test_inspect_of_a_directory_that_is_no_stage_says_so_in_one_line(tmp_path, capsys):
    from tokenmill.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "manifest.json").write_text("{bad")
    assert main(["inspect", str(tmp_path / "empty")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"tokenmill: error: {tmp_path / 'empty'} is not a stage directory: manifest.json is missing"
    )
    assert main(["inspect", str(tmp_path / "torn")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"tokenmill: error: {tmp_path / 'torn' / 'manifest.json'} is not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
