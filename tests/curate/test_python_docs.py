"""The `python-docs` source: real prose from the running Python installation, deterministic."""

from __future__ import annotations

import json

from tokenmill.curate.python_docs import MIN_CHARS, build_corpus, iter_documents


def test_corpus_is_deterministic_and_has_every_kind(tmp_path):
    first = build_corpus(tmp_path / "a.jsonl", max_documents=40)
    second = build_corpus(tmp_path / "b.jsonl", max_documents=40)
    assert first["sha256"] == second["sha256"]
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert set(first["documents"]) == {"python-docs/topics", "python-docs/stdlib", "python-docs/packages"}
    assert all(0 < n <= 40 for n in first["documents"].values())
    docs = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids))  # ids are unique and stable: the ingest uses them
    assert all(len(d["text"].strip()) >= MIN_CHARS for d in docs)
    topic = next(d for d in docs if d["id"] == "topics/assert")
    assert "assert" in topic["text"] and topic["source"] == "python-docs/topics"


def test_licence_texts_are_natural_near_duplicates():
    licences = [
        d["text"] for d in iter_documents() if d["source"] == "python-docs/packages" and "LICEN" in d["id"].upper()
    ]
    mit = [t for t in licences if "Permission is hereby granted, free of charge" in t]
    assert len(mit) >= 3  # several MIT licences: the same text with different names and years
    assert len(set(mit)) >= 2
