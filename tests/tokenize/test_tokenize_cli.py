"""The `tokenize` commands end to end on real text, as a user runs them."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from tokenmill.errors import TokenmillError
from tokenmill.logs import configure_logging
from tokenmill.tokenize import cli
from tokenmill.tokenize.indexed import IndexedDataset
from tokenmill.tokenize.loader import build_dataset


def run(argv: list[str]) -> int:
    # The tokenize commands on their own parser: the same `register` the top-level CLI calls.
    parser = argparse.ArgumentParser(prog="tokenmill")
    cli.register(parser.add_subparsers())
    configure_logging()  # as `tokenmill` does: the commands' status lines go to stderr
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_encode_inspect_and_load(small_wiki_docs, dask_client, tmp_path, capsys):
    tokenizer = tmp_path / "tokenizer.json"
    assert (
        run(
            [
                "tokenize",
                "train-tokenizer",
                "--input",
                str(small_wiki_docs),
                "--vocab-size",
                "512",
                "--output",
                str(tokenizer),
            ]
        )
        == 0
    )
    assert "vocab 512, eod id 0, pad id 1" in capsys.readouterr().err
    prefix = tmp_path / "shards" / "wiki"
    assert (
        run(
            [
                "tokenize",
                "encode",
                "--input",
                str(small_wiki_docs),
                "--tokenizer",
                str(tokenizer),
                "--output-prefix",
                str(prefix),
                "--no-progress",
                "--scheduler",
                dask_client.scheduler.address,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    meta = json.loads((tmp_path / "shards" / "wiki.json").read_text())
    assert f"encode: 300 documents, {meta['tokens']} tokens (uint16)" in err
    assert run(["tokenize", "inspect", str(prefix), "--docs", "1"]) == 0
    out = capsys.readouterr().out
    assert "300 documents" in out and "[0]" in out and "<|endoftext|>" in out
    # The shard feeds the trainer's dataset directly.
    dataset = build_dataset(str(prefix), seq_len=32, num_samples=50, seed=0, split_ratios="98,2,0")
    assert dataset[0].shape == (33,) and dataset[0].dtype == np.int64
    assert len(IndexedDataset(prefix)) == 300


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(TokenmillError, match="input not found"):
        run(
            [
                "tokenize",
                "encode",
                "--input",
                str(tmp_path / "none"),
                "--tokenizer",
                "t.json",
                "--output-prefix",
                str(tmp_path / "o"),
            ]
        )


def test_train_tokenizer_says_when_the_text_is_too_small_for_the_vocabulary(small_wiki_docs, tmp_path):
    """300 paragraphs cannot fill 8192 tokens: the command says how many it learned and why."""
    import subprocess
    import sys

    tokenizer = tmp_path / "tokenizer.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenmill.cli",
            "tokenize",
            "train-tokenizer",
            "--input",
            str(small_wiki_docs),
            "--vocab-size",
            "8192",
            "--output",
            str(tokenizer),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    learned = len(json.loads(tokenizer.read_text())["model"]["vocab"])
    assert 258 < learned < 8192
    warnings = [line for line in done.stderr.splitlines() if line.startswith("tokenmill: WARNING:")]
    assert len(warnings) == 1
    assert f"has {learned} tokens, not the 8192 requested" in warnings[0] and "300 documents" in warnings[0]
    assert f"vocab {learned}," in done.stderr
