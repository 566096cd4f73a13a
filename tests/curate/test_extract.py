"""The extract stage: real article pages to main text with title and url kept, pathological pages
rejected with their reason in bounded time, non-HTML passed through, the benchmark's metric on
hand-computed cases and the default extractor's F1 on the benchmark's pages."""

from __future__ import annotations

import ast
import gzip
import html as html_lib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import tokenmill
from tokenmill.curate.extract.html_text import (
    DEFAULT_EXTRACTOR,
    ExtractorProcess,
    extract_page,
    extraction_scores,
    page_match,
    page_title,
)
from tokenmill.curate.extract.stage import ExtractStage
from tokenmill.curate.stage import run_stage
from tokenmill.errors import ConfigError

# Measured on the 181 pages: lean 0.962 (bench/results/extract.txt); the floor leaves room for
# library updates, well above resiliparse (0.898) and jusText (0.804).
DEFAULT_F1_FLOOR = 0.95

# A page whose main text any extractor finds.
ARTICLE_PAGE = "<html><head><title>T</title></head><body><article><p>" + "A sentence of text. " * 40 + "</p></article>"


def benchmark_pages(shared_data: Path, limit: int | None = None) -> list[tuple[str, str, dict]]:
    """(key, html, truth) of the extraction benchmark's pages, in key order."""
    root = shared_data / "web" / "extraction"
    truth = json.loads((root / "ground-truth.json").read_text())
    paths = sorted((root / "html").glob("*.html.gz"))[:limit]
    pages = []
    for path in paths:
        key = path.name.split(".")[0]
        with gzip.open(path, "rt", encoding="utf-8") as f:
            pages.append((key, f.read(), truth[key]))
    return pages


def write_pages(directory: Path, frame: pd.DataFrame) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(directory / "part-0.parquet", index=False)
    return directory


# ---- the metric


def test_metric_on_hand_computed_pages():
    # 5 words -> 2 shingles each; one differs -> TP 1, FP 1, FN 1.
    assert page_match("a b c d e", "a b c d e") == (2, 0, 0)
    assert page_match("a b c d e", "a b c d x") == (1, 1, 1)
    # Multisets: "a b c d" occurs twice in the truth, once in the prediction.
    assert page_match("a b c d a b c d", "a b c d") == (1, 0, 4)
    # Fewer than 4 words is one shorter shingle; punctuation is no word; \w is Unicode.
    assert page_match("Hello, world!", "hello world") == (0, 1, 1)
    assert page_match("Grüße aus Köln, heute Abend.", "Grüße aus Köln heute Abend") == (2, 0, 0)
    assert page_match("a b c d e", "") == (0, 0, 2)

    scores = extraction_scores(
        [
            ("a b c d e", "a b c d e"),  # P 1, R 1
            ("a b c d e", "a b c d x"),  # P 0.5, R 0.5
            ("a b c d e", ""),  # no prediction: left out of precision, R 0
            ("", ""),  # nothing either side: left out of both
            ("a b c d a b c d", "a b c d"),  # P 1, R 0.2
        ]
    )
    precision, recall = (1 + 0.5 + 1) / 3, (1 + 0.5 + 0 + 0.2) / 4
    assert scores["precision"] == pytest.approx(precision)
    assert scores["recall"] == pytest.approx(recall)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall))


# ---- real pages through the stage


def test_real_pages_become_main_text_with_title_and_url(shared_data, tmp_path, dask_client):
    pages = benchmark_pages(shared_data, limit=8)
    frame = pd.DataFrame(
        {
            "id": [key for key, _, _ in pages],
            "text": [html for _, html, _ in pages],
            "source": "web",
            "url": [truth["url"] for _, _, truth in pages],
            "content_type": "text/html",
            "date": "2019-11-01",
        }
    )
    wet = {"id": "wet-1", "text": "Plain text from a WET record.\nSecond line.", "source": "web"}
    frame = pd.concat(
        [frame, pd.DataFrame([{**wet, "url": "https://example.org/", "content_type": "text/plain", "date": "x"}])],
        ignore_index=True,
    )
    manifest = run_stage(
        ExtractStage(), write_pages(tmp_path / "in", frame), tmp_path / "out", client=dask_client, progress=False
    )
    assert manifest["counts"] == {"in": 9, "kept": 9, "rejected": {}}
    assert manifest["stats"]["passed_through"] == 1 and manifest["stats"]["extracted"] == 8
    kept = pd.read_parquet(tmp_path / "out" / "kept").set_index("id")
    assert {"url", "content_type", "date", "title"} <= set(kept.columns)

    plain = kept.loc["wet-1"]
    assert plain["text"] == wet["text"] and plain["content_type"] == "text/plain" and pd.isna(plain["title"])
    for key, html, truth in pages:
        row = kept.loc[key]
        assert row["url"] == truth["url"]
        assert "<div" not in row["text"] and len(row["text"]) < len(html) / 3
        # The extracted text is the article: most of the true body's shingles are found.
        tp, fp, fn = page_match(truth["articleBody"], row["text"])
        assert tp / (tp + fn) > 0.6, key
        title = re.search(r"<title[^>]*>(.*?)</title>", html, re.S | re.I).group(1)
        assert row["title"] == " ".join(html_lib.unescape(title).split()) != ""
    # A title as the page writes it, entities decoded.
    assert page_title("<html><head><title> Caf&eacute;\n &amp; Bar </title></head></html>") == "Café & Bar"
    assert page_title('<meta property="og:title" content="Only OG"><p>x</p>') == "Only OG"


@pytest.mark.parametrize("extractor", ["trafilatura", "resiliparse"])
def test_each_extractor_extracts_a_real_page(shared_data, extractor):
    key, html, truth = benchmark_pages(shared_data, limit=1)[0]
    title, text = extract_page(extractor, html)
    tp, fp, fn = page_match(truth["articleBody"], text)
    assert tp / (tp + fn) > 0.9 and title


@pytest.mark.parametrize("extractor", ["lean", "trafilatura", "resiliparse"])
def test_xhtml_with_an_encoding_declaration_extracts(extractor):
    # lxml refuses a str that declares its encoding; XHTML pages often start with one.
    body = "<p>" + "A sentence of the article body, long enough to count as text. " * 10 + "</p>"
    page = (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html><html xmlns="http://www.w3.org/1999/xhtml">'
        f"<head><title>An XHTML page</title></head><body><article>{body}</article></body></html>"
    )
    title, text = extract_page(extractor, page)
    assert title == "An XHTML page" and text.count("A sentence of the article body") == 10


# ---- pathological pages


def deep_page(depth: int = 100_000) -> str:
    return "<html><body>" + "<div>" * depth + "deep text " * 30 + "</div>" * depth + "</body></html>"


def test_pathological_pages_are_rejected_with_their_reason_in_bounded_time(shared_data):
    _, article, _ = benchmark_pages(shared_data, limit=1)[0]
    huge = "<html><body>" + "<p>" + "word " * 1_100_000 + "</p></body></html>"  # 5.5 MB
    binary = bytes(range(256)) * 400  # decoded as Latin-1: full of control characters
    garbage = bytes((i * 7919) % 251 for i in range(100_000)).decode("utf-8", errors="replace")
    docs = pd.DataFrame(
        {
            "id": ["huge", "deep", "binary", "garbage", "empty", "blank", "no-body", "article"],
            "text": [huge, deep_page(), binary.decode("latin-1"), garbage, "", "  \n ", "<html></html>", article],
            "source": "test",
        }
    )
    started = time.monotonic()
    out = ExtractStage().process(docs)
    assert time.monotonic() - started < 60
    reasons = dict(zip(out.rejected["id"], out.rejected["reason"]))
    assert reasons == {
        "huge": "extract.too_large",
        "deep": "extract.empty",  # libxml2 stops at its depth limit: no main text
        "binary": "extract.binary",
        "garbage": "extract.binary",
        "empty": "extract.empty",
        "blank": "extract.empty",
        "no-body": "extract.empty",
    }
    assert list(out.kept["id"]) == ["article"]
    # Rejected documents keep their input untouched.
    assert out.rejected.set_index("id").loc["blank", "text"] == "  \n "


def test_a_page_that_stalls_the_extractor_is_killed_and_the_next_page_extracts(shared_data):
    # Resiliparse walks a 100,000-deep tree for minutes: the child is killed at the time limit.
    _, article, _ = benchmark_pages(shared_data, limit=1)[0]
    docs = pd.DataFrame({"id": ["deep", "article"], "text": [deep_page(), article], "source": "test"})
    stage = ExtractStage(extractor="resiliparse", timeout=3)
    started = time.monotonic()
    out = stage.process(docs)
    assert time.monotonic() - started < 30
    assert dict(zip(out.rejected["id"], out.rejected["reason"])) == {"deep": "extract.timeout"}
    assert list(out.kept["id"]) == ["article"] and len(out.kept["text"].iloc[0]) > 500
    assert out.stats["extractor_processes"] == 2  # the killed child and its replacement


def test_the_child_is_recycled_and_a_crash_is_one_rejection():
    process = ExtractorProcess("resiliparse", timeout=20, recycle_after=3)
    try:
        answers = [process.extract(ARTICLE_PAGE) for _ in range(7)]
        assert all(a[0] == "ok" and a[1] == "T" and "A sentence of text." in a[2] for a in answers)
        assert process.started == 3  # pages 1-3, 4-6, 7
        process._child.kill()  # the child dies (a segfault in a C parser looks the same)
        process._child.wait()
        assert process.extract(ARTICLE_PAGE)[0] == "extract.error"
        assert process.extract(ARTICLE_PAGE)[0] == "ok"
    finally:
        process.close()


def test_a_new_childs_start_up_is_not_counted_against_the_page():
    # recycle_after=1: every page goes to a new child, whose Python start and trafilatura import
    # take far longer than the 0.25 s limit; extracting the short page itself takes milliseconds.
    process = ExtractorProcess("lean", timeout=0.25, recycle_after=1)
    try:
        answers = [process.extract(ARTICLE_PAGE) for _ in range(2)]
    finally:
        process.close()
    assert [a[0] for a in answers] == ["ok", "ok"], answers
    assert process.started == 2


def test_bad_options_are_one_line_errors():
    with pytest.raises(ConfigError, match="extractor must be one of"):
        ExtractStage(extractor="lynx")
    with pytest.raises(ConfigError, match="timeout must be > 0"):
        ExtractStage(timeout=0)
    with pytest.raises(ConfigError, match="max_bytes"):
        ExtractStage(max_bytes=-1)


# ---- the stage from the command line and in a recipe


@pytest.mark.slow
def test_command_line_and_recipe(shared_data, tmp_path, dask_client):
    from tokenmill.cli import main
    from tokenmill.pipelines.recipe import load_recipe
    from tokenmill.pipelines.runner import run_recipe

    pages = benchmark_pages(shared_data, limit=4)
    lines = [json.dumps({"id": key, "text": html}) for key, html, _ in pages]
    app = "<html><body><div id='app'></div><script>render('app')</script></body></html>"  # no text without scripts
    lines.append(json.dumps({"id": "script-only", "text": app}))
    (tmp_path / "pages.jsonl").write_text("\n".join(lines) + "\n")

    frame = pd.DataFrame({"id": [k for k, _, _ in pages], "text": [h for _, h, _ in pages], "source": "web"})
    write_pages(tmp_path / "docs", frame)
    assert main(["curate", "extract", "--input", str(tmp_path / "docs"), "--output", str(tmp_path / "cli"),
                 "--extractor", "resiliparse", "--workers", "1"]) == 0  # fmt: skip
    manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert manifest["config"]["extractor"] == "resiliparse" and manifest["counts"]["kept"] == 4

    recipe_path = tmp_path / "web.yaml"
    recipe_path.write_text(
        textwrap.dedent(
            f"""
            name: web
            sources:
              - name: pages
                path: {tmp_path / "pages.jsonl"}
                format: jsonl
                id_field: id
            curate:
              - stage: extract
                options: {{extractor: {DEFAULT_EXTRACTOR}, timeout: 30}}
            """
        )
    )
    run_recipe(load_recipe(recipe_path), tmp_path / "work", progress=False, client=dask_client, report=False)
    manifests = list((tmp_path / "work").rglob("manifest.json"))
    extract = [json.loads(p.read_text()) for p in manifests if json.loads(p.read_text())["stage"] == "extract"]
    assert len(extract) == 1
    assert extract[0]["counts"] == {"in": 5, "kept": 4, "rejected": {"extract.empty": 1}}


# ---- quality of the default extractor on the benchmark


@pytest.mark.slow
def test_default_extractor_f1_on_the_benchmark(shared_data):
    pages = benchmark_pages(shared_data)
    assert len(pages) == 181
    scores = extraction_scores(
        (truth["articleBody"], extract_page(DEFAULT_EXTRACTOR, html)[1]) for _, html, truth in pages
    )
    assert scores["f1"] >= DEFAULT_F1_FLOOR, scores


# ---- lean's gate on the versions of trafilatura and jusText it was proven on


def five_pages(directory: Path) -> Path:
    body = "<p>" + "A sentence of an article's text. " * 30 + "</p>"
    texts = [
        f"<html><head><title>Page {i}</title></head><body><article>{body}</article></body></html>" for i in range(5)
    ]
    return write_pages(directory, pd.DataFrame({"id": [f"p{i}" for i in range(5)], "text": texts, "source": "web"}))


def test_lean_under_an_unproven_release_warns_once_and_extracts_with_trafilatura(tmp_path, monkeypatch, capsys):
    from tokenmill.cli import main
    from tokenmill.curate.extract import html_text

    # What the gate sees after an upgrade of trafilatura: installed, a release lean was not proven on.
    monkeypatch.setitem(html_text.LEAN_PROVEN_VERSIONS, "trafilatura", "1.0.0")
    html_text._warn_unproven_lean.cache_clear()
    try:
        assert main(["curate", "extract", "--input", str(five_pages(tmp_path / "docs")),
                     "--output", str(tmp_path / "out")]) == 0  # fmt: skip
    finally:
        html_text._warn_unproven_lean.cache_clear()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    proven = ", ".join(f"{name} {version}" for name, version in html_text.LEAN_PROVEN_VERSIONS.items())
    installed = html_text.unproven_lean_versions()["trafilatura"]
    assert warnings == [
        f"tokenmill: WARNING: extractor lean is proven on {proven} only, and trafilatura {installed} is installed:"
        " extracting with trafilatura instead"
    ]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["extractor"] == "trafilatura"
    assert manifest["counts"] == {"in": 5, "kept": 5, "rejected": {}}


def test_an_extractor_that_cannot_start_stops_the_stage_in_one_line(tmp_path, monkeypatch, capsys):
    """A trafilatura release without a private name lean imports (the drift a new release can
    bring): the stage stops with one line naming the cause, where it used to exit 0 with every
    page rejected as extract.error."""
    from tokenmill.cli import main

    # The extractor's child process starts with its worker's import path, and runs this first.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import trafilatura.main_extractor as m\ndel m._elem_text\n")
    monkeypatch.syspath_prepend(str(site))
    output = tmp_path / "out"
    status = main(["curate", "extract", "--input", str(five_pages(tmp_path / "docs")), "--output", str(output),
                   "--workers", "1"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 1
    assert err.splitlines() == [
        "tokenmill: error: the lean extractor cannot start: ImportError: cannot import name '_elem_text' from"
        f" 'trafilatura.main_extractor' ({Path(__import__('trafilatura').__file__).parent / 'main_extractor.py'})"
    ], err
    assert not output.exists()


def test_the_trafilatura_extractor_reads_no_private_name():
    """trafilatura's own extractor, lean's fallback under a release lean was not proven on,
    loads none of the private names lean reads, which such a release may have dropped."""
    code = (
        "from tokenmill.curate.extract import html_text, reference\n"
        f"assert 'A sentence of text.' in html_text.EXTRACTORS['trafilatura']({ARTICLE_PAGE!r})\n"
        "print(sorted(set(reference._INTERNALS) & set(vars(reference))))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_trafilatura_and_justext_are_imported_by_one_module():
    """Every import of trafilatura or jusText in tokenmill is in curate/extract/reference.py, so
    the names a new release may drop are listed in one place."""
    package = Path(tokenmill.__file__).parent
    importers = set()
    for path in package.rglob("*.py"):
        source = path.read_text()
        if "trafilatura" not in source and "justext" not in source:
            continue  # parsing only the modules that name them keeps this fast
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            else:
                continue
            if any(module.split(".")[0] in ("trafilatura", "justext") for module in modules):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"curate/extract/reference.py"}
