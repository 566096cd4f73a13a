"""One record over --max-record-bytes is a counted `too_large` rejection, read past in bounded
chunks, and the records around it are kept; a lone surrogate or a byte-order mark loses nothing."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
from test_ingest import read_dir
from test_ingest_web import http_response, page, warc_record

from tokenmill.infra.document_dirs import read_manifest

MB = 1024 * 1024
LIMIT = str(MB)


def test_oversized_records_of_every_format_are_counted_and_the_others_kept(tmp_path, curate_cli):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = json.dumps({"text": "a good document"}).encode() + b"\n"
    # A 5 MB line between two good ones; and a gzip bomb: 6 MB without a newline in 6 KB.
    huge_line = json.dumps({"text": "x" * (5 * MB)}).encode() + b"\n"
    (corpus / "lines.jsonl").write_bytes(good + huge_line + good)
    (corpus / "bomb.jsonl.gz").write_bytes(gzip.compress(good + b"{" * (6 * MB) + b"\n" + good))
    (corpus / "big.txt").write_bytes(b"words " * MB)
    (corpus / "small.txt").write_text("a small text file\n")
    pq.write_table(pa.table({"text": ["a good cell", "y" * (2 * MB), "another good cell"]}), corpus / "cells.parquet")

    assert curate_cli("ingest", corpus, tmp_path / "out", "--max-record-bytes", LIMIT) == 0
    counts = read_manifest(tmp_path / "out")["counts"]
    assert counts == {"in": 11, "kept": 7, "rejected": {"too_large": 4}}
    rejected = read_dir(tmp_path / "out" / "rejected").sort_values("id")
    second_line = len(good)
    assert rejected["id"].tolist() == [
        "corpus:big.txt",
        f"corpus:bomb.jsonl.gz:{second_line}",
        "corpus:cells.parquet:1",
        f"corpus:lines.jsonl:{second_line}",
    ]
    # Each rejection names its size and shows its first bytes, never the record itself.
    assert rejected["text"].isna().all() and (rejected["raw"].str.len() < 400).all()
    assert rejected["raw"].tolist()[1].startswith(f"{6 * MB + 1} bytes, over --max-record-bytes {MB}: {{{{")
    kept = read_dir(tmp_path / "out" / "kept")
    # Offsets after the skipped line are still byte offsets of the file.
    assert f"corpus:lines.jsonl:{second_line + len(huge_line)}" in set(kept["id"])
    assert f"corpus:bomb.jsonl.gz:{second_line + 6 * MB + 1}" in set(kept["id"])

    # Under the default limit (64 MiB) the same records are all kept.
    assert curate_cli("ingest", corpus, tmp_path / "default") == 0
    assert read_manifest(tmp_path / "default")["counts"] == {"in": 11, "kept": 10, "rejected": {"invalid_json": 1}}


def test_oversized_warc_records_and_decompression_bombs_are_counted(tmp_path, curate_cli):
    html = page("A page of ordinary size.").encode()
    large_block = http_response(b"<html>" + b" " * (3 * MB), Content_Type="text/html")
    archive = b"".join(
        gzip.compress(record)
        for record in (
            warc_record(
                "response", http_response(html, Content_Type="text/html"), "00000000-0000-0000-0000-000000000001"
            ),
            # A record whose content is 3 MB, compressed by the archive's gzip member to a few KB.
            warc_record("response", large_block, "00000000-0000-0000-0000-000000000002"),
            # A small record whose page, Content-Encoding gzip, decompresses to 8 MB.
            warc_record(
                "response",
                http_response(
                    gzip.compress(b"<html>" + b"a" * (8 * MB)), Content_Type="text/html", Content_Encoding="gzip"
                ),
                "00000000-0000-0000-0000-000000000003",
            ),
            warc_record(
                "response", http_response(html, Content_Type="text/html"), "00000000-0000-0000-0000-000000000004"
            ),
        )
    )
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(archive)
    assert len(archive) < 100_000

    assert curate_cli("ingest", path, tmp_path / "out", "--max-record-bytes", LIMIT) == 0
    assert read_manifest(tmp_path / "out")["counts"] == {"in": 4, "kept": 2, "rejected": {"too_large": 2}}
    rejected = read_dir(tmp_path / "out" / "rejected").sort_values("id")
    assert rejected["id"].tolist() == [
        "<urn:uuid:00000000-0000-0000-0000-000000000002>",
        "<urn:uuid:00000000-0000-0000-0000-000000000003>",
    ]
    assert rejected["raw"].iloc[0].startswith(f"{len(large_block)} bytes, over --max-record-bytes {MB}: HTTP/1.1 200")
    assert rejected["raw"].iloc[1].startswith(f"more than {MB} decompressed bytes, over")
    assert (rejected["raw"].str.len() < 400).all()


def test_a_lone_surrogate_is_repaired_and_a_byte_order_mark_is_stripped(tmp_path, curate_cli):
    source = tmp_path / "windows.jsonl"
    lines = [
        json.dumps({"text": "first record after a BOM", "id": "a"}),
        '{"text": "lone \\ud800 surrogate and a pair \\ud83d\\ude00", "id": "b\\udfff"}',
        json.dumps({"text": "last", "id": "c"}),
    ]
    source.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    assert curate_cli("ingest", source, tmp_path / "out", "--id-field", "id") == 0
    manifest = read_manifest(tmp_path / "out")
    assert manifest["counts"] == {"in": 3, "kept": 3, "rejected": {}}
    assert manifest["stats"]["replaced_surrogates"] == 2
    kept = read_dir(tmp_path / "out" / "kept").sort_values("id")
    assert kept["id"].tolist() == ["a", "b\ufffd", "c"]
    assert kept["text"].tolist() == ["first record after a BOM", "lone \ufffd surrogate and a pair 😀", "last"]
