"""Atomic publication (tokenmill.infra.atomic): files and directories appear whole or not at
all, leftovers of a killed writer are cleaned, torn JSON reads as absent."""

from __future__ import annotations

import numpy as np
import pytest
from shard_writing import add_each

from tokenmill.infra.atomic import (
    atomic_dir,
    atomic_path,
    read_json,
    remove_leftovers,
    replace_dir,
    temp_sibling,
)
from tokenmill.tokenize.indexed import IndexedDataset, IndexedDatasetWriter


def test_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "a.json"
    target.write_text('{"v": 1}')
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text('{"v": 2')
        raise RuntimeError("killed mid-write")
    assert read_json(target) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_directories_are_swapped_whole(tmp_path):
    target = tmp_path / "step_4"
    with atomic_dir(target) as tmp:
        (tmp / "x").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "x").write_text("half")
        raise RuntimeError
    assert (target / "x").read_text() == "old"
    # a directory many ranks write into has one name that every process computes alike
    shared = temp_sibling(target, shared=True)
    assert shared == temp_sibling(target, shared=True) == tmp_path / ".step_4.tmp"
    shared.mkdir()
    (shared / "x").write_text("new")
    replace_dir(shared, target)
    assert (target / "x").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4"]


def test_leftovers_of_a_killed_writer_are_removed(tmp_path):
    target = tmp_path / "wiki.bin"
    temp_sibling(target).write_bytes(b"partial")
    temp_sibling(target, shared=True).mkdir()
    (tmp_path / ".other.bin.tmp-1").write_bytes(b"not ours")
    remove_leftovers(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.bin.tmp-1"]


def test_read_json_treats_missing_and_torn_files_as_absent(tmp_path):
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"iteration": ')
    assert read_json(tmp_path / "torn.json") is None
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    assert read_json(tmp_path / "binary.json") is None
    (tmp_path / "ok.json").write_text('{"iteration": 3}')
    assert read_json(tmp_path / "ok.json") == {"iteration": 3}


def test_shard_writer_publishes_both_files_or_neither(tmp_path):
    prefix = tmp_path / "wiki"
    writer = IndexedDatasetWriter(prefix, np.uint16)
    add_each(writer, [[1, 2, 3]])
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    # a writer killed before finalize leaves hidden temporaries; the next writer removes them
    killed = IndexedDatasetWriter(prefix, np.uint16)
    add_each(killed, [[9]])
    killed._bin.close()
    assert len(list(tmp_path.glob(".wiki.*.tmp-*"))) == 1
    writer = IndexedDatasetWriter(prefix, np.uint16)
    add_each(writer, [[4, 5], [6]])
    writer.finalize()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wiki.bin", "wiki.idx"]
    shard = IndexedDataset(prefix)
    assert [list(shard[i]) for i in range(len(shard))] == [[4, 5], [6]]
