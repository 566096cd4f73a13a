"""Megatron-Core reads our shards and builds the same samples.

Runs `megatron_check.py` with the Python of a separate virtual environment that has
`megatron-core` (default `.venv-megatron/` at the repository root, or $TOKENMILL_MEGATRON_PYTHON);
skipped when that environment is absent. Checks that:
(a) Megatron's `IndexedDataset` reads our .bin/.idx and returns the same tokens, and Megatron's
    own `IndexedDatasetBuilder`, fed those documents, writes byte-identical files;
(b) for the same shard, seed, sequence length, sample counts and blend weights, Megatron's
    `GPTDataset` / `BlendedDataset` indices (and samples) equal ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MEGATRON_PYTHON = Path(os.environ.get("TOKENMILL_MEGATRON_PYTHON", REPO_ROOT / ".venv-megatron" / "bin" / "python"))

sys.path.insert(0, str(REPO_ROOT / "tests" / "tokenize"))
from tokenize_corpus import write_corpus  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not MEGATRON_PYTHON.exists(), reason=f"no Megatron-Core environment at {MEGATRON_PYTHON}"),
]

SEQ_LEN = 64
SEED = 1234
SPLIT = "969,30,1"


@pytest.fixture(scope="module")
def shards(shared_data, tmp_path_factory):
    from tokenmill.tokenize.encode import encode_documents
    from tokenmill.tokenize.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("compat")
    wiki = write_corpus(shared_data / "corpus" / "wikitext2_valid.txt", root / "wiki_docs", unit="paragraph", limit=900)
    shakes = write_corpus(
        shared_data / "corpus" / "tinyshakespeare.txt", root / "shakes_docs", unit="paragraph", limit=1500
    )
    tokenizer = train_tokenizer([wiki, shakes], 1500, root / "tokenizer.json")
    prefixes = []
    for name, docs in (("wiki", wiki), ("shakes", shakes)):
        encode_documents(docs, tokenizer, root / name, workers=1, progress=False)
        prefixes.append(str(root / name))
    return root, prefixes


def _run_megatron(root: Path, name: str, spec: dict) -> dict[str, np.ndarray]:
    spec_path = root / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    out = root / f"megatron_{name}"
    result = subprocess.run(
        [str(MEGATRON_PYTHON), str(Path(__file__).with_name("megatron_check.py")), str(spec_path), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with np.load(out / "megatron.npz") as data:
        return {key: data[key] for key in data.files} | {"_out": out}


def _spec(prefixes, weights, sizes):
    return {
        "prefixes": prefixes,
        "weights": weights,
        "seq_len": SEQ_LEN,
        "sizes": sizes,
        "seed": SEED,
        "split": SPLIT,
        "vocab_size": 1500,
        "eod": 0,
        "pad": 1,
        "docs_to_read": [0, 1, 57],
        "samples_to_read": 24,
    }


def test_megatron_reads_our_shards_and_builds_the_same_gpt_indices(shards):
    from tokenmill.tokenize.gpt_dataset import GPTDataset
    from tokenmill.tokenize.indexed import IndexedDataset

    root, prefixes = shards
    prefix = prefixes[0]
    # Sample counts that take the train split over 2.3 epochs (a separate last epoch), the valid
    # split over 1.9 (a mixed last epoch) and the test split under one.
    lengths = IndexedDataset(prefix).sequence_lengths
    n = len(lengths)
    bounds = [0, round(0.969 * n), round(0.999 * n), n]
    per_epoch = [int(lengths[bounds[i] : bounds[i + 1]].sum()) // SEQ_LEN for i in range(3)]
    sizes = [int(2.3 * per_epoch[0]), int(1.9 * per_epoch[1]), max(1, per_epoch[2] // 2)]
    got = _run_megatron(root, "single", _spec([prefix], None, sizes))

    ours = IndexedDataset(prefix)
    np.testing.assert_array_equal(got["reader0_sequence_lengths"], ours.sequence_lengths)
    np.testing.assert_array_equal(got["reader0_document_indices"], ours.document_indices)
    assert str(got["reader0_dtype"]) == "uint16"
    for doc in (0, 1, 57):
        np.testing.assert_array_equal(got[f"reader0_doc{doc}"], ours[doc])
        np.testing.assert_array_equal(got[f"reader0_doc{doc}_slice"], ours.get(doc, 1, 3))
    for ext in (".bin", ".idx"):
        assert Path(f"{got['_out']}/megatron_copy0{ext}").read_bytes() == Path(prefix + ext).read_bytes()
    # A shard Megatron wrote with several sequences per document and empty documents passes
    # tokenmill's index checks, and reads the same sequences.
    grouped = IndexedDataset(f"{got['_out']}/megatron_grouped0")
    np.testing.assert_array_equal(grouped.document_indices, got["grouped0_document_indices"])
    assert len(grouped.document_indices) < n + 1 and (np.diff(grouped.document_indices) == 0).any()
    np.testing.assert_array_equal(grouped.sequence_lengths, ours.sequence_lengths)
    for doc in (0, 1, 57):
        np.testing.assert_array_equal(grouped[doc], ours[doc])

    for split, size in zip(("train", "valid", "test"), sizes):
        dataset = GPTDataset(prefix, seq_len=SEQ_LEN, num_samples=size, seed=SEED, split=split, split_ratios=SPLIT)
        epochs = len(dataset.document_index) // (dataset.document_range[1] - dataset.document_range[0])
        assert epochs == {"train": 3, "valid": 2, "test": 1}[split]
        np.testing.assert_array_equal(got[f"{split}0_document_index"], dataset.document_index)
        np.testing.assert_array_equal(got[f"{split}0_sample_index"], dataset.sample_index)
        np.testing.assert_array_equal(got[f"{split}0_shuffle_index"], dataset.shuffle_index)
        for name in ("document_index", "sample_index", "shuffle_index"):  # bit-identical: dtypes too
            assert got[f"{split}0_{name}"].dtype == getattr(dataset, name).dtype, (split, name)
        samples = got[f"{split}_samples"]
        np.testing.assert_array_equal(samples, np.stack([dataset[i] for i in range(len(samples))]))


def test_megatron_blends_the_same_way(shards):
    from tokenmill.tokenize.loader import build_dataset

    root, prefixes = shards
    weights = [0.7, 0.3]
    sizes = [700, 40, 10]
    got = _run_megatron(root, "blend", _spec(prefixes, weights, sizes))
    for split, size in zip(("train", "valid", "test"), sizes):
        blend = build_dataset(
            [{"prefix": p, "weight": w} for p, w in zip(prefixes, weights)],
            seq_len=SEQ_LEN,
            num_samples=size,
            seed=SEED,
            split=split,
            split_ratios=SPLIT,
        )
        np.testing.assert_array_equal(got[f"{split}_dataset_index"], blend.dataset_index)
        np.testing.assert_array_equal(got[f"{split}_dataset_sample_index"], blend.dataset_sample_index)
        for n, dataset in enumerate(blend.datasets):
            np.testing.assert_array_equal(got[f"{split}{n}_document_index"], dataset.document_index)
            np.testing.assert_array_equal(got[f"{split}{n}_sample_index"], dataset.sample_index)
            np.testing.assert_array_equal(got[f"{split}{n}_shuffle_index"], dataset.shuffle_index)
        samples = got[f"{split}_samples"]
        np.testing.assert_array_equal(samples, np.stack([blend[i] for i in range(len(samples))]))
