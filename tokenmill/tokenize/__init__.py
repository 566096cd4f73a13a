"""Tokenize: documents -> byte-level BPE -> Megatron token shards -> training samples.

- `tokenizer`: train a GPT-2 style byte-level BPE; load any Hugging Face tokenizer.json.
- `indexed`: Megatron's `.bin`/`.idx` writer and zero-copy reader.
- `encode`: documents to a shard on Dask, resumable.
- `gpt_dataset`, `blend`: Megatron-Core's sample and blending indices, cached as `.npy`.
- `loader`: `build_dataset` and the data-parallel, resumable `SampleStream` the trainer reads.
"""

# Megatron's default train/valid/test split ratios of a shard's documents; here, without numpy,
# for the training config to read.
DEFAULT_SPLIT = "969,30,1"
