"""Megatron's greedy blending: indices against a plain rendering, counts, blend files, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from shard_writing import add_each

from tokenmill.errors import TokenmillError
from tokenmill.tokenize.blend import BlendedDataset, build_blending_indices, load_blend_file, parse_blend
from tokenmill.tokenize.gpt_dataset import GPTDataset
from tokenmill.tokenize.indexed import IndexedDatasetWriter


def reference_blend(weights, size):
    total = sum(weights)
    weights = [w / total for w in weights]
    counts = [0] * len(weights)
    dataset_index, sample_index = [], []
    for i in range(size):
        errors = [w * max(i, 1) - c for w, c in zip(weights, counts)]
        j = errors.index(max(errors))  # first maximum: ties go to the lowest index
        dataset_index.append(j)
        sample_index.append(counts[j])
        counts[j] += 1
    return dataset_index, sample_index, counts


@pytest.mark.parametrize(
    "weights, size", [([0.5, 0.3, 0.2], 1000), ([1, 1], 7), ([3.0, 1.0, 1.0, 5.0], 333), ([1.0], 10)]
)
def test_blending_indices_match_reference(weights, size):
    dataset_index, sample_index, counts = reference_blend(weights, size)
    ours_dataset, ours_sample = build_blending_indices([w / sum(weights) for w in weights], size)
    assert ours_dataset.dtype == np.int16 and ours_sample.dtype == np.int64
    assert ours_dataset.tolist() == dataset_index
    assert ours_sample.tolist() == sample_index
    # Greedy blending never drifts more than one sample from the exact proportion.
    for w, c in zip(weights, counts):
        assert abs(c - size * w / sum(weights)) <= 1


def _shard(path, n_docs, seed):
    rng = np.random.default_rng(seed)
    writer = IndexedDatasetWriter(path, np.uint16)
    # Each shard's tokens come from its own range, so a sample tells where it came from.
    add_each(
        writer, [rng.integers(seed * 1000, seed * 1000 + 1000, size=int(rng.integers(5, 40))) for _ in range(n_docs)]
    )
    writer.finalize()
    return str(path)


def test_blended_dataset_sizes_counts_and_samples(tmp_path):
    a, b = _shard(tmp_path / "a", 80, 1), _shard(tmp_path / "b", 50, 2)
    entries = parse_blend([{"prefix": a, "weight": 3}, {"prefix": b, "weight": 1}])
    blend = BlendedDataset(entries, seq_len=8, num_samples=200, seed=5, split_ratios="1")
    # Megatron sizes: each shard built with ceil(ceil(N*w)*1.005) samples, blend of sum ceil(N*w).
    assert [d.config.num_samples for d in blend.datasets] == [math.ceil(150 * 1.005), math.ceil(50 * 1.005)]
    assert len(blend) == 150 + 50
    counts = np.bincount(blend.dataset_index)
    assert counts.tolist() == [150, 50]
    solo = GPTDataset(a, seq_len=8, num_samples=151, seed=5, split_ratios="1")
    for i in range(len(blend)):
        d, k = int(blend.dataset_index[i]), int(blend.dataset_sample_index[i])
        sample = blend[i]
        assert sample.shape == (9,)
        assert (sample // 1000 == d + 1).all()  # drawn from the right shard
        if d == 0:
            np.testing.assert_array_equal(sample, solo[k])


def _samples_of(blend, dataset):
    return [blend[i].tolist() for i in range(len(blend)) if blend.dataset_index[i] == dataset]


def test_same_source_order_reads_each_source_alike_whatever_the_weights(tmp_path):
    # About 100 samples of 8 tokens each: 60 samples are one epoch, 120 two.
    a, b = _shard(tmp_path / "a", 35, 1), _shard(tmp_path / "b", 35, 2)

    def blend(weight_a, same_order):
        entries = parse_blend([{"prefix": a, "weight": weight_a}, {"prefix": b, "weight": 1 - weight_a}])
        return BlendedDataset(
            entries, seq_len=8, num_samples=200, seed=5, split_ratios="1", same_source_order=same_order
        )

    # Built for another number of epochs, a source is shuffled otherwise: blends differ in which
    # of its samples they read, not only in how many.
    less, more = _samples_of(blend(0.3, False), 0), _samples_of(blend(0.6, False), 0)
    assert more[: len(less)] != less
    less, more = _samples_of(blend(0.3, True), 0), _samples_of(blend(0.6, True), 0)
    assert len(less) == 60 and more[: len(less)] == less
    less, more = _samples_of(blend(0.6, True), 1), _samples_of(blend(0.3, True), 1)
    assert len(less) == 80 and more[: len(less)] == less


def test_blend_files_yaml_and_json(tmp_path):
    _shard(tmp_path / "a", 10, 1)
    _shard(tmp_path / "b", 10, 2)
    (tmp_path / "blend.yaml").write_text("- prefix: a\n  weight: 0.7\n- prefix: b\n  weight: 0.3\n")
    (tmp_path / "blend.json").write_text(
        json.dumps([{"prefix": str(tmp_path / "a"), "weight": 0.7}, {"prefix": "b", "weight": 0.3}])
    )
    for name in ("blend.yaml", "blend.json"):
        entries = load_blend_file(tmp_path / name)
        assert [e.prefix for e in entries] == [str(tmp_path / "a"), str(tmp_path / "b")]
        assert [e.weight for e in entries] == [0.7, 0.3]


@pytest.mark.parametrize(
    "blend, message",
    [
        ([], "non-empty list"),
        ([{"weight": 1}], "entry 0 lacks the key 'prefix'"),
        ([{"prefix": "a", "weight": -1}], "weight -1; weights must be positive"),
        ([{"prefix": "a", "weight": 0}], "weight 0"),
        ([{"prefix": "a", "weight": "high"}], "weight 'high'"),
        ([{"prefix": "a", "weight": float("nan")}], "weight nan"),
        ([{"prefix": "a", "weigth": 1}], "unknown key"),
        ([{"prefix": "missing", "weight": 1}], "entry 0: token shard file not found: .*missing.idx"),
    ],
)
def test_bad_blends_are_clear_errors(tmp_path, blend, message):
    _shard(tmp_path / "a", 5, 1)
    with pytest.raises(TokenmillError, match=message):
        parse_blend(blend, base_dir=tmp_path)


def test_bad_blend_file(tmp_path):
    (tmp_path / "blend.yaml").write_text("- prefix: [unclosed\n")
    with pytest.raises(TokenmillError, match=r"blend\.yaml:2:1: not valid YAML: .*flow sequence"):
        load_blend_file(tmp_path / "blend.yaml")
    with pytest.raises(TokenmillError, match="blend file not found"):
        load_blend_file(tmp_path / "other.yaml")
