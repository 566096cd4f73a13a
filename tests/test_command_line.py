"""The top-level command: one line per error, the traceback behind it with --debug."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tokenmill.infra.flags import CommandParser


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


def every_parser(parser: argparse.ArgumentParser, path: str = "tokenmill"):
    """(command, parser) for `tokenmill` and each of its commands and subcommands, with the
    arguments a command declares when first used (infra/flags.CommandParser) declared."""
    if isinstance(parser, CommandParser):
        parser.declare()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, f"{path} {name}")


def test_every_command_has_a_description_and_every_option_help() -> None:
    """Walk the whole `tokenmill` parser: each subcommand says what it does, each option what it means."""
    from tokenmill.cli import build_parser

    missing: list[str] = []
    for path, parser in every_parser(build_parser()):
        if path != "tokenmill" and not (parser.description or "").strip():
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and (
                not (action.help or "").strip() or action.help == argparse.SUPPRESS
            ):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


# A word or key path in backquotes, and what follows a colon: `parallel.tp`, `workdir:`,
# `logging.progress: false`. A help text names a config key with a dot or a colon.
_QUOTED = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*)(:[^`]*)?`")


def _schema_has(model: Any, path: list[str]) -> bool:
    """Whether `path` is a key inside `model` (a pydantic model or a dataclass: the model's
    shape), through its nested sections."""
    for i, part in enumerate(path):
        if dataclasses.is_dataclass(model):
            return i == len(path) - 1 and part in {f.name for f in dataclasses.fields(model)}
        if not (isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields):
            return False
        annotation = model.model_fields[part].annotation
        inner = [a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type)]
        model = inner[0] if inner else annotation
    return True


def test_every_config_key_a_help_text_names_exists() -> None:
    """A help text that names a config key (`overrides `parallel.tp``) names one the config
    takes: a training config's, or a recipe's (a training config's under its `train:`)."""
    from tokenmill.cli import build_parser
    from tokenmill.pipelines.schema import Recipe
    from tokenmill.train.config import TrainConfig

    named: list[tuple[str, str]] = []
    for path, parser in every_parser(build_parser()):
        texts = [parser.description or "", parser.epilog or "", *(a.help or "" for a in parser._actions)]
        for match in (m for text in texts for m in _QUOTED.finditer(text)):
            if "." in match.group(1) or match.group(2):
                named.append((path, match.group(1)))
    assert ("tokenmill train", "parallel.tp") in named and ("tokenmill run", "workdir") in named
    unknown = []
    for path, key in named:
        parts = key.split(".")
        in_training = _schema_has(TrainConfig, parts) or (parts[0] == "train" and _schema_has(TrainConfig, parts[1:]))
        if not (in_training or _schema_has(Recipe, parts)):
            unknown.append(f"{path}: `{key}`")
    assert not unknown, "help texts name keys no config takes:\n" + "\n".join(unknown)


def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(tmp_path: Path, monkeypatch, capsys) -> None:
    """Recipes, training configs, filter rules and blend files are parsed from text the command
    read itself: the error names that file, not PyYAML's `"<unicode string>"`."""
    from tokenmill.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("A document.\n")
    (tmp_path / "wiki.yaml").write_text("name: wiki\nsources:\n  - {name: wiki, path: docs\ncurate: []\n")
    (tmp_path / "tiny.yaml").write_text("model: {preset: tiny\n")
    (tmp_path / "uses-tiny.yaml").write_text(
        "name: w\nsources:\n  - {name: w, path: docs, format: text}\ntokenize: {vocab_size: 300}\n"
        "blend:\n  - {source: w, weight: 1}\ntrain: {config: tiny.yaml}\n"
    )
    (tmp_path / "rules.yaml").write_text("gopher_quality:\n  min_words: 50\n   max_words: 10\n")
    (tmp_path / "blend.yaml").write_text("- {prefix: a, weight: 1}\n- prefix: b\n weight: 2\n")
    flow = "expected ',' or '}', but got"
    cases = {
        (
            "run",
            "wiki.yaml",
            "--dry-run",
        ): f"wiki.yaml:4:7: not valid YAML: {flow} ':' (while parsing a flow mapping at line 3)",
        ("run", "uses-tiny.yaml", "--dry-run"): f"{tmp_path / 'tiny.yaml'}:2:1: not valid YAML: {flow} '<stream end>'"
        " (while parsing a flow mapping at line 1)",
        ("train", "tiny.yaml", "--data", "x", "--out", "run"): f"tiny.yaml:2:1: not valid YAML: {flow} '<stream end>'"
        " (while parsing a flow mapping at line 1)",
        ("curate", "filter", "--input", "docs", "--output", "out", "--config", "rules.yaml"): (
            "rules.yaml:3:13: not valid YAML: mapping values are not allowed here"
        ),
        (
            "train",
            "tiny",
            "--data",
            "blend.yaml",
            "--out",
            "run",
        ): "blend.yaml:3:2: not valid YAML: expected <block end>,"
        " but found '<block mapping start>' (while parsing a block collection at line 1)",
    }
    for argv, message in cases.items():
        assert main(list(argv)) == 1, argv
        captured = capsys.readouterr()
        assert captured.err.splitlines() == [f"tokenmill: error: {message}"], argv
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


# What `--help`, `<command> --help` and argument errors must not load: each costs from a tenth
# of a second to seconds of CPU, in every process that runs `tokenmill` (training ranks and the
# test suite included). How long `tokenmill --help` takes is measured by bench/cli_startup.py.
HEAVY_MODULES = ("torch", "pandas", "pyarrow", "dask", "distributed", "numba", "numpy", "transformers", "datasets")

# Run in a fresh interpreter: the test process has loaded these modules long ago.
_EVERY_HELP_AND_ERROR = """
import argparse, contextlib, io, json, sys
from tokenmill.cli import build_parser, main

def run(argv, parse=main):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parse(argv)
        except SystemExit as exit:
            return exit.code, err.getvalue()
    raise AssertionError(f"tokenmill {' '.join(argv)} did not stop at its arguments")

code, _ = run(["--help"])
parser = build_parser()  # what main() parses with; built once for the many commands below

def commands(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield [*path, name]
                yield from commands(sub, [*path, name])

results = {}
for path in commands(parser, []):
    results[" ".join(path)] = [run([*path, "--help"], parser.parse_args)[0], run([*path, "--no-such-option"], parser.parse_args)]
print(json.dumps({"help": code, "results": results,
                  "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(%r))}))
"""


def test_help_and_argument_errors_load_no_heavy_library() -> None:
    """`tokenmill --help`, `tokenmill COMMAND ... --help` for every command and subcommand, and an
    unknown option to each: none imports numpy, torch, pandas, pyarrow, Dask, numba, transformers
    or datasets."""
    import json

    done = subprocess.run(
        [sys.executable, "-P", "-c", _EVERY_HELP_AND_ERROR % (HEAVY_MODULES,)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["help"] == 0
    results = report["results"]
    assert {"curate dedup", "curate filter", "tokenize encode", "train", "eval", "run", "demo", "plan"} <= set(results)
    for command, (help_code, (error_code, error)) in results.items():
        assert help_code == 0, command
        # argparse's one line: a required option missing, or the unknown one
        last = error.splitlines()[-1]
        assert error_code == 2 and last.startswith("tokenmill") and ": error: " in last, (command, error)
    assert report["heavy"] == [], f"loaded by the command line's parsers: {report['heavy']}"
