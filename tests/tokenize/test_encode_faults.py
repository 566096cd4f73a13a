"""`tokenmill tokenize encode` on a disk that fills up (a real tmpfs): one line naming the output
and the parts kept, no traceback from the workers, and the rerun after freeing space resumes
and writes the shard an undisturbed run writes, byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenmill.cli import main
from tokenmill.tokenize.indexed import bin_path, idx_path

pytestmark = pytest.mark.slow


def test_a_full_disk_is_one_line_and_the_rerun_resumes_byte_for_byte(
    wiki_docs: Path, wiki_tokenizer: Path, wiki_shard: Path, dask_client, small_disk: Path, fill_disk, capfd
) -> None:
    shard_bytes = bin_path(wiki_shard).stat().st_size + idx_path(wiki_shard).stat().st_size
    n_files = len(list(wiki_docs.glob("*.parquet")))  # one partition each
    assert n_files == 2
    prefix = small_disk / "wiki"
    filler = fill_disk(small_disk, leave=int(1.5 * shard_bytes / n_files))  # room for one partition
    argv = ["tokenize", "encode", "--input", str(wiki_docs), "--tokenizer", str(wiki_tokenizer)]
    argv += ["--output-prefix", str(prefix), "--no-progress"]
    capfd.readouterr()
    # A LocalCluster of this command: its worker's log (a failed task) would reach this stderr.
    code = main([*argv, "--workers", "1"])
    err = capfd.readouterr().err
    assert code == 1, err
    parts = small_disk / "wiki.parts"
    finished = len([p for p in parts.glob("*.json")])
    assert finished == 1
    assert err.strip().splitlines() == [
        f"tokenmill: error: tokenize encode: no space left on the device for {prefix};"
        f" 1 of 2 partitions are kept in {parts}; free space and rerun"
    ]
    assert not list(small_disk.glob("wiki.bin")) and not list(small_disk.glob("wiki.json"))

    filler.unlink()
    assert main([*argv, "--scheduler", dask_client.scheduler.address]) == 0
    assert bin_path(prefix).read_bytes() == bin_path(wiki_shard).read_bytes()
    assert idx_path(prefix).read_bytes() == idx_path(wiki_shard).read_bytes()
    meta = (small_disk / "wiki.json").read_text()
    assert re.search(r'"resumed": 1\b', meta), meta
    assert not parts.exists()
