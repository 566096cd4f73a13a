"""Ingest: every record accounted for, bad records rejected with a reason, ids stable."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokenmill.cli import main
from tokenmill.curate import ingest as ingest_module
from tokenmill.curate.ingest import ingest
from tokenmill.infra.document_dirs import read_manifest, resolve_input_files

GOOD = [
    {"text": "The first good document.", "meta": 1},
    {"text": "Another good one,\nwith two lines."},
    {"text": "Ünïcödé is fine too: 日本語"},
]


def read_dir(path) -> pd.DataFrame:
    files = sorted(path.glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def mixed_jsonl_bytes() -> bytes:
    lines = [
        json.dumps(GOOD[0]).encode(),
        b'{"text": "unterminated',
        b"\xff\xfe" + json.dumps({"text": "bad bytes"}).encode(),
        json.dumps({"title": "no text here"}).encode(),
        json.dumps({"text": ["not", "a", "string"]}).encode(),
        json.dumps({"text": "  \n\t "}).encode(),
        json.dumps(GOOD[1]).encode(),
        b"[1, 2, 3]",
        b"",
        json.dumps(GOOD[2], ensure_ascii=False).encode(),
    ]
    return b"\n".join(lines) + b"\n"


def test_mixed_jsonl_counts_reasons_and_intact_good_records(tmp_path, dask_client):
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(mixed_jsonl_bytes())
    manifest = ingest(source, tmp_path / "out", client=dask_client, progress=False)

    assert manifest["counts"] == {
        "in": 9,
        "kept": 3,
        "rejected": {
            "empty_text": 1,
            "invalid_json": 1,
            "invalid_utf8": 1,
            "missing_text": 1,
            "non_string_text": 1,
            "not_an_object": 1,
        },
    }
    kept = read_dir(tmp_path / "out" / "kept")
    assert sorted(kept["text"]) == sorted(doc["text"] for doc in GOOD)
    assert set(kept["source"]) == {"mixed.jsonl"}
    assert kept["id"].is_unique
    rejected = read_dir(tmp_path / "out" / "rejected")
    by_reason = dict(zip(rejected["reason"], rejected["raw"]))
    assert by_reason["invalid_json"] == '{"text": "unterminated'
    assert by_reason["invalid_utf8"].startswith("\\xff\\xfe")
    assert json.loads(by_reason["missing_text"]) == {"title": "no text here"}
    # The manifest on disk is the one returned, and nothing is left half-written.
    assert read_manifest(tmp_path / "out")["counts"] == manifest["counts"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_jsonl_gives_the_same_documents(tmp_path, dask_client, suffix):
    data = mixed_jsonl_bytes()
    plain = tmp_path / "c.jsonl"
    plain.write_bytes(data)
    compressed = tmp_path / f"c{suffix}"
    compressed.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else zstandard.ZstdCompressor().compress(data))
    a = ingest(plain, tmp_path / "plain", source="c", client=dask_client, progress=False)
    b = ingest(compressed, tmp_path / "compressed", source="c", client=dask_client, progress=False)
    assert a["counts"] == b["counts"]
    pd.testing.assert_frame_equal(
        read_dir(tmp_path / "plain" / "kept").sort_values("id", ignore_index=True),
        read_dir(tmp_path / "compressed" / "kept").sort_values("id", ignore_index=True),
    )


def test_truncated_gzip_keeps_what_was_read_and_reports_the_rest(tmp_path, dask_client):
    data = b"".join(json.dumps({"text": f"document number {i}"}).encode() + b"\n" for i in range(2000))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(data)[:-200])
    manifest = ingest(broken, tmp_path / "out", client=dask_client, progress=False)
    assert manifest["counts"]["rejected"] == {"corrupt_file": 1}
    assert 1000 < manifest["counts"]["kept"] < 2000


def test_jsonl_split_into_byte_ranges_gives_the_same_documents_with_1_and_2_workers(
    tmp_path, dask_client, dask_client_1, monkeypatch
):
    lines = [json.dumps({"text": f"line {i} " + "word " * (i % 17)}) for i in range(3000)]
    source = tmp_path / "big.jsonl"
    source.write_text("\n".join(lines) + "\n")
    whole = ingest(source, tmp_path / "whole", client=dask_client_1, progress=False)
    monkeypatch.setattr(ingest_module, "JSONL_CHUNK_BYTES", 4096)  # many ranges, cut mid-line
    split = ingest(source, tmp_path / "split", client=dask_client, progress=False)
    assert split["partitions"] > 10
    assert whole["counts"] == split["counts"] == {"in": 3000, "kept": 3000, "rejected": {}}
    one = read_dir(tmp_path / "whole" / "kept").sort_values("id", ignore_index=True)
    two = read_dir(tmp_path / "split" / "kept").sort_values("id", ignore_index=True)
    pd.testing.assert_frame_equal(one, two)


def test_field_mapping_and_parquet_input(tmp_path, dask_client):
    table = pa.table({"body": ["alpha text", None, "gamma text", ""], "doc": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=2)
    manifest = ingest(
        tmp_path / "in.parquet",
        tmp_path / "out",
        text_field="body",
        id_field="doc",
        source="mine",
        client=dask_client,
        progress=False,
    )
    assert manifest["counts"] == {"in": 4, "kept": 2, "rejected": {"empty_text": 1, "missing_text": 1}}
    kept = read_dir(tmp_path / "out" / "kept").sort_values("id")
    assert kept["id"].tolist() == ["a", "c"]
    assert kept["source"].tolist() == ["mine", "mine"]


def test_text_directory_one_document_per_file_and_separator_split(tmp_path, dask_client):
    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.txt").write_text("First file.\n")
    (corpus / "b.txt").write_bytes(b"caf\xe9 in latin-1\n")
    (corpus / "sub").mkdir()
    (corpus / "sub" / "c.txt").write_text("Third, in a subdirectory.")
    manifest = ingest(corpus, tmp_path / "dir", client=dask_client, progress=False)
    assert manifest["counts"] == {"in": 3, "kept": 2, "rejected": {"invalid_utf8": 1}}
    kept = read_dir(tmp_path / "dir" / "kept")
    assert sorted(kept["id"]) == ["notes:a.txt", "notes:sub/c.txt"]

    book = tmp_path / "book.txt"
    book.write_text("Chapter 1\nIt begins.\n\n\n\nChapter 2\nIt goes on.\n\n  \n\nChapter 3\nIt ends.\n")
    manifest = ingest(book, tmp_path / "split", separator=r"\n\s*\n", client=dask_client, progress=False)
    kept = read_dir(tmp_path / "split" / "kept")
    assert sorted(t.strip() for t in kept["text"]) == [
        "Chapter 1\nIt begins.",
        "Chapter 2\nIt goes on.",
        "Chapter 3\nIt ends.",
    ]


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["curate", "ingest", "--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o")]) == 1
    assert "input not found" in capsys.readouterr().err
    (tmp_path / "x.bin").write_bytes(b"\0")
    assert main(["curate", "ingest", "--input", str(tmp_path / "x.bin"), "--output", str(tmp_path / "o")]) == 1
    assert "--format" in capsys.readouterr().err
    assert (
        main(
            [
                "curate",
                "ingest",
                "--input",
                str(tmp_path / "x.bin"),
                "--format",
                "text",
                "--separator",
                "(",
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 1
    )
    assert "not a valid regular expression" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_stage_input_resolution(tmp_path, dask_client):
    (tmp_path / "a.jsonl").write_text('{"text": "x y z"}\n')
    ingest(tmp_path / "a.jsonl", tmp_path / "stage", client=dask_client, progress=False)
    assert resolve_input_files(tmp_path / "stage") == sorted((tmp_path / "stage" / "kept").glob("*.parquet"))


def minimal_pdf(text: str) -> bytes:
    """A valid one-page PDF 1.4 whose content stream is Flate-compressed, as PDF writers make them."""
    import zlib

    content = zlib.compress(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    out = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def test_binary_files_read_as_text_are_rejected_with_a_reason(tmp_path, curate_cli, capsys):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "paper.pdf").write_bytes(minimal_pdf("Hello from a PDF"))
    (corpus / "notes-utf16.txt").write_bytes("Notes saved as UTF-16.\n".encode("utf-16"))
    (corpus / "dump.txt").write_bytes(bytes(range(1, 32)) * 40 + b"some words\n")
    # Text with the control characters real documents hold (tab, form feed, ANSI colours) is kept.
    kept_text = "Page one\tcolumn\n\x0cPage two \x1b[1mbold\x1b[0m\r\n"
    (corpus / "log.txt").write_text(kept_text)
    for errors in ("reject", "replace"):
        out = tmp_path / f"out-{errors}"
        assert curate_cli("ingest", corpus, out, "--format", "text", "--encoding-errors", errors) == 0
        manifest = read_manifest(out)
        assert manifest["counts"] == {"in": 4, "kept": 1, "rejected": {"binary": 3}}
        assert read_dir(out / "kept")["text"].tolist() == [kept_text]
        rejected = read_dir(out / "rejected").sort_values("id")
        assert rejected["id"].tolist() == ["docs:dump.txt", "docs:notes-utf16.txt", "docs:paper.pdf"]
        assert "control characters" in rejected["raw"].iloc[0] and "NUL" in rejected["raw"].iloc[1]
        assert "%PDF-" in rejected["raw"].iloc[2] and rejected["text"].isna().all()
        assert "binary: 3" in capsys.readouterr().err


def test_inputs_without_records_are_counted_and_warned_about(tmp_path, curate_cli, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert curate_cli("ingest", empty, tmp_path / "out") == 0
    assert read_manifest(tmp_path / "out")["counts"] == {"in": 1, "kept": 0, "rejected": {"empty_file": 1}}
    err = capsys.readouterr().err
    assert "ingest: in 1, kept 0, rejected 1" in err and "empty_file: 1" in err
    assert "tokenmill: WARNING: ingest kept no document (empty_file 1)" in err
    assert read_dir(tmp_path / "out" / "rejected")["raw"].tolist() == [
        f"{empty}: no record (empty or blank lines only)"
    ]

    # In a directory beside real records: one rejection for each file without records, no warning.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "one record"}\n')
    (corpus / "blank.jsonl").write_text("\n  \n\n")
    (corpus / "none.jsonl.gz").write_bytes(gzip.compress(b""))
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), corpus / "rows.parquet")
    (corpus / "chapters.txt").write_text("\n\n")
    assert curate_cli("ingest", corpus, tmp_path / "dir", "--separator", r"\n\n") == 0
    counts = read_manifest(tmp_path / "dir")["counts"]
    assert counts == {"in": 5, "kept": 1, "rejected": {"empty_file": 4}}
    rejected = read_dir(tmp_path / "dir" / "rejected")
    assert sorted(rejected["id"]) == [
        "corpus:blank.jsonl:empty",
        "corpus:chapters.txt:empty",
        "corpus:none.jsonl.gz:empty",
        "corpus:rows.parquet:empty",
    ]
    assert "WARNING" not in capsys.readouterr().err
