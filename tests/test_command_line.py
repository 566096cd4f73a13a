"""The top-level command: one line per error, the traceback behind it with --debug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def tokenmill(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tokenmill.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_an_error_is_one_line_and_debug_shows_its_traceback(tmp_path: Path) -> None:
    plain = tokenmill("curate", "filter", "--input", "missing", "--output", "out", cwd=tmp_path)
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines() == ["tokenmill: error: input not found: missing"]
    for argv in (
        ["--debug", "curate", "filter", "--input", "missing", "--output", "out"],
        ["curate", "filter", "--input", "missing", "--output", "out", "--debug"],
    ):
        debug = tokenmill(*argv, cwd=tmp_path)
        assert debug.returncode == 1
        assert "Traceback (most recent call last)" in debug.stderr
        assert "resolve_input_files" in debug.stderr  # where it was raised
        assert debug.stderr.strip().splitlines()[-1] == "tokenmill: error: input not found: missing"
    assert not (tmp_path / "out").exists()


def test_help_lists_debug(tmp_path: Path) -> None:
    done = tokenmill("--help", cwd=tmp_path)
    assert done.returncode == 0 and "--debug" in done.stdout


def test_every_command_has_a_description_and_every_option_help() -> None:
    """Walk the whole `tokenmill` parser: each subcommand says what it does, each option what it means."""
    import argparse

    from tokenmill.cli import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if not (sub.description or "").strip():
                        missing.append(f"{path} {name}: no description")
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and (
                not (action.help or "").strip() or action.help == argparse.SUPPRESS
            ):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")

    walk(build_parser(), "tokenmill")
    assert not missing, "\n".join(missing)
