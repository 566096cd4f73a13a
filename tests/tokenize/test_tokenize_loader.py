"""The trainer's stream: resume equality, data-parallel slices, batch ramp-up, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from shard_writing import add_each

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.blend import BlendedDataset
from tokenmill.tokenize.gpt_dataset import GPTDataset
from tokenmill.tokenize.indexed import IndexedDatasetWriter
from tokenmill.tokenize.loader import SampleStream, build_dataset


@pytest.fixture()
def shards(tmp_path):
    prefixes = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        writer = IndexedDatasetWriter(tmp_path / f"s{seed}", np.uint16)
        add_each(writer, [rng.integers(0, 5000, size=int(rng.integers(3, 50))) for _ in range(60)])
        writer.finalize()
        prefixes.append(str(tmp_path / f"s{seed}"))
    (tmp_path / "blend.yaml").write_text("- prefix: s1\n  weight: 2\n- prefix: s2\n  weight: 1\n")
    return prefixes, tmp_path / "blend.yaml"


def test_build_dataset_accepts_prefix_file_and_list(shards):
    prefixes, blend_file = shards
    options = dict(seq_len=16, num_samples=100, seed=3, split_ratios="1")
    single = build_dataset(prefixes[0], **options)
    assert isinstance(single, GPTDataset) and len(single) >= 100
    from_file = build_dataset(str(blend_file), **options)
    from_list = build_dataset([{"prefix": prefixes[0], "weight": 2}, {"prefix": prefixes[1], "weight": 1}], **options)
    assert isinstance(from_file, BlendedDataset) and len(from_file) == len(from_list) >= 100
    for i in range(0, len(from_file), 7):
        np.testing.assert_array_equal(from_file[i], from_list[i])
    with pytest.raises(TokenmillError, match="token shard not found"):
        build_dataset(prefixes[0] + "x", **options)
    with pytest.raises(TokenmillError, match="blend file not found"):
        build_dataset(str(blend_file.with_name("none.yaml")), **options)


def _run(dataset, dp_size, batch_sizes, consumed=0):
    """The global batches each rank sees, reassembled in rank order."""
    streams = [SampleStream(dataset, dp_rank=r, dp_size=dp_size, consumed_samples=consumed) for r in range(dp_size)]
    batches = []
    for size in batch_sizes:
        parts = [s.next_global_batch(size) for s in streams]
        assert all(p.dtype == torch.int64 and p.shape == (size // dp_size, dataset.seq_len + 1) for p in parts)
        batches.append(torch.cat(parts))
    assert len({s.consumed_samples for s in streams}) == 1
    return batches, streams[0].consumed_samples


def test_dp_slices_cover_each_global_batch_exactly(shards):
    dataset = build_dataset(str(shards[1]), seq_len=16, num_samples=200, seed=3, split_ratios="1")
    batches, consumed = _run(dataset, 4, [8, 8, 16])
    assert consumed == 32
    expected = np.stack([dataset[i] for i in range(32)])
    np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)


def test_resume_gives_the_same_samples_as_an_uninterrupted_run(shards):
    dataset = build_dataset(str(shards[1]), seq_len=16, num_samples=300, seed=3, split_ratios="1")
    ramp = [4, 4, 8, 8, 12, 12, 16, 16]  # batch ramp-up, as the trainer does
    full, _ = _run(dataset, 2, ramp)
    for stop in (1, 3, 5):
        head, consumed = _run(dataset, 2, ramp[:stop])
        # A fresh dataset object, as after a restart: indices come back from the cache.
        reopened = build_dataset(str(shards[1]), seq_len=16, num_samples=300, seed=3, split_ratios="1")
        tail, _ = _run(reopened, 2, ramp[stop:], consumed=consumed)
        for a, b in zip(head + tail, full):
            assert torch.equal(a, b)
    # Under another data-parallel size the global batches are the same too.
    other, _ = _run(dataset, 4, ramp)
    for a, b in zip(other, full):
        assert torch.equal(a, b)


def test_stream_errors(shards):
    dataset = build_dataset(shards[0][0], seq_len=16, num_samples=20, seed=3, split_ratios="1")
    stream = SampleStream(dataset, dp_rank=0, dp_size=4)
    with pytest.raises(TokenmillError, match="not a positive multiple of the data-parallel size 4"):
        stream.next_global_batch(6)
    with pytest.raises(TokenmillError, match="build it with a larger num_samples"):
        SampleStream(dataset, dp_rank=0, dp_size=4, consumed_samples=len(dataset) - 2).next_global_batch(4)
    with pytest.raises(TokenmillError, match="dp_rank 4"):
        SampleStream(dataset, dp_rank=4, dp_size=4)
