"""`tokenmill eval` end to end: results JSON, Markdown table, printed table, user errors."""

from __future__ import annotations

import json
from pathlib import Path

from tokenmill.cli import main
from tokenmill.eval.evaluator import evaluate


def test_eval_command_writes_json_and_table(tiny_model_dir: Path, eval_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    code = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--tasks",
            "piqa,lambada_openai",
            "--shots",
            "0,1",
            "--data-dir",
            str(eval_dir),
            "--limit",
            "6",
            "--batch-size",
            "4",
            "--output",
            str(out),
            "--bootstrap-iters",
            "1000",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    payload = json.loads(out.read_text())
    rows = payload["results"]
    assert [(r["task"], r["shots"], r["metric"]) for r in rows] == [
        ("piqa", 0, "acc"),
        ("piqa", 0, "acc_norm"),
        ("piqa", 1, "acc"),
        ("piqa", 1, "acc_norm"),
        ("lambada_openai", 0, "perplexity"),
        ("lambada_openai", 0, "acc"),
        ("lambada_openai", 1, "perplexity"),
        ("lambada_openai", 1, "acc"),
    ]
    for r in rows:
        assert r["n"] == 6 and r["model"] == str(tiny_model_dir) and len(r["data_hash"]) == 16
        assert r["stderr"] is not None and r["value"] >= 0
    table = out.with_suffix(".md").read_text()
    assert table.splitlines()[0] == "| task | shots | n | metric | value | ± stderr |"
    assert "| piqa | 1 | 6 | acc_norm |" in table and table in printed
    assert payload["config"]["fewshot_seed"] == 1234


def test_api_matches_cli_and_is_deterministic(tiny_model_dir: Path, eval_dir: Path) -> None:
    a = evaluate(tiny_model_dir, ["boolq"], [0], eval_dir, limit=5, batch_size=2, bootstrap_iters=0, progress=False)
    b = evaluate(tiny_model_dir, "boolq", "0", eval_dir, limit=5, batch_size=8, bootstrap_iters=0, progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)


def test_user_errors_are_one_line(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["eval", "--model", str(tiny_model_dir), "--tasks", "piqa,nope", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and "winogrande" in err
    assert main(["eval", "--model", str(tiny_model_dir), "--tasks", "boolq", "--data-dir", str(tmp_path)]) == 1
    assert str(tmp_path / "boolq_dev.jsonl") in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_model_dir), "--tasks", "boolq", "--shots", "0,x"]) == 1
    assert "--shots" in capsys.readouterr().err


def test_eval_help_shows_its_description_every_option_and_an_example() -> None:
    """What `tokenmill eval --help` prints (that each option has help: test_command_line)."""
    import argparse

    from tokenmill.cli import build_parser

    from .conftest import run_tokenmill

    [subparsers] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser = subparsers.choices["eval"]
    assert parser.description and "lm-evaluation-harness" in parser.description
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {
        "model",
        "tasks",
        "shots",
        "data_dir",
        "limit",
        "batch_size",
        "device",
        "output",
        "bootstrap_iters",
        "threads",
    }
    done = run_tokenmill("eval", "--help")
    assert done.returncode == 0
    for action in options:
        assert action.option_strings[0] in done.stdout
    assert " ".join(options[0].help.split()[:4]) in " ".join(done.stdout.split())
    assert "tokenmill eval --model runs/tiny --tasks piqa,winogrande,lambada_openai" in done.stdout


def test_eval_warns_nothing_on_the_installed_transformers(
    tiny_model_dir: Path, eval_dir: Path, tmp_path: Path, capfd, monkeypatch
) -> None:
    """The shared-prefix key/value cache is passed the way the installed transformers takes it
    (`cache=` since 5.24, where `past_key_values=` is deprecated): no FutureWarning or
    DeprecationWarning, and the k-shot prefix is still reused."""
    import warnings

    from tokenmill.eval.models import HFModel

    reused = []
    original = HFModel._forward_with_prefix

    def counting(self, prefix, suffixes, keep):
        logits = original(self, prefix, suffixes, keep)
        reused.append(logits is not None)
        return logits

    monkeypatch.setattr(HFModel, "_forward_with_prefix", counting)
    argv = ["eval", "--model", str(tiny_model_dir), "--tasks", "piqa", "--shots", "1", "--data-dir", str(eval_dir)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--limit", "4", "--batch-size", "4", "--bootstrap-iters", "0", "--threads", "1"]) == 0
    assert reused and all(reused)
    assert [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
    # transformers' own logger (not the warnings module) names deprecated cache attributes too.
    assert "deprecated" not in capfd.readouterr().err


def test_eval_threads_default_to_the_free_cores(tiny_model_dir: Path, eval_dir: Path, monkeypatch, capsys) -> None:
    import os

    import torch

    from tokenmill.infra import cpu

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(cpu, "_cgroup_quota", lambda: None)
    argv = ["eval", "--model", str(tiny_model_dir), "--tasks", "boolq", "--data-dir", str(eval_dir), "--limit", "2"]
    before = torch.get_num_threads()
    try:
        # 4 cores of 8; a machine load of 4 keeps 2 of ours busy: 2 threads.
        monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 1.0, 1.0))
        assert main([*argv, "--bootstrap-iters", "0"]) == 0
        assert torch.get_num_threads() == 2
        # Loaded beyond its cores: one thread, never zero.
        monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 30.0, 20.0))
        assert cpu.free_cores() == 1
        # A container's CPU quota caps the cores; OMP_NUM_THREADS leaves the choice to torch.
        monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        monkeypatch.setattr(cpu, "_cgroup_quota", lambda: 1.5)
        assert cpu.available_cores() == 2 and cpu.free_cores() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(3)
        assert main([*argv, "--bootstrap-iters", "0"]) == 0
        assert torch.get_num_threads() == 3
        assert main([*argv, "--threads", "1"]) == 0 and torch.get_num_threads() == 1
        capsys.readouterr()
        assert main([*argv, "--threads", "0"]) == 1
        assert capsys.readouterr().err.splitlines() == ["tokenmill: error: --threads must be at least 1, got 0"]
    finally:
        torch.set_num_threads(before)
