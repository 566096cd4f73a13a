"""GPTDataset indices against a plain Python rendering of Megatron-Core's algorithm (document,
sample and shuffle indices, `megatron/core/datasets/gpt_dataset.py`), and samples against the
shuffled token stream they are cut from."""

from __future__ import annotations

import bisect
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shard_writing import add_each

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.gpt_dataset import (
    GPTDataset,
    GPTIndexConfig,
    build_indices,
    legacy_shuffle,
    split_document_range,
)
from tokenmill.tokenize.indexed import IndexedDatasetWriter


def reference_indices(sizes, documents, seq_len, num_samples, seed):
    """Megatron's GPTDataset indices, written the straightforward way: whole epochs of the
    document list, one RandomState, sample starts found by searching the token stream."""
    tokens_per_epoch = sum(int(sizes[d]) for d in documents)
    epochs = 1
    while epochs * tokens_per_epoch < num_samples * seq_len + 1:
        epochs += 1
    separate = False
    before_last = 0
    if epochs > 1:
        before_last = ((epochs - 1) * tokens_per_epoch - 1) // seq_len
        per_epoch = (tokens_per_epoch - 1) // seq_len
        separate = (num_samples - before_last) < int(0.8 * per_epoch)
    rng = np.random.RandomState(seed)
    if separate:
        first = np.array(list(documents) * (epochs - 1), dtype=np.int64)
        rng.shuffle(first)
        last = np.array(list(documents), dtype=np.int64)
        rng.shuffle(last)
        doc_index = list(first) + list(last)
    else:
        all_docs = np.array(list(documents) * epochs, dtype=np.int64)
        rng.shuffle(all_docs)
        doc_index = list(all_docs)
    ends = list(itertools.accumulate(int(sizes[d]) for d in doc_index))
    starts = [0] + ends[:-1]
    total_samples = (epochs * tokens_per_epoch - 1) // seq_len
    sample_index = []
    for k in range(total_samples + 1):
        position = k * seq_len  # sample k starts here; it ends on the next one's first token
        doc = bisect.bisect_right(ends, position)
        sample_index.append((doc, position - starts[doc]))
    n_first = before_last if separate else total_samples
    shuffle_first = np.arange(n_first)
    rng.shuffle(shuffle_first)
    shuffle = list(shuffle_first)
    if n_first < total_samples:
        shuffle_last = np.arange(n_first, total_samples)
        rng.shuffle(shuffle_last)
        shuffle += list(shuffle_last)
    return np.array(doc_index), np.array(sample_index), np.array(shuffle), separate, epochs


@pytest.mark.parametrize(
    "seq_len, epochs_wanted, seed, expect_epochs, expect_separate",
    [
        (16, 0.5, 1, 1, False),  # less than one epoch
        (16, 2.3, 7, 3, True),  # 2 epochs and a short last one: shuffled separately
        (8, 1.9, 3, 2, False),  # the last epoch is long enough to mix with the others
        (5, 4.1, 9, 5, True),
        (3, 0.01, 0, 1, False),
    ],
)
def test_indices_match_reference(seq_len, epochs_wanted, seed, expect_epochs, expect_separate):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, size=50).astype(np.int32)
    documents = np.arange(5, 45, dtype=np.int32)  # a split in the middle of the shard
    num_samples = max(1, int(epochs_wanted * int(sizes[documents].sum()) / seq_len))
    doc_index, sample_index, shuffle, separate, epochs = reference_indices(sizes, documents, seq_len, num_samples, seed)
    assert (epochs, separate) == (expect_epochs, expect_separate)
    ours = build_indices(sizes, documents, GPTIndexConfig(seq_len, num_samples, seed))
    np.testing.assert_array_equal(ours[0], doc_index)
    np.testing.assert_array_equal(ours[1], sample_index)
    np.testing.assert_array_equal(ours[2], shuffle)
    assert len(ours[2]) >= num_samples


def test_split_ranges_follow_megatron_rounding():
    assert split_document_range(1000, "969,30,1", "train") == (0, 969)
    assert split_document_range(1000, "969,30,1", "valid") == (969, 999)
    assert split_document_range(1000, "969,30,1", "test") == (999, 1000)
    assert split_document_range(10, "98,2,0", "test") is None
    assert split_document_range(7, "1", "train") == (0, 7)
    with pytest.raises(TokenmillError, match="split ratios"):
        split_document_range(10, "a,b", "train")
    with pytest.raises(TokenmillError, match="split must be one of"):
        split_document_range(10, "1,1,1", "dev")


def _shard(path, docs):
    writer = IndexedDatasetWriter(path, np.uint16)
    add_each(writer, docs)
    writer.finalize()
    return path


def test_samples_are_cut_from_the_shuffled_stream(tmp_path):
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(1, 30, size=60)]
    prefix = _shard(tmp_path / "s", docs)
    seq_len = 10
    ds = GPTDataset(prefix, seq_len=seq_len, num_samples=150, seed=11, split="train", split_ratios="8,2")
    begin, end = ds.document_range
    assert (begin, end) == (0, 48)
    stream = np.concatenate([docs[d] for d in ds.document_index])
    assert len(ds) >= 150
    for i in range(len(ds)):
        k = int(ds.shuffle_index[i])
        sample = ds[i]
        assert sample.dtype == np.int64 and sample.shape == (seq_len + 1,)
        np.testing.assert_array_equal(sample, stream[k * seq_len : k * seq_len + seq_len + 1])
    # The valid split reads only its own documents.
    valid = GPTDataset(prefix, seq_len=seq_len, num_samples=5, seed=11, split="valid", split_ratios="8,2")
    assert set(np.unique(valid.document_index)) == set(range(48, 60))


def test_indices_are_cached_beside_the_shard(tmp_path):
    rng = np.random.default_rng(2)
    prefix = _shard(tmp_path / "s", [rng.integers(0, 100, size=20) for _ in range(30)])
    first = GPTDataset(prefix, seq_len=8, num_samples=100, seed=3, split_ratios="1")
    cached = sorted(p.name for p in (tmp_path / "s.cache").iterdir())
    assert len(cached) == 3 and all(name.endswith(".npy") for name in cached)
    second = GPTDataset(prefix, seq_len=8, num_samples=100, seed=3, split_ratios="1")
    assert isinstance(second.sample_index, np.memmap)  # loaded, not rebuilt
    for a, b in zip(
        (first.document_index, first.sample_index, first.shuffle_index),
        (second.document_index, second.sample_index, second.shuffle_index),
    ):
        np.testing.assert_array_equal(a, b)
    GPTDataset(prefix, seq_len=8, num_samples=100, seed=4, split_ratios="1")
    assert len(list((tmp_path / "s.cache").iterdir())) == 6  # another seed, other files


def test_empty_split_and_bad_options_are_errors(tmp_path):
    prefix = _shard(tmp_path / "s", [[1, 2, 3]] * 10)
    with pytest.raises(TokenmillError, match="test split of .* is empty"):
        GPTDataset(prefix, seq_len=4, num_samples=3, seed=0, split="test", split_ratios="969,30,1")
    with pytest.raises(TokenmillError, match="seq_len"):
        GPTDataset(prefix, seq_len=1, num_samples=3, seed=0)
    with pytest.raises(TokenmillError, match="not found"):
        GPTDataset(tmp_path / "nope", seq_len=4, num_samples=3, seed=0)


def test_legacy_shuffle_is_randomstate_shuffle():
    for n in (0, 1, 2, 3, 100, 70_000):
        ours, theirs = np.random.RandomState(n), np.random.RandomState(n)
        for dtype in (np.int32, np.uint32):  # two shuffles: the generator state carries over
            a, b = np.arange(n, dtype=dtype), np.arange(n, dtype=dtype)
            legacy_shuffle(ours, a)
            theirs.shuffle(b)
            np.testing.assert_array_equal(a, b)
        assert ours.randint(1 << 30) == theirs.randint(1 << 30)


RANK_SCRIPT = """
import datetime, json, sys
import numpy as np
import torch.distributed as dist
from tokenmill.tokenize.loader import build_dataset
store, rank, out, *prefixes = sys.argv[1:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=int(rank), world_size=2,
    timeout=datetime.timedelta(seconds=120))
try:
    blend = build_dataset([{"prefix": p, "weight": 1.0} for p in prefixes], seq_len=8, num_samples=200, seed=5,
        split_ratios="1")
finally:
    dist.destroy_process_group()
report = {
    "built": [d.built for d in blend.datasets],
    "mapped": [isinstance(d.sample_index, np.memmap) for d in blend.datasets]
        + [isinstance(blend.dataset_index, np.memmap)],
    "samples": [blend[i].tolist() for i in range(0, 200, 7)],
}
open(out, "w").write(json.dumps(report))
"""


def test_ranks_share_the_indices_rank_zero_builds(tmp_path):
    """Two gloo ranks (this process is rank 0, a child rank 1) open a blend of two shards:
    rank 0 builds every index once, rank 1 waits and memory-maps rank 0's files, and both read
    the same samples."""
    rng = np.random.default_rng(4)
    prefixes = [str(_shard(tmp_path / name, [rng.integers(0, 100, size=30) for _ in range(40)])) for name in "ab"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    rank_args = [[str(tmp_path / "store"), str(r), str(tmp_path / f"rank{r}.json"), *prefixes] for r in range(2)]
    child = subprocess.Popen(
        [sys.executable, "-c", RANK_SCRIPT, *rank_args[1]], env=env, stderr=subprocess.PIPE, text=True
    )
    argv = sys.argv
    try:  # rank 0 here: torch is imported once per test run, not once more per rank
        sys.argv = ["rank0", *rank_args[0]]
        exec(RANK_SCRIPT, {})
    finally:
        sys.argv = argv
    assert child.wait(timeout=300) == 0, child.stderr.read()[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert rank0["built"] == [True, True] and rank1["built"] == [False, False]
    assert rank1["mapped"] == [True, True, True]
    assert rank0["samples"] == rank1["samples"]
