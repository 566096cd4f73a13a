"""Bits per byte of held-out text, defined as lm-evaluation-harness defines it for WikiText:
the documents' total negative loglikelihood in nats (each document scored whole, in windows of
the model's length, after the EOD/BOS token the model was trained to start documents after)
divided by ln 2 and by the documents' UTF-8 bytes; with byte_perplexity = exp(nll / bytes) and
word_perplexity = exp(nll / words), words as the harness counts them (`re.split(r"\\s+", doc)`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.errors import TokenmillError
from tokenmill.eval.tasks.base import read_jsonl

if TYPE_CHECKING:
    from tokenmill.eval.models import TokenLM


def read_documents(path: str | Path) -> list[str]:
    """A held-out text: a `.jsonl` file (one document a line, its `text`), a document directory
    (Parquet with a `text` column), or any other file as one document."""
    path = Path(path)
    if not path.exists():
        raise TokenmillError(f"--bpb: {path} does not exist")
    if path.is_dir():
        return _read_document_dir(path)
    if path.suffix == ".jsonl":
        documents = []
        for where, row in read_jsonl(path):
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise TokenmillError(f"{where}: no string field `text`")
            documents.append(row["text"])
    else:
        try:
            documents = [path.read_text(encoding="utf-8")]
        except UnicodeDecodeError as error:
            raise TokenmillError(f"{path}: not UTF-8 text (byte {error.start})") from error
    documents = [d for d in documents if d]
    if not documents:
        raise TokenmillError(f"--bpb: {path} holds no text")
    return documents


def _read_document_dir(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    from tokenmill.infra.document_dirs import resolve_input_files

    documents: list[str] = []
    for file in resolve_input_files(path):
        table = pq.read_table(file, columns=["text"]) if "text" in pq.read_schema(file).names else None
        if table is None:
            raise TokenmillError(f"{file}: no `text` column")
        documents.extend(t for t in table.column("text").to_pylist() if t)
    return documents


def count_words(document: str) -> int:
    return len(re.split(r"\s+", document))


def bits_per_byte(model: TokenLM, documents: list[str], batch_size: int = 16, progress: bool = True) -> dict[str, Any]:
    """nll (nats), bytes, words and the three measures over all documents."""
    loglikelihoods = model.loglikelihood_rolling(documents, batch_size=batch_size, progress=progress, desc="bpb")
    nll = -sum(loglikelihoods)
    n_bytes = sum(len(d.encode("utf-8")) for d in documents)
    words = sum(count_words(d) for d in documents)
    return {
        "nll": nll,
        "bytes": n_bytes,
        "words": words,
        "documents": len(documents),
        "bits_per_byte": nll / n_bytes / math.log(2),
        "byte_perplexity": math.exp(nll / n_bytes),
        "word_perplexity": math.exp(nll / words),
    }


def bpb_rows(
    path: str | Path, documents: list[str], model: TokenLM, batch_size: int = 16, progress: bool = True
) -> list[dict[str, Any]]:
    """The result rows of `tokenmill eval --bpb PATH` (its documents read by `read_documents`)."""
    measured = bits_per_byte(model, documents, batch_size, progress)
    common = {
        "task": f"bpb:{Path(path).name}",
        "shots": 0,
        "n": measured["documents"],
        "stderr": None,
        "model": model.name,
        "data_files": [str(path)],
        "nll": measured["nll"],
        "bytes": measured["bytes"],
        "words": measured["words"],
    }
    return [
        {**common, "metric": metric, "value": measured[metric]}
        for metric in ("bits_per_byte", "byte_perplexity", "word_perplexity")
    ]
