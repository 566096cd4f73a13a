"""Small real data made from this repository's own text, for runs on a machine where only the
working tree travels (../shared/data does not reach the GPU machine).

The corpus is the project's documentation and Python sources (about 1 MB of English prose and
code). From it: a byte-level BPE (1,024 tokens, trained with `tokenizers`), a token shard in the
layout `tokenmill tokenize encode` writes (Megatron .bin/.idx + PREFIX.json naming the
tokenizer), and a LAMBADA-format task file (`lambada_openai_test.jsonl`: documentation
paragraphs whose last word is the target), so that `tokenmill eval --data-dir` reads it as it
reads the real benchmark file.

    python tests/gpu/repo_data.py OUTDIR      # writes OUTDIR/{tokenizer.json, shard.*, eval/}
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
VOCAB = 1024
EOD_TOKEN = "<|endoftext|>"


def corpus_documents() -> list[str]:
    """The repository's Markdown pages and Python files, one document per file, sorted by path
    so that every machine builds the same corpus."""
    paths = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "tokenmill").rglob("*.py")])
    return [text for p in paths if (text := p.read_text(encoding="utf-8")).strip()]


def train_tokenizer(documents: list[str], out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOD_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(documents, trainer)
    tok.save(str(out))
    return out


def write_shard(prefix: Path, documents: list[str], tokenizer: Path) -> Path:
    """Documents + EOD in Megatron's .bin/.idx (uint16, tokenmill's own writer), PREFIX.json as
    `tokenize encode` writes it."""
    from tokenizers import Tokenizer

    from tokenmill.tokenize.indexed import IndexedDatasetWriter

    tok = Tokenizer.from_file(str(tokenizer))
    eod = tok.token_to_id(EOD_TOKEN)
    writer = IndexedDatasetWriter(prefix, np.uint16)
    docs = [[*encoding.ids, eod] for encoding in tok.encode_batch(documents)]
    writer.add_documents(np.concatenate(docs), np.array([len(doc) for doc in docs], dtype=np.int32))
    writer.finalize()
    vocab = tok.get_vocab_size()
    meta = {"vocab_size": vocab, "eod_id": eod, "tokenizer": {"path": str(tokenizer), "vocab_size": vocab}}
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    return prefix


def write_lambada(out: Path, limit: int = 200) -> Path:
    """Documentation paragraphs of 30-120 words ending in a plain word (final period dropped), LAMBADA's shape."""
    rows = []
    for page in sorted((REPO / "docs").glob("*.md")):
        for para in page.read_text(encoding="utf-8").split("\n\n"):
            text = " ".join(para.split()).rstrip(".:")
            words = text.split(" ")
            if 30 <= len(words) <= 120 and re.fullmatch(r"[A-Za-z]+", words[-1]) and not text.startswith(("|", "#")):
                rows.append({"text": text})
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lambada_openai_test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:limit]))
    return path


def build(out: Path) -> dict[str, Path]:
    """Tokenizer, shard and eval folder under `out` (kept if already there)."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "shard"
    if not Path(f"{prefix}.json").exists():
        documents = corpus_documents()
        tokenizer = train_tokenizer(documents, out / "tokenizer.json")
        write_shard(prefix, documents, tokenizer)
        write_lambada(out / "eval")
    return {"shard": prefix, "eval": out / "eval", "tokenizer": out / "tokenizer.json"}


if __name__ == "__main__":
    for name, path in build(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
