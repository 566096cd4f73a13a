"""Fixtures for the trainer tests: real-text token shards (Megatron format), one thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shard_files import text_documents, write_shard

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shakespeare_shard(tmp_path_factory, shared_data) -> Path:
    root = tmp_path_factory.mktemp("shard")
    return write_shard(root / "shakespeare", text_documents(shared_data / "corpus" / "tinyshakespeare.txt"))


@pytest.fixture(scope="session")
def wikitext_text(shared_data) -> str:
    return (shared_data / "corpus" / "wikitext2_valid.txt").read_text()[:20_000]
