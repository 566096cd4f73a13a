"""`tokenmill tokenize train-tokenizer | encode | inspect`."""

from __future__ import annotations

import argparse
import json
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    tokenize = subparsers.add_parser(
        "tokenize",
        help="train a tokenizer and encode documents into Megatron token shards",
        description="Train a byte-level BPE tokenizer on curated documents, encode documents into Megatron-compatible"
        " .bin/.idx token shards on Dask, and inspect a shard.",
    )
    commands = tokenize.add_subparsers(dest="tokenize_command", metavar="COMMAND")
    tokenize.set_defaults(func=lambda args: tokenize.print_help() or 2)

    train = commands.add_parser(
        "train-tokenizer",
        help="train a byte-level BPE (GPT-2 style) on documents",
        description="Train a GPT-2 style byte-level BPE (Hugging Face `tokenizers`) on the documents' text and write"
        " tokenizer.json, with <|endoftext|> (id 0) and <|pad|> (id 1). Deterministic for the same documents"
        " and options; warns when the text is too small to reach --vocab-size.",
    )
    train.add_argument(
        "--input", required=True, nargs="+", help="a stage directory (its kept/ is read) or Parquet files / directories"
    )
    train.add_argument("--vocab-size", type=int, required=True, help="vocabulary size, special tokens included")
    train.add_argument("--output", required=True, help="the tokenizer.json to write")
    train.add_argument(
        "--sample-docs", type=int, default=None, help="train on this many documents (a deterministic sample by id hash)"
    )
    train.add_argument(
        "--min-frequency", type=int, default=2, help="smallest pair count that makes a merge (default 2)"
    )
    train.add_argument(
        "--no-progress", action="store_true", help="hide the progress bars (never drawn off a terminal anyway)"
    )
    train.set_defaults(func=_train_command)

    encode = commands.add_parser(
        "encode",
        help="encode documents into PREFIX.bin / PREFIX.idx / PREFIX.json (on Dask)",
        description="Encode documents with a tokenizer, one end-of-document token after each, into Megatron's indexed"
        " dataset (PREFIX.bin/.idx) plus PREFIX.json (tokenizer hash, vocab size, EOD id, counts)."
        " Partitions run in parallel on Dask; an interrupted run resumes from the partitions written.",
    )
    encode.add_argument(
        "--input", required=True, nargs="+", help="a stage directory (its kept/ is read) or Parquet files / directories"
    )
    encode.add_argument("--tokenizer", required=True, help="a tokenizer.json (ours or any Hugging Face one)")
    encode.add_argument("--output-prefix", required=True, help="writes PREFIX.bin, PREFIX.idx and PREFIX.json")
    encode.add_argument(
        "--eod-token",
        default=None,
        help="end-of-document token (default: the first of <|endoftext|>, </s>, ... present)",
    )
    encode.add_argument(
        "--scheduler",
        default=None,
        help="address of an existing Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, else a LocalCluster)",
    )
    encode.add_argument(
        "--workers", type=int, default=None, help="LocalCluster worker processes (default: one per core)"
    )
    encode.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    encode.set_defaults(func=_encode_command)

    inspect = commands.add_parser(
        "inspect",
        help="counts of a token shard and its first documents decoded; --verify checks its checksums",
        description="Print a shard's document and token counts, its metadata, and its first documents decoded."
        " Opening a shard checks its index against the .bin (lengths, pointers, document indices); --verify also"
        " hashes PREFIX.bin and PREFIX.idx and compares them with the xxh64 checksums PREFIX.json recorded at"
        " encode time (exit status 1 when a file differs).",
    )
    inspect.add_argument("prefix", help="shard prefix (PREFIX.bin / PREFIX.idx)")
    inspect.add_argument(
        "--tokenizer", default=None, help="decode documents with this tokenizer (default: the one in PREFIX.json)"
    )
    inspect.add_argument("--docs", type=int, default=2, help="documents to show (default 2)")
    inspect.add_argument("--chars", type=int, default=200, help="characters shown per document (default 200)")
    inspect.add_argument(
        "--verify",
        action="store_true",
        help="hash PREFIX.bin and PREFIX.idx and compare with PREFIX.json's checksums; print OK or the file that differs",
    )
    inspect.set_defaults(func=_inspect_command)


def _input(args: argparse.Namespace):
    return args.input[0] if len(args.input) == 1 else list(args.input)


def _train_command(args: argparse.Namespace) -> int:
    from tokenmill.tokenize.tokenizer import eod_id, load_tokenizer, pad_id, train_tokenizer, vocab_size

    path = train_tokenizer(
        _input(args),
        args.vocab_size,
        args.output,
        sample_docs=args.sample_docs,
        min_frequency=args.min_frequency,
        progress=not args.no_progress,
    )
    tokenizer = load_tokenizer(path)
    log.info(
        f"tokenizer: vocab {vocab_size(tokenizer)}, eod id {eod_id(tokenizer)}, pad id {pad_id(tokenizer)} -> {path}"
    )
    return 0


def _encode_command(args: argparse.Namespace) -> int:
    from tokenmill.tokenize.encode import encode_documents

    meta = encode_documents(
        _input(args),
        args.tokenizer,
        args.output_prefix,
        scheduler=args.scheduler,
        workers=args.workers,
        progress=not args.no_progress,
        eod_token=args.eod_token,
    )
    seconds = meta["timings"]["seconds"]
    log.info(
        f"encode: {meta['documents']} documents, {meta['tokens']} tokens ({meta['dtype']}) in {seconds:.1f}s"
        f" ({meta['tokens'] / max(seconds, 1e-9):,.0f} tokens/s) -> {meta['prefix']}.bin/.idx/.json"
    )
    if meta["partitions"]["resumed"]:
        log.info(f"  resumed {meta['partitions']['resumed']} of {meta['partitions']['total']} partitions")
    for reason, n in sorted(meta["counts"]["rejected"].items(), key=lambda item: -item[1]):
        log.info(f"  rejected {reason}: {n}")
    return 0


def _inspect_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tokenmill.tokenize.indexed import IndexedDataset, cached_shard
    from tokenmill.tokenize.tokenizer import load_tokenizer

    prefix = cached_shard(args.prefix)  # a shard on object storage is read from the cache
    dataset = IndexedDataset(prefix)  # refuses an index that does not describe the .bin
    if args.verify:
        from tokenmill.tokenize.encode import verify_shard

        checksums = verify_shard(prefix)
        print(
            f"{args.prefix}: OK ({len(dataset)} documents, {dataset.num_tokens} tokens; xxh64 .bin {checksums['bin']},"
            f" .idx {checksums['idx']} as recorded in {Path(str(args.prefix)).name}.json)"
        )
        return 0
    meta_path = Path(f"{prefix}.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    print(f"{args.prefix}: {len(dataset)} documents, {dataset.num_tokens} tokens, dtype {dataset.dtype}")
    if meta:
        print(
            f"  tokenizer {meta['tokenizer']['path']} (sha256 {meta['tokenizer']['hash'][:12]}), vocab {meta['vocab_size']}, eod {meta['eod_id']}"
        )
    tokenizer_path = args.tokenizer or meta.get("tokenizer", {}).get("path")
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None
    for i in range(min(args.docs, len(dataset))):
        ids = dataset[i].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False) if tokenizer else " ".join(map(str, ids))
        if len(text) > args.chars:
            # Head and tail, so the end-of-document token shows.
            half = args.chars // 2
            text = f"{text[:half]} ... {text[-half:]}"
        print(f"  [{i}] {len(ids)} tokens: {text!r}")
    return 0
