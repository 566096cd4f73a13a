"""The `tokenize` commands end to end on real text, as a user runs them."""

from __future__ import annotations

import json

import numpy as np

from tokenmill.cli import main
from tokenmill.tokenize.indexed import IndexedDataset
from tokenmill.tokenize.loader import build_dataset


def run(argv: list[str]) -> int:
    """The command as a user types it, through the top-level entry point (which also sets up the
    status lines these tests read)."""
    return main(argv)


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


def test_errors_name_the_problem(tmp_path, capsys):
    missing = tmp_path / "none"
    argv = [
        "tokenize",
        "encode",
        "--input",
        str(missing),
        "--tokenizer",
        "t.json",
        "--output-prefix",
        str(tmp_path / "o"),
    ]
    assert run(argv) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(errors) == 1 and "input not found" in errors[0] and str(missing) in errors[0]


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


def _copy_shard(prefix, directory):
    import shutil

    for ext in (".bin", ".idx", ".json"):
        shutil.copyfile(f"{prefix}{ext}", directory / f"wiki{ext}")
    return directory / "wiki"


def test_inspect_verify_passes_on_a_good_shard_and_names_a_modified_bin(wiki_shard, tmp_path, capsys):
    from tokenmill.cli import main

    prefix = _copy_shard(wiki_shard, tmp_path)
    meta = json.loads(prefix.with_suffix(".json").read_text())
    assert main(["tokenize", "inspect", "--verify", str(prefix)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{prefix}: OK ({meta['documents']} documents, {meta['tokens']} tokens; xxh64 .bin {meta['checksums']['bin']},"
        f" .idx {meta['checksums']['idx']} as recorded in wiki.json)"
    ]
    # One token changed in the middle of the .bin: the index still describes it, the checksum does not.
    data = bytearray(prefix.with_suffix(".bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    prefix.with_suffix(".bin").write_bytes(bytes(data))
    assert main(["tokenize", "inspect", "--verify", str(prefix)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tokenmill: error: {prefix}.bin has xxh64 ")
    assert f"but {prefix}.json records {meta['checksums']['bin']}: the file changed after it was encoded" in lines[0]
    # A shard whose metadata has no checksums (an older tokenmill) cannot be verified, and says so.
    del meta["checksums"]
    prefix.with_suffix(".json").write_text(json.dumps(meta))
    assert main(["tokenize", "inspect", "--verify", str(prefix)]) == 1
    assert "records no xxh64 checksums" in capsys.readouterr().err


def test_inspect_refuses_a_damaged_index_in_one_line(wiki_shard, tmp_path, capsys):
    from tokenmill.cli import main

    prefix = _copy_shard(wiki_shard, tmp_path)
    count = len(IndexedDataset(prefix))
    raw = bytearray(prefix.with_suffix(".idx").read_bytes())
    raw[34 + count * 4 + 7 * 8 + 2] ^= 0x10  # sequence 7's byte pointer, third byte
    prefix.with_suffix(".idx").write_bytes(bytes(raw))
    assert main(["tokenize", "inspect", str(prefix)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"tokenmill: error: corrupt index {prefix}.idx: sequence 7 starts at byte ")
    assert lines[0].endswith("(the shard is damaged: encode it again or restore it from a copy)")


def test_train_tokenizer_writes_nothing_on_stdout_off_a_terminal(small_wiki_docs, tmp_path, capfd, monkeypatch):
    """`tokenizers` ends each of its progress bars with a newline on stdout (fd 1, from Rust): off a
    terminal no bar is drawn and stdout stays empty; on one, --no-progress hides them."""
    import sys

    from tokenmill.cli import main

    argv = ["tokenize", "train-tokenizer", "--input", str(small_wiki_docs), "--vocab-size", "300"]
    assert main([*argv, "--output", str(tmp_path / "a.json")]) == 0
    out, err = capfd.readouterr()
    assert out == "" and "vocab 300, eod id 0, pad id 1" in err
    # As if on a terminal: the bars are asked for, and their newlines show on fd 1 ...
    for stream in ("stdout", "stderr"):
        monkeypatch.setattr(getattr(sys, stream), "isatty", lambda: True, raising=False)
    assert main([*argv, "--output", str(tmp_path / "b.json")]) == 0
    shown = capfd.readouterr().out
    assert shown.strip("\n") == "" and shown.count("\n") >= 3
    # ... unless --no-progress is given.
    assert main([*argv, "--output", str(tmp_path / "c.json"), "--no-progress"]) == 0
    assert capfd.readouterr().out == ""
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "c.json").read_bytes()
