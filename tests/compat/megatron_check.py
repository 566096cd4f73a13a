"""Run inside the Megatron-Core virtual environment (not tokenmill's): read our shards with
Megatron's own `IndexedDataset`, build Megatron's `GPTDataset` / `BlendedDataset` indices for a
spec, and write what Megatron produced to an .npz for the test to compare with tokenmill.

Usage: python megatron_check.py SPEC.json OUT_DIR
SPEC: {"prefixes": [...], "weights": [...] | null, "seq_len": L, "sizes": [train, valid, test],
       "seed": S, "split": "969,30,1", "docs_to_read": [..]}
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import numpy  # noqa: E402
import torch  # noqa: E402
from megatron.core.datasets.blended_dataset import BlendedDataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa: E402


class StubTokenizer:
    """GPTDataset needs only these attributes of a tokenizer when the data is pre-tokenized."""

    def __init__(self, vocab_size: int, eod: int, pad: int) -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = pad
        # Megatron folds this into the cache key of every dataset it builds.
        self.unique_identifiers = {"class": "StubTokenizer", "vocab_size": vocab_size, "eod": eod, "pad": pad}


def write_grouped(dataset: IndexedDataset, prefix: str) -> None:
    """The dataset's sequences, in order, in documents of 0, 1, 2, 3, 0, 1, ... sequences."""
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.dtype(dataset.index.dtype).type)
    position, group = 0, 0
    while position < len(dataset):
        members = range(position, min(position + group % 4, len(dataset)))
        tokens = [numpy.array(dataset[i], dtype=numpy.int64) for i in members]
        flat = numpy.concatenate(tokens) if tokens else numpy.zeros(0, dtype=numpy.int64)
        builder.add_document(torch.from_numpy(flat), [len(t) for t in tokens])
        position, group = position + len(tokens), group + 1
    builder.finalize(prefix + ".idx")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, numpy.ndarray] = {}

    # (a) Megatron reads our .bin/.idx.
    for n, prefix in enumerate(spec["prefixes"]):
        dataset = IndexedDataset(prefix)
        results[f"reader{n}_sequence_lengths"] = numpy.array(dataset.sequence_lengths)
        results[f"reader{n}_document_indices"] = numpy.array(dataset.document_indices)
        results[f"reader{n}_dtype"] = numpy.array(str(numpy.dtype(dataset.index.dtype)))
        for doc in spec["docs_to_read"]:
            results[f"reader{n}_doc{doc}"] = numpy.array(dataset[doc])
            results[f"reader{n}_doc{doc}_slice"] = numpy.array(dataset.get(doc, offset=1, length=3))
        # Megatron's own writer, fed the documents it just read: its files should equal ours.
        copy_prefix = str(out / f"megatron_copy{n}")
        builder = IndexedDatasetBuilder(copy_prefix + ".bin", dtype=numpy.dtype(dataset.index.dtype).type)
        for i in range(len(dataset)):
            builder.add_document(torch.from_numpy(numpy.array(dataset[i], dtype=numpy.int64)), [len(dataset[i])])
        builder.finalize(copy_prefix + ".idx")
        # Megatron's writer with several sequences per document and documents without any
        # (repeated document indices), as its preprocessing writes them: tokenmill must read these.
        grouped_prefix = str(out / f"megatron_grouped{n}")
        write_grouped(dataset, grouped_prefix)
        grouped = IndexedDataset(grouped_prefix)  # held: its arrays are views of its memory map
        results[f"grouped{n}_document_indices"] = numpy.array(grouped.document_indices)
        del grouped

    # (b) Megatron builds the sample indices. Older releases (0.16, the newest for Python 3.11)
    # ask torch.distributed for the rank while building: one process is a world of one.
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=f"file://{out / 'pg'}", rank=0, world_size=1)
    config = GPTDatasetConfig(
        random_seed=spec["seed"],
        sequence_length=spec["seq_len"],
        blend=(spec["prefixes"], spec["weights"]),
        split=spec["split"],
        path_to_cache=str(out / "cache"),
        tokenizer=StubTokenizer(spec["vocab_size"], spec["eod"], spec["pad"]),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, spec["sizes"], lambda: True, config).build()
    for split_name, dataset in zip(("train", "valid", "test"), datasets):
        if dataset is None:
            continue
        if isinstance(dataset, BlendedDataset):
            results[f"{split_name}_dataset_index"] = numpy.array(dataset.dataset_index)
            results[f"{split_name}_dataset_sample_index"] = numpy.array(dataset.dataset_sample_index)
            parts = dataset.datasets
        else:
            parts = [dataset]
        for n, part in enumerate(parts):
            results[f"{split_name}{n}_document_index"] = numpy.array(part.document_index)
            results[f"{split_name}{n}_sample_index"] = numpy.array(part.sample_index)
            results[f"{split_name}{n}_shuffle_index"] = numpy.array(part.shuffle_index)
        # The first samples' tokens as Megatron's __getitem__ assembles them.
        count = min(len(dataset), spec.get("samples_to_read", 16))
        results[f"{split_name}_samples"] = numpy.stack(
            [numpy.concatenate([dataset[i]["tokens"][:1].numpy(), dataset[i]["labels"].numpy()]) for i in range(count)]
        )
    numpy.savez(out / "megatron.npz", **results)
    print(f"megatron-core wrote {len(results)} arrays to {out / 'megatron.npz'}")


if __name__ == "__main__":
    main()
