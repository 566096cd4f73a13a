"""Train a byte-level BPE tokenizer (GPT-2 style) on documents, and load any HF tokenizer.json."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import xxhash

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import check_document_columns, input_list, resolve_input_files
from tokenmill.infra.outputs import OutputKind, claim_output
from tokenmill.tokenize.special import EOD_TOKEN, PAD_TOKEN, eod_id, pad_id  # noqa: F401  (re-exported)

# 256 byte symbols plus the two special tokens.
MIN_VOCAB_SIZE = 256 + 2
# A longer document is pre-tokenized in pieces of about this many characters: `tokenizers`
# holds some hundred bytes per character of one text while it splits and encodes it (a 50 MB
# document took 5 GB to train on and 6.6 GB to encode), a piece bounds that.
PIECE_CHARS = 1 << 20
# Where a piece may end: before a space or newline that follows a non-space. No pre-token of the
# GPT-2 byte-level regex spans that point (whitespace only leads a pre-token or makes a run of
# its own), so the pieces give the pre-tokens, hence the ids and the trained merges, of the whole
# text. Python's \S is narrower than the regex's (it also counts \x1c-\x1f as space), so every
# point it finds is one.
_PIECE_END = re.compile(r"(?<=\S)[ \n]")

# What `tokenize train-tokenizer --output` may replace: an earlier tokenizer, with its
# TOKENIZER.meta.json beside it.
TOKENIZER_OUTPUT = OutputKind("a tokenizer", ("{name}.meta.json",), layout="file")

log = logging.getLogger(__name__)


@dataclass
class TokenizerTrainConfig:
    vocab_size: int
    sample_docs: int | None = None
    min_frequency: int = 2
    eod_token: str = EOD_TOKEN
    pad_token: str = PAD_TOKEN


def text_pieces(text: str, piece_chars: int | None = None) -> list[str]:
    """`text` cut into pieces of at least `piece_chars` (default `PIECE_CHARS`) characters at
    points no pre-token spans (see `_PIECE_END`); a text without such a point stays whole."""
    piece_chars = piece_chars or PIECE_CHARS
    if len(text) <= piece_chars:
        return [text]
    pieces = []
    start = 0
    while len(text) - start > piece_chars:
        match = _PIECE_END.search(text, start + piece_chars)
        if match is None:
            break
        pieces.append(text[start : match.start()])
        start = match.start()
    pieces.append(text[start:])
    return pieces


def splits_safely(tokenizer) -> bool:
    """Whether `text_pieces` gives this tokenizer the ids of the whole text: a byte-level BPE
    with the GPT-2 regex, no normalizer, no prefix space, and added tokens that neither hold nor
    strip whitespace (ours, GPT-2's). Any other tokenizer encodes each document whole."""
    from tokenizers import pre_tokenizers

    pre = tokenizer.pre_tokenizer
    if tokenizer.normalizer is not None or not isinstance(pre, pre_tokenizers.ByteLevel):
        return False
    if not pre.use_regex or pre.add_prefix_space:
        return False
    return not any(
        token.lstrip or token.rstrip or any(c.isspace() for c in token.content)
        for token in tokenizer.get_added_tokens_decoder().values()
    )


def _iter_texts(files: list[Path], wanted_ids: set[str] | None, batch_rows: int = 10_000) -> Iterator[list[str]]:
    for path in files:
        parquet_file = storage.parquet_file(path)
        check_document_columns(parquet_file.schema_arrow.names, path)
        for batch in parquet_file.iter_batches(batch_size=batch_rows, columns=["id", "text"]):
            ids = batch.column("id").to_pylist()
            texts = batch.column("text").to_pylist()
            yield [
                t
                for i, t in zip(ids, texts)
                if isinstance(t, str) and t and (wanted_ids is None or str(i) in wanted_ids)
            ]


def _sample_ids(files: list[Path], sample_docs: int) -> set[str]:
    """The `sample_docs` ids with the smallest xxhash: a sample that does not depend on the
    order or the number of input files, so training on it is reproducible."""
    keyed: list[tuple[int, str]] = []
    for path in files:
        ids = storage.parquet_file(path).read(columns=["id"]).column("id").to_pylist()
        keyed.extend((xxhash.xxh64_intdigest(str(i).encode()), str(i)) for i in ids)
    keyed.sort()
    return {i for _, i in keyed[:sample_docs]}


def train_tokenizer(
    input: str | Path | list,
    vocab_size: int,
    output_path: str | Path,
    *,
    sample_docs: int | None = None,
    min_frequency: int = 2,
    eod_token: str = EOD_TOKEN,
    pad_token: str = PAD_TOKEN,
    progress: bool = False,
) -> Path | str:
    """Train a GPT-2 style byte-level BPE on the documents' text and write `tokenizer.json`.

    The end-of-document token gets id 0 and the padding token id 1 (they are the trainer's
    first special tokens). Training is deterministic for the same documents and options.
    `progress` draws `tokenizers`' bars only when stdout and stderr are terminals: its Rust
    trainer ends each phase with a newline on stdout, which would reach a pipe or a log.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < MIN_VOCAB_SIZE:
        raise TokenmillError(
            f"--vocab-size {vocab_size} is too small: a byte-level BPE needs at least {MIN_VOCAB_SIZE}"
        )
    if sample_docs is not None and sample_docs < 1:
        raise TokenmillError(f"--sample-docs must be at least 1, got {sample_docs}")
    # Refused before training: an output that is not an earlier tokenizer (a directory, a
    # user's file), one among the inputs, or one another process is writing.
    with claim_output(output_path, TOKENIZER_OUTPUT, flag="--output", inputs=input_list(input)):
        files = resolve_input_files(input)
        wanted = _sample_ids(files, sample_docs) if sample_docs else None

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[eod_token, pad_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=progress and sys.stdout.isatty() and sys.stderr.isatty(),
        )
        seen = 0

        def texts() -> Iterator[list[str]]:
            nonlocal seen
            for batch in _iter_texts(files, wanted):
                seen += len(batch)
                # This tokenizer splits safely: the same words are counted, in bounded memory.
                yield [piece for text in batch for piece in text_pieces(text)]

        tokenizer.train_from_iterator(texts(), trainer=trainer)
        if seen == 0:
            raise TokenmillError(f"no non-empty text in {input}: nothing to train a tokenizer on")
        learned = tokenizer.get_vocab_size(with_added_tokens=True)
        if learned < vocab_size:
            # BPE stops when no pair occurs `min_frequency` times: the text is too small for the size asked.
            log.warning(
                "the tokenizer has %d tokens, not the %d requested: %d documents hold no more pairs that occur at least"
                " %d times; give it more text or ask for a smaller --vocab-size",
                learned,
                vocab_size,
                seen,
                min_frequency,
            )
        # The config travels with the tokenizer so a run can say how it was made.
        meta = {
            **asdict(TokenizerTrainConfig(vocab_size, sample_docs, min_frequency, eod_token, pad_token)),
            "documents": seen,
        }
        # The meta first: the tokenizer file beside it marks a finished one (on object storage, which
        # has no rename, as on disk).
        storage.write_text(f"{output_path}.meta.json", json.dumps(meta, indent=2) + "\n")
        storage.write_text(output_path, tokenizer.to_str(pretty=True))
        return output_path


def local_tokenizer_path(path: str | Path) -> Path:
    """The tokenizer file on local disk: a URL (to the file, or to a directory holding
    tokenizer.json) is downloaded to the cache once."""
    location = storage.Location(path)
    if location.is_local:
        return Path(path)
    url = location.path
    if not url.endswith(".json") and storage.isdir(url):
        url = f"{url}/tokenizer.json"
    if not storage.isfile(url):
        raise TokenmillError(f"tokenizer not found: {url}")
    return storage.cached_file(url)


def load_tokenizer(path: str | Path):
    """Load a Hugging Face `tokenizer.json` (ours or any published one)."""
    from tokenizers import Tokenizer

    path = local_tokenizer_path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenmillError(f"tokenizer not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a generic Exception for a bad file
        raise TokenmillError(f"cannot load tokenizer {path}: {error}") from None


def vocab_size(tokenizer) -> int:
    """Size of the id space, added tokens included (the largest id + 1)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max(len(vocab), max(vocab.values(), default=-1) + 1)


def tokenizer_hash(path: str | Path) -> str:
    """sha256 of the tokenizer file: shards record it so a mismatched tokenizer is caught."""
    path = local_tokenizer_path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenmillError(f"tokenizer not found: {path}")
    return hashlib.sha256(path.read_bytes()).hexdigest()
