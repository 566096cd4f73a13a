"""Token shards for the trainer tests, written directly in Megatron's .bin/.idx format.

A module of its own (not conftest.py) so that tests import it by a name no other test folder
uses: `from conftest import ...` finds whichever folder's conftest was imported first.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

EOD = 256


def write_shard(
    prefix: Path,
    documents: list[bytes] | list[np.ndarray],
    *,
    eod: int = EOD,
    vocab_size: int = EOD + 1,
    tokenizer: str | None = None,
) -> Path:
    """Documents (bytes: byte-level tokens 0..255; or token arrays) + EOD, in Megatron's
    .bin/.idx format (uint16), plus PREFIX.json as `tokenmill tokenize encode` writes it."""
    seqs = [
        np.frombuffer(d, dtype=np.uint8).astype(np.uint16) if isinstance(d, bytes) else d.astype(np.uint16)
        for d in documents
    ]
    seqs = [np.append(s, np.uint16(eod)) for s in seqs]
    lengths = np.array([len(s) for s in seqs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * 2)]).astype(np.int64)
    Path(f"{prefix}.bin").write_bytes(np.concatenate(seqs).tobytes())
    with open(f"{prefix}.idx", "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        handle.write(struct.pack("<Q", len(seqs)) + struct.pack("<Q", len(seqs) + 1))
        handle.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(seqs) + 1, dtype=np.int64).tobytes())
    meta = {"vocab_size": vocab_size, "eod_id": eod}
    if tokenizer:
        meta["tokenizer"] = {"path": tokenizer, "vocab_size": vocab_size}
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    return prefix


def text_documents(path: Path, max_bytes: int = 300_000) -> list[bytes]:
    text = path.read_bytes()[:max_bytes]
    return [d for d in text.split(b"\n\n") if d.strip()]
