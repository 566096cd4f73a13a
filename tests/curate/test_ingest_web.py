"""Ingest of web archives: the shared WARC/WET files yield what their README says, and archives
built here exercise every rejection reason, charsets, HTTP encodings and truncation."""

from __future__ import annotations

import gzip
import re
import shutil
import zlib
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from tokenmill.curate.ingest import detect_format, ingest
from tokenmill.curate.stage import Batch
from tokenmill.curate.webarchive import HtmlFiles, WarcFile


def run_task(task) -> tuple[pd.DataFrame, pd.DataFrame, Counter]:
    """All batches of one task, checked against the stage contract."""
    outputs: list[Batch] = list(task.run())
    stats: Counter = Counter()
    for output in outputs:
        assert output.n_in == len(output.kept) + len(output.rejected)
        stats.update(output.stats)
    kept = pd.concat([o.kept for o in outputs], ignore_index=True)
    rejected = pd.concat([o.rejected for o in outputs], ignore_index=True)
    return kept, rejected, stats


def warc_record(record_type: str, block: bytes, record_id: str, url: str = "http://example.com/") -> bytes:
    header = (
        f"WARC/1.0\r\nWARC-Type: {record_type}\r\nWARC-Record-ID: <urn:uuid:{record_id}>\r\n"
        f"WARC-Date: 2024-05-01T10:00:00Z\r\nWARC-Target-URI: {url}\r\n"
        f"Content-Type: application/http; msgtype={record_type}\r\nContent-Length: {len(block)}\r\n\r\n"
    )
    return header.encode() + block + b"\r\n\r\n"


def http_response(body: bytes, status: str = "200 OK", **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def page(body: str, head: str = "") -> str:
    return f"<!DOCTYPE html><html><head>{head}<title>t</title></head><body><p>{body}</p></body></html>"


# --- the shared files -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warc_dir(shared_data: Path) -> Path:
    return shared_data / "web" / "warc"


@pytest.mark.parametrize(
    "name, responses, other_records",
    [
        ("cc-main-2020-34-sample.warc.gz", 16, {"warcinfo": 1, "request": 17, "metadata": 16}),
        ("clueweb-quirk.warc.gz", 29, {"warcinfo": 1}),
        ("wget-sample-0000.warc.gz", 22, {"warcinfo": 1, "request": 22, "metadata": 1, "resource": 2}),
        ("wget-sample-0001.warc.gz", 15, {"warcinfo": 1, "request": 15, "metadata": 1, "resource": 2}),
        ("whirlwind.warc.gz", 1, {"warcinfo": 1, "request": 1, "metadata": 1}),
    ],
)
def test_shared_warc_yields_one_document_per_html_response(warc_dir, name, responses, other_records):
    kept, rejected, stats = run_task(WarcFile(str(warc_dir / name), "web", "warc"))
    assert len(kept) == responses and rejected.empty
    assert stats["records.response"] == responses
    assert {k.removeprefix("records."): v for k, v in stats.items() if k.startswith("records.")} == {
        "response": responses,
        **other_records,
    }
    assert kept["id"].is_unique and (kept["id"] == kept["warc_record_id"]).all()
    assert kept["id"].str.match(r"^<urn:uuid:[0-9a-fA-F-]{36}>$").all()
    assert kept["url"].str.match(r"^https?://").all()
    assert kept["date"].str.match(r"^\d{4}-\d{2}-").all()
    assert (kept["content_type"] == "text/html").all()
    assert kept["text"].str.contains("<html", case=False).all()
    assert (kept["source"] == "web").all()


def test_charsets_of_the_shared_pages(warc_dir):
    kept, _, stats = run_task(WarcFile(str(warc_dir / "clueweb-quirk.warc.gz"), "web"))
    # Japanese pages served as EUC-JP; ClueWeb stored them already gunzipped under
    # `Content-Encoding: gzip`, which must not turn them into rejections.
    assert (kept["charset"] == "euc_jp").all()
    assert stats["encoding_already_undone"] == 29
    assert kept["text"].str.contains("[\u3040-\u30ff]").all()  # kana, so the decoding was right
    kept, _, stats = run_task(WarcFile(str(warc_dir / "cc-main-2020-34-sample.warc.gz"), "web"))
    assert Counter(kept["charset"]) == {"utf-8": 7, "gbk": 6, "cp1251": 1, "cp1252": 2}
    assert stats["charset.header"] == 7 and stats["charset.meta"] == 8 and stats["charset.bom"] == 1
    chinese = kept[kept["url"].str.contains(r"\.cn/|\.com/")]
    assert chinese["text"].str.count("[\u4e00-\u9fff]").min() > 150  # Han characters, not mojibake
    russian = kept[kept["charset"] == "cp1251"]["text"].iloc[0]
    assert re.search("[а-яА-Я]{4}", russian)


def test_truncated_archive_yields_complete_records_and_one_rejection(warc_dir, tmp_path):
    kept, rejected, _ = run_task(WarcFile(str(warc_dir / "truncated.warc.gz"), "web"))
    # Its only response is the one cut off: nothing is invented from the partial body.
    assert kept.empty
    assert rejected["reason"].tolist() == ["truncated_archive"]
    assert "cut off" in rejected["raw"].iloc[0]

    # Cut a whole archive at several places: the records before the cut are kept, then one rejection.
    full = gzip.decompress((warc_dir / "wget-sample-0000.warc.gz").read_bytes())
    all_kept, _, _ = run_task(WarcFile(str(warc_dir / "wget-sample-0000.warc.gz"), "web"))
    for cut in (300_000, len(full) // 2, len(full) - 10):
        path = tmp_path / f"cut-{cut}.warc"
        path.write_bytes(full[:cut])
        kept, rejected, _ = run_task(WarcFile(str(path), "web"))
        assert rejected["reason"].tolist() == ["truncated_archive"]
        assert kept["id"].tolist() == all_kept["id"].tolist()[: len(kept)]
        assert kept["text"].tolist() == all_kept["text"].tolist()[: len(kept)]
    # A gzip stream cut inside a member.
    path = tmp_path / "cut.warc.gz"
    path.write_bytes((warc_dir / "wget-sample-0000.warc.gz").read_bytes()[:100_000])
    kept, rejected, _ = run_task(WarcFile(str(path), "web"))
    assert rejected["reason"].tolist() == ["truncated_archive"]
    assert 0 < len(kept) < len(all_kept)
    assert kept["text"].tolist() == all_kept["text"].tolist()[: len(kept)]


def test_wet_gives_common_crawls_text_and_matches_the_warc(warc_dir):
    import trafilatura

    wet, rejected, stats = run_task(WarcFile(str(warc_dir / "whirlwind.warc.wet.gz"), "web", "wet"))
    assert len(wet) == 1 and rejected.empty and stats["records.warcinfo"] == 1
    doc = wet.iloc[0]
    assert doc["content_type"] == "text/plain" and doc["url"] == "https://an.wikipedia.org/wiki/Escopete"
    assert doc["text"].startswith("Escopete") and "<" not in doc["text"][:200]
    html, _, _ = run_task(WarcFile(str(warc_dir / "whirlwind.warc.gz"), "web", "warc"))
    assert html.iloc[0]["url"] == doc["url"]
    extracted = trafilatura.extract(html.iloc[0]["text"])
    words = lambda text: re.findall(r"\w+", text.lower())  # noqa: E731
    shingles = lambda w: Counter(zip(w, w[1:], w[2:], w[3:]))  # noqa: E731
    extracted_shingles = shingles(words(extracted))
    overlap = sum((extracted_shingles & shingles(words(doc["text"]))).values())
    # Common Crawl's WET keeps menus and footers, the extractor the article: most of the
    # article's text must be in the WET text.
    assert overlap / sum(extracted_shingles.values()) > 0.8


def test_wget_pages_are_english_with_text(warc_dir):
    import trafilatura

    for name in ("wget-sample-0000.warc.gz", "wget-sample-0001.warc.gz"):
        kept, _, _ = run_task(WarcFile(str(warc_dir / name), "web"))
        for html in kept["text"]:
            text = trafilatura.extract(html) or ""
            assert len(text) > 50
            assert len(re.findall(r"\b(the|and|of|to)\b", text.lower())) >= 3


def test_ingest_a_directory_of_archives(warc_dir, tmp_path):
    """Through the stage runner: extensions chosen, counts balanced, one table with web columns."""
    corpus = tmp_path / "crawl"
    corpus.mkdir()
    for name in ("cc-main-2020-34-sample.warc.gz", "truncated.warc.gz", "whirlwind.warc.wet.gz"):
        shutil.copy(warc_dir / name, corpus / name)
    shutil.copy(warc_dir / "whirlwind.warc.wat.gz", corpus / "whirlwind.warc.wat.gz")
    (corpus / "notes.jsonl").write_text('{"text": "a line of notes"}\n')
    manifest = ingest(corpus, tmp_path / "out", workers=1, progress=False)
    counts = manifest["counts"]
    assert counts == {
        "in": 16 + 1 + 1 + 1 + 1,
        "kept": 16 + 1 + 1,
        "rejected": {"truncated_archive": 1, "unknown_format": 1},
    }
    assert manifest["stats"]["records.request"] == 17
    kept = pd.read_parquet(tmp_path / "out" / "kept")
    assert {"url", "date", "warc_record_id", "content_type", "charset"} <= set(kept.columns)
    assert Counter(kept["content_type"].dropna()) == {"text/html": 16, "text/plain": 1}
    notes = kept[kept["text"] == "a line of notes"]
    assert len(notes) == 1 and notes[["url", "date", "content_type", "charset"]].isna().all(axis=None)


def test_extensions():
    for name, fmt in [
        ("a.warc", "warc"),
        ("CC-MAIN-1.warc.gz", "warc"),
        ("CC-MAIN-1.warc.wet.gz", "wet"),
        ("x.wet", "wet"),
        ("p.html", "html"),
        ("p.htm", "html"),
        ("p.html.gz", "html"),
        ("x.warc.wat.gz", None),
        ("x.warc.zst", None),
    ]:
        assert detect_format(Path(name)) == fmt, name


# --- archives built here ----------------------------------------------------------------------


def test_every_rejection_and_encoding(tmp_path):
    latin = page("Café crème brûlée, naïve façade.").encode("latin-1")
    records = [
        warc_record("warcinfo", b"software: test\r\n", "00000000-0000-0000-0000-000000000000"),
        warc_record("request", b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", "00000000-0000-0000-0000-000000000001"),
        # kept: charset from the HTTP header
        warc_record(
            "response",
            http_response(latin, Content_Type="text/html; charset=ISO-8859-1"),
            "00000000-0000-0000-0000-000000000002",
        ),
        # kept: gzip content encoding undone, charset from <meta>
        warc_record(
            "response",
            http_response(
                gzip.compress(page("Добрый день, мир и всё такое.", '<meta charset="windows-1251">').encode("cp1251")),
                Content_Type="text/html",
                Content_Encoding="gzip",
            ),
            "00000000-0000-0000-0000-000000000003",
        ),
        # kept: chunked transfer encoding, raw deflate, charset detected, content type sniffed
        warc_record(
            "response",
            http_response(
                (lambda z: b"%x\r\n" % len(z) + z + b"\r\n0\r\n\r\n")(
                    (lambda c: c.compress(page("日本語のページです。" * 20).encode("shift_jis")) + c.flush())(
                        zlib.compressobj(wbits=-15)
                    )
                ),
                Transfer_Encoding="chunked",
                Content_Encoding="deflate",
            ),
            "00000000-0000-0000-0000-000000000004",
        ),
        warc_record("response", http_response(b"", "404 Not Found"), "00000000-0000-0000-0000-000000000005"),
        warc_record(
            "response",
            http_response(b"", "301 Moved Permanently", Location="http://example.com/x"),
            "00000000-0000-0000-0000-000000000006",
        ),
        warc_record(
            "response",
            http_response(b"\x89PNG\r\n\x1a\n" + bytes(100), Content_Type="image/png"),
            "00000000-0000-0000-0000-000000000007",
        ),
        warc_record(
            "response", http_response(b" \n ", Content_Type="text/html"), "00000000-0000-0000-0000-000000000008"
        ),
        warc_record(
            "response",
            http_response(b"\x1f\x8b" + bytes(range(256)), Content_Type="text/html", Content_Encoding="gzip"),
            "00000000-0000-0000-0000-000000000009",
        ),
        warc_record("metadata", b"fetchTimeMs: 12\r\n", "00000000-0000-0000-0000-000000000010"),
    ]
    path = tmp_path / "made.warc.gz"
    with gzip.open(path, "wb") as handle:
        for record in records:
            handle.write(record)
    kept, rejected, stats = run_task(WarcFile(str(path), "made"))
    assert dict(zip(kept["id"].str[-3:-1], kept["charset"])) == {"02": "cp1252", "03": "cp1251", "04": "shift_jis"}
    assert "Café crème brûlée" in kept["text"].iloc[0]
    assert "Добрый день" in kept["text"].iloc[1]
    assert "日本語のページです" in kept["text"].iloc[2]
    assert kept["content_type"].tolist() == ["text/html"] * 3
    assert dict(zip(rejected["id"].str[-3:-1], rejected["reason"])) == {
        "05": "warc.http_status",
        "06": "warc.http_status",
        "07": "warc.not_html",
        "08": "warc.empty",
        "09": "warc.undecodable",
    }
    assert rejected["raw"].iloc[0].startswith("HTTP 404")
    assert rejected["content_type"].iloc[2] == "image/png"
    assert stats["charset.header"] == 1 and stats["charset.meta"] == 1 and stats["charset.detected"] == 1
    assert stats["records.warcinfo"] == stats["records.request"] == stats["records.metadata"] == 1
    assert stats["records.response"] == 8


def test_brotli_encoding_and_every_html_type_are_kept(tmp_path):
    """A brotli-encoded response decodes (brotli is a dependency, so it never becomes
    `warc.undecodable`), and each HTML type the extract stage extracts is kept as HTML."""
    import brotli

    records = [
        warc_record(
            "response",
            http_response(
                brotli.compress(page("Brotli squeezed this page.").encode()),
                Content_Type="text/html; charset=utf-8",
                Content_Encoding="br",
            ),
            "00000000-0000-0000-0000-000000000001",
        ),
        warc_record(
            "response",
            http_response(page("A page for phones.").encode(), Content_Type="application/vnd.wap.xhtml+xml"),
            "00000000-0000-0000-0000-000000000002",
        ),
    ]
    path = tmp_path / "made.warc"
    path.write_bytes(b"".join(records))
    kept, rejected, _ = run_task(WarcFile(str(path), "made"))
    assert rejected.empty, rejected[["id", "reason", "raw"]].to_dict("records")
    assert [("Brotli squeezed this page." in t, "A page for phones." in t) for t in kept["text"]] == [
        (True, False),
        (False, True),
    ]
    assert kept["content_type"].tolist() == ["text/html", "application/vnd.wap.xhtml+xml"]


def test_saved_pages(shared_data, tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    source = sorted((shared_data / "web" / "extraction" / "html").glob("*.html.gz"))[:5]
    for path in source:
        shutil.copy(path, pages / path.name)
    (pages / "latin.html").write_bytes(
        page(
            "Ça coûte très cher, garçon.", '<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
        ).encode("latin-1")
    )
    (pages / "blank.htm").write_bytes(b"\n\n")
    (pages / "broken.html.gz").write_bytes(gzip.compress(page("x" * 1000).encode())[:40])
    files = [(str(p), f"pages:{p.name}") for p in sorted(pages.iterdir())]
    kept, rejected, stats = run_task(HtmlFiles(files, "pages"))
    assert sorted(kept["id"]) == sorted([f"pages:{p.name}" for p in source] + ["pages:latin.html"])
    assert dict(zip(rejected["id"], rejected["reason"])) == {
        "pages:blank.htm": "html.empty",
        "pages:broken.html.gz": "corrupt_file",
    }
    latin = kept[kept["id"] == "pages:latin.html"].iloc[0]
    assert latin["charset"] == "cp1252" and "Ça coûte très cher" in latin["text"]
    assert (kept["content_type"] == "text/html").all() and kept["url"].isna().all()
    for path in source:
        assert kept.loc[kept["id"] == f"pages:{path.name}", "text"].iloc[0] == gzip.decompress(
            path.read_bytes()
        ).decode(kept.loc[kept["id"] == f"pages:{path.name}", "charset"].iloc[0])


@pytest.mark.slow
def test_recipe_source_reads_archives(warc_dir, tmp_path):
    """A recipe's `sources` entry goes through the same reader."""
    from tokenmill.pipelines.recipe import load_recipe
    from tokenmill.pipelines.runner import run_recipe

    recipe = tmp_path / "web.yaml"
    recipe.write_text(
        f"name: web\nsources:\n  - name: crawl\n    path: [{warc_dir / 'whirlwind.warc.gz'}, {warc_dir / 'whirlwind.warc.wet.gz'}]\n"
        "curate:\n  - stage: normalize\n"
    )
    result = run_recipe(load_recipe(recipe), tmp_path / "work", until=["ingest.crawl"], progress=False, workers=1)
    ingested = next(s for s in result.steps if s.name == "ingest.crawl")
    assert ingested.status == "ran"
    kept = pd.read_parquet(tmp_path / "work" / "curate" / "crawl" / "00-ingest" / "kept")
    assert sorted(kept["content_type"]) == ["text/html", "text/plain"]
    assert (kept["source"] == "crawl").all() and kept["url"].nunique() == 1


def test_files_that_are_no_archives(warc_dir, tmp_path):
    html = tmp_path / "page.warc"
    html.write_text("<html><body>saved with the wrong name</body></html>\n")
    header_only = tmp_path / "header.warc"
    header_only.write_bytes(b"WARC/1.0\r\nWARC-Type: warcinfo\r\n")
    damaged = bytearray((warc_dir / "wget-sample-0000.warc.gz").read_bytes())
    damaged[150_000:150_400] = bytes(400)  # zeroed bytes inside a gzip member
    (tmp_path / "damaged.warc.gz").write_bytes(bytes(damaged))
    all_kept, _, _ = run_task(WarcFile(str(warc_dir / "wget-sample-0000.warc.gz"), "web"))
    for path, reason in [
        (html, "corrupt_file"),
        (header_only, "truncated_archive"),
        (tmp_path / "damaged.warc.gz", "corrupt_file"),
    ]:
        kept, rejected, _ = run_task(WarcFile(str(path), "web"))
        assert rejected["reason"].tolist() == [reason], path.name
        assert kept["text"].tolist() == all_kept["text"].tolist()[: len(kept)]
    assert "no WARC record" in run_task(WarcFile(str(html), "web"))[1]["raw"].iloc[0]
