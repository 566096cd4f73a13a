"""Test shards written the way `tokenize encode` writes them: every document at once
(`IndexedDatasetWriter.add_documents`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tokenmill.tokenize.indexed import IndexedDatasetWriter


def add_each(writer: IndexedDatasetWriter, docs: Iterable[Sequence[int] | np.ndarray]) -> None:
    """Append each of `docs` (token ids) as one document."""
    arrays = [np.asarray(doc) for doc in docs]
    flat = np.concatenate(arrays) if arrays else np.array([], dtype=writer.dtype)
    writer.add_documents(flat, np.array([len(a) for a in arrays], dtype=np.int32))
