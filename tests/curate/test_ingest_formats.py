"""Ingest as a user types it: a directory of mixed files read by extension, Latin-1 text, ids."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tokenmill.infra.document_dirs import read_manifest


def tokenmill(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args, "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def ingest(inputs: Path | list[Path], output: Path, *options: str) -> subprocess.CompletedProcess:
    """`tokenmill curate ingest` of `inputs` into `output`, in a process of its own."""
    paths = inputs if isinstance(inputs, list) else [inputs]
    return tokenmill("curate", "ingest", "--input", *map(str, paths), *options, "--output", str(output))


def read_dir(path: Path) -> pd.DataFrame:
    files = sorted(path.glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def jsonl(*records: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_directory_of_mixed_files_is_read_file_by_file(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "more").mkdir(parents=True)
    (corpus / "a.jsonl").write_bytes(jsonl({"text": "alpha one"}, {"text": "alpha two"}) + b'{"text": broken\n')
    (corpus / "b.json").write_bytes(jsonl({"text": "bravo"}))
    (corpus / "c.jsonl.gz").write_bytes(gzip.compress(jsonl({"text": "charlie one"}, {"text": "charlie two"})))
    (corpus / "more" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl({"text": "delta"})))
    pq.write_table(pa.table({"text": ["echo one", "echo two", "echo three"]}), corpus / "e.parquet")
    (corpus / "f.txt").write_text("A plain text file, one document.\n")
    (corpus / "g.txt.gz").write_bytes(gzip.compress(b"A compressed text file.\n"))
    (corpus / "h.csv").write_text("text\nnot read as csv\n")
    (corpus / "i.bin").write_bytes(b"\x00\x01\x02")
    (corpus / ".hidden.jsonl").write_bytes(jsonl({"text": "never read"}))

    done = ingest(corpus, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "ingest: in 14, kept 11, rejected 3" in done.stderr
    counts = read_manifest(tmp_path / "out")["counts"]
    assert counts == {"in": 14, "kept": 11, "rejected": {"invalid_json": 1, "unknown_format": 2}}

    kept = read_dir(tmp_path / "out" / "kept")
    assert sorted(kept["text"].str.strip()) == sorted(
        [
            "alpha one",
            "alpha two",
            "bravo",
            "charlie one",
            "charlie two",
            "delta",
            "echo one",
            "echo two",
            "echo three",
            "A plain text file, one document.",
            "A compressed text file.",
        ]
    )
    assert kept["id"].is_unique and set(kept["source"]) == {"corpus"}
    by_text = dict(zip(kept["text"].str.strip(), kept["id"]))
    assert by_text["alpha two"] == "corpus:a.jsonl:22"
    assert by_text["delta"] == "corpus:more/d.jsonl.zst:0"
    assert by_text["echo three"] == "corpus:e.parquet:2"
    assert by_text["A plain text file, one document."] == "corpus:f.txt"

    rejected = read_dir(tmp_path / "out" / "rejected")
    unknown = rejected[rejected["reason"] == "unknown_format"]
    assert sorted(unknown["id"]) == ["corpus:h.csv", "corpus:i.bin"]
    assert all(str(corpus / name) in raw for name, raw in zip(["h.csv", "i.bin"], sorted(unknown["raw"])))


def test_explicit_format_reads_every_file_of_a_directory(tmp_path):
    corpus = tmp_path / "logs"
    corpus.mkdir()
    (corpus / "one.log").write_bytes(jsonl({"text": "first"}))
    (corpus / "two.log").write_bytes(jsonl({"text": "second"}))
    done = ingest(corpus, tmp_path / "out", "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    kept = read_dir(tmp_path / "out" / "kept").sort_values("id")
    assert kept["id"].tolist() == ["logs:one.log:0", "logs:two.log:0"]
    assert kept["text"].tolist() == ["first", "second"]


def latin1_lines(shared_data: Path) -> list[str]:
    """Real WikiText-2 lines whose non-ASCII characters (£ é ü ° ½ ...) all exist in Latin-1."""
    lines = (shared_data / "corpus" / "wikitext2_valid.txt").read_text(encoding="utf-8").splitlines()
    chosen = [line.strip() for line in lines if not line.isascii() and all(ord(c) < 256 for c in line)]
    assert len(chosen) >= 30
    return chosen


def test_latin1_text_with_encoding_option(tmp_path, shared_data):
    lines = latin1_lines(shared_data)
    path = tmp_path / "latin1.txt"
    path.write_bytes("\n\n".join(lines).encode("latin-1"))

    # Read as UTF-8 (the default), the Latin-1 bytes are undecodable: counted rejections, not loss.
    done = ingest(path, tmp_path / "utf8", "--separator", r"\n\n")
    assert done.returncode == 0, done.stderr
    counts = read_manifest(tmp_path / "utf8")["counts"]
    assert counts["in"] == len(lines) and counts["kept"] == 0
    assert counts["rejected"] == {"invalid_utf8": len(lines)}

    done = ingest(path, tmp_path / "latin1", "--separator", r"\n\n", "--encoding", "latin-1")
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(tmp_path / "latin1")
    assert manifest["counts"] == {"in": len(lines), "kept": len(lines), "rejected": {}}
    assert manifest["config"]["encoding"] == "iso8859-1"
    kept = read_dir(tmp_path / "latin1" / "kept")
    assert sorted(kept["text"]) == sorted(lines)
    assert any("£" in text for text in kept["text"]) and any("é" in text for text in kept["text"])


def test_undecodable_bytes_are_rejected_or_replaced_and_counted(tmp_path, shared_data):
    lines = latin1_lines(shared_data)[:10]
    # 0x81 and 0x8d are undefined in Windows-1252: two lines carry one such byte each.
    data = [line.encode("cp1252") for line in lines]
    data[3] += b" \x81"
    data[7] = b"\x8d" + data[7]
    path = tmp_path / "cp1252.txt"
    path.write_bytes(b"\n".join(data))

    done = ingest(path, tmp_path / "reject", "--separator", r"\n", "--encoding", "cp1252")
    assert done.returncode == 0, done.stderr
    counts = read_manifest(tmp_path / "reject")["counts"]
    assert counts == {"in": 10, "kept": 8, "rejected": {"invalid_encoding": 2}}
    rejected = read_dir(tmp_path / "reject" / "rejected")
    assert any("\\x81" in raw for raw in rejected["raw"])

    done = ingest(
        path, tmp_path / "replace", "--separator", r"\n", "--encoding", "cp1252", "--encoding-errors", "replace"
    )
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(tmp_path / "replace")
    assert manifest["counts"] == {"in": 10, "kept": 10, "rejected": {}}
    assert manifest["stats"] == {"docs_with_replaced_bytes": 2, "replaced_bytes": 2}
    assert "replaced 2 undecodable bytes in 2 documents" in done.stderr
    kept = read_dir(tmp_path / "replace" / "kept")
    assert sum(text.count("\ufffd") for text in kept["text"]) == 2


def test_bad_encoding_options_are_one_line_errors(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("text")
    for encoding, message in (("no-such-codec", "unknown --encoding"), ("utf-16", "not ASCII-compatible")):
        done = ingest(path, tmp_path / "o", "--encoding", encoding)
        assert done.returncode == 1
        assert message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_ids_name_the_file_once_and_are_stable(tmp_path, shared_data):
    wiki = shared_data / "corpus" / "wikitext2_valid.txt"
    for run in ("first", "second"):
        done = ingest(wiki, tmp_path / run, "--separator", "^(?= = [^=])")
        assert done.returncode == 0, done.stderr
    first = read_dir(tmp_path / "first" / "kept").sort_values("id", ignore_index=True)
    second = read_dir(tmp_path / "second" / "kept").sort_values("id", ignore_index=True)
    assert len(first) == 60 and first["id"].is_unique
    pd.testing.assert_frame_equal(first, second)
    data = wiki.read_bytes()
    for doc_id, text in zip(first["id"], first["text"]):
        name, offset = doc_id.split(":")  # `wikitext2_valid.txt:<byte offset>`: the file named once
        assert name == "wikitext2_valid.txt"
        assert data[int(offset) :].startswith(text.encode("utf-8"))


def test_two_inputs_with_one_source_or_the_same_name(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    (tmp_path / "x" / "part.jsonl").write_bytes(jsonl({"text": "from x"}))
    (tmp_path / "y" / "part.jsonl").write_bytes(jsonl({"text": "from y"}))
    (tmp_path / "z.jsonl").write_bytes(jsonl({"text": "from z"}))

    done = ingest([tmp_path / "x" / "part.jsonl", tmp_path / "z.jsonl"], tmp_path / "shared", "--source", "crawl")
    assert done.returncode == 0, done.stderr
    kept = read_dir(tmp_path / "shared" / "kept").sort_values("id")
    assert kept["id"].tolist() == ["crawl:part.jsonl:0", "crawl:z.jsonl:0"]

    # Same file name twice: the ids would collide, so it is a clear error, not a silent merge.
    done = ingest([tmp_path / "x" / "part.jsonl", tmp_path / "y" / "part.jsonl"], tmp_path / "clash")
    assert done.returncode == 1 and "same ids" in done.stderr
    assert not (tmp_path / "clash").exists()
