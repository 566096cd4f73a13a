"""HTML -> main text: the extractors, page titles, cheap checks for binary and oversized pages,
a child process that extracts under a time limit, and the article-extraction benchmark's metric.

This module imports no data-frame library, so the extractor child starts fast; the `extract`
curate stage (tokenmill/curate/extract/stage.py) is built on it.
"""

from __future__ import annotations

import functools
import html as html_lib
import logging
import os
import pickle
import re
import select
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from tokenmill.curate.extract.reference import trafilatura_text
from tokenmill.errors import TokenmillError

# The MIME types of HTML pages: what a web archive keeps as a page and `extract` extracts.
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml", "application/vnd.wap.xhtml+xml"})

# ---------------------------------------------------------------------------------------------
# Extractors: html -> main text (None or "" when the page has none). They run in the child.


def _lean(html: str) -> str | None:
    # trafilatura's default path with its XPath rules matched in Python, its readability and
    # jusText comparison run only where it can change the result (tokenmill/curate/extract/lean_html.py)
    from tokenmill.curate.extract.lean_html import extract_text

    return extract_text(html)


def _lean_fast(html: str) -> str | None:
    # trafilatura's fast mode (no readability and jusText comparison), the same way
    from tokenmill.curate.extract.lean_html import extract_text

    return extract_text(html, fast=True)


# Resiliparse's main-content heuristics keep comment sections, post meta data (bylines, dates,
# tags), image alt texts and list bullets by default; none of them is article text, and turning
# them off raises its precision on the extraction benchmark from 0.830 to 0.892 at equal recall.
RESILIPARSE_OPTIONS = {
    "main_content": True,
    "comments": False,
    "post_meta": False,
    "alt_texts": False,
    "list_bullets": False,
}


def _resiliparse(html: str) -> str | None:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return extract_plain_text(HTMLTree.parse(html), **RESILIPARSE_OPTIONS)


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "lean": _lean,
    "lean-fast": _lean_fast,
    "trafilatura": trafilatura_text,
    "resiliparse": _resiliparse,
}
DEFAULT_EXTRACTOR = "lean"

# The releases on which lean and lean-fast were proven to give trafilatura's text
# (tests/curate/test_lean_html.py): they read trafilatura's and jusText's internal names, which
# any release may rename or remove. Under other versions they give way to `LEAN_FALLBACK`.
LEAN_PROVEN_VERSIONS = {"trafilatura": "2.3.1", "jusText": "3.0.2"}
LEAN_EXTRACTORS = ("lean", "lean-fast")
LEAN_FALLBACK = "trafilatura"


def unproven_lean_versions() -> dict[str, str]:
    """The installed versions of lean's libraries that differ from `LEAN_PROVEN_VERSIONS`
    (name -> installed version, "not installed" when absent); empty where lean is proven."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name, proven in LEAN_PROVEN_VERSIONS.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "not installed"
        if installed != proven:
            found[name] = installed
    return found


def usable_extractor(extractor: str) -> str:
    """`extractor`, or `LEAN_FALLBACK` in place of a lean extractor whose libraries are not the
    versions it was proven on (with a one-line warning, once per process)."""
    if extractor not in LEAN_EXTRACTORS:
        return extractor
    unproven = unproven_lean_versions()
    if not unproven:
        return extractor
    _warn_unproven_lean(
        extractor,
        ", ".join(f"{name} {installed}" for name, installed in sorted(unproven.items())),
    )
    return LEAN_FALLBACK


@functools.cache  # once per process, however many stages ask
def _warn_unproven_lean(extractor: str, installed: str) -> None:
    proven = ", ".join(f"{name} {version}" for name, version in LEAN_PROVEN_VERSIONS.items())
    logging.getLogger(__name__).warning(
        "extractor %s is proven on %s only, and %s is installed: extracting with %s instead",
        extractor,
        proven,
        installed,
        LEAN_FALLBACK,
    )


_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.S | re.I)
_OG_TITLE = re.compile(r"""<meta\b[^>]*property\s*=\s*["']og:title["'][^>]*>""", re.I)
_CONTENT_ATTR = re.compile(r"""content\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)
_TAG = re.compile(r"<[^>]*>")
# The title lives in <head>; bounding the search keeps a page without one from costing a full scan.
TITLE_SEARCH_CHARS = 200_000


def page_title(html: str) -> str | None:
    """The page's <title> (else its og:title), entities decoded and whitespace collapsed."""
    head = html[:TITLE_SEARCH_CHARS]
    match = _TITLE.search(head)
    raw = match.group(1) if match else None
    if not raw or not raw.strip():
        meta = _OG_TITLE.search(head)
        content = _CONTENT_ATTR.search(meta.group(0)) if meta else None
        raw = (content.group(1) or content.group(2)) if content else None
    if raw is None:
        return None
    title = " ".join(html_lib.unescape(_TAG.sub(" ", raw)).split())
    return title or None


def extract_page(extractor: str, html: str) -> tuple[str | None, str]:
    """(title, main text) of one page with the named extractor, in this process (no limits)."""
    text = EXTRACTORS[extractor](html) or ""
    return page_title(html), text.strip()


# ---------------------------------------------------------------------------------------------
# Cheap checks before a page reaches an extractor.

# C0 controls other than tab, newline, form feed and carriage return, and the replacement
# character: HTML has almost none, binary data decoded as text is full of them.
_BINARY_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\ufffd]")
BINARY_SAMPLE_CHARS = 8_192
BINARY_FRACTION = 0.05


def is_binary(text: str) -> bool:
    """True when more than 5% of the first 8 KiB characters are control or replacement characters."""
    sample = text[:BINARY_SAMPLE_CHARS]
    return bool(sample) and len(_BINARY_CHARS.findall(sample)) > BINARY_FRACTION * len(sample)


def utf8_size_over(text: str, limit: int) -> bool:
    """Whether `text` takes more than `limit` bytes in UTF-8 (encoding only when it may)."""
    if len(text) > limit:
        return True
    return len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit


# ---------------------------------------------------------------------------------------------
# The child process: length-prefixed pickles over its stdin/stdout.

_HEADER = struct.Struct("<Q")


def _write_message(stream: Any, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read_exactly(stream: Any, n: int) -> bytes | None:
    chunks, remaining = [], n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_message(stream: Any) -> Any:
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        raise EOFError
    payload = _read_exactly(stream, _HEADER.unpack(header)[0])
    if payload is None:
        raise EOFError
    return pickle.loads(payload)


# Extracted once by each new child before it says it is ready: it imports the extractor's
# libraries, so the first real page's time limit does not pay for them.
WARM_UP_PAGE = "<html><head><title>t</title></head><body><article><p>warm up</p></article></body></html>"
# A child that has not loaded its extractor in this long has failed to start.
CHILD_START_TIMEOUT_S = 300.0


def serve_child(extractor: str) -> None:
    """The child's loop: load the extractor and say ("ready",), or ("failed", cause) and exit;
    then read a page and answer ("ok", title, text) or ("error", message), until EOF."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a library that prints must not corrupt the protocol
    try:
        extract_page(extractor, WARM_UP_PAGE)
    except Exception as error:
        # An extractor that fails on this page fails on every page (a library that no longer
        # has a name it imports): the stage stops, rather than reject every page.
        _write_message(stdout, ("failed", f"{type(error).__name__}: {error}"[:500]))
        return
    _write_message(stdout, ("ready",))
    while True:
        try:
            html = _read_message(stdin)
        except EOFError:
            return
        try:
            title, text = extract_page(extractor, html)
            answer: tuple = ("ok", title, text)
        except Exception as error:  # a page that breaks the extractor is one rejection, not a crash
            answer = ("error", f"{type(error).__name__}: {error}"[:500])
        _write_message(stdout, answer)


class ChildStartError(TokenmillError):
    """The extractor child failed, died or hung before it was ready: no page can be extracted,
    so the stage stops with this one line."""


class ExtractorProcess:
    """One child process that extracts pages one at a time under a wall-clock time limit.

    The child is started on first use, replaced after `recycle_after` pages (bounding the
    memory libxml2 and lxml accumulate), and killed when a page exceeds `timeout` seconds. The
    limit counts from when the page is sent to a child that has loaded its extractor: starting
    Python and importing the extractor's libraries (seconds on a busy machine) is not the page's."""

    def __init__(self, extractor: str, *, timeout: float, recycle_after: int) -> None:
        self.extractor = extractor
        self.timeout = timeout
        self.recycle_after = recycle_after
        self._child: subprocess.Popen | None = None
        self._served = 0
        self.started = 0  # children started so far (for stats and tests)

    def _start(self) -> subprocess.Popen:
        # The child imports tokenmill from wherever this process does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from tokenmill.curate.extract.html_text import serve_child; serve_child(sys.argv[1])"
        child = subprocess.Popen(
            [sys.executable, "-c", code, self.extractor],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._served = 0
        self.started += 1
        ready, _, _ = select.select([child.stdout], [], [], CHILD_START_TIMEOUT_S)
        cause = f"it did not start within {CHILD_START_TIMEOUT_S:g} s"
        try:
            if ready:
                answer = _read_message(child.stdout)
                if answer == ("ready",):
                    return child
                cause = " ".join(answer[1].split())  # one line, whatever the library said
        except (EOFError, OSError, pickle.UnpicklingError):
            cause = f"its process exited while starting (exit status {child.poll()})"
        child.kill()
        child.wait()
        child.stdin.close()  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]
        raise ChildStartError(f"the {self.extractor} extractor cannot start: {cause}")

    def close(self) -> None:
        """Stop the child (it exits on end of input; killed if it does not)."""
        child, self._child = self._child, None
        if child is None:
            return
        try:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
            child.wait()
        child.stdout.close()  # type: ignore[union-attr]

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass

    def extract(self, html: str) -> tuple[str, str | None, str]:
        """("ok", title, text), or (reason, None, detail) with reason `extract.timeout` /
        `extract.error`; `ChildStartError` when no child can start."""
        if self._child is not None and self._served >= self.recycle_after:
            self.close()
        if self._child is None:
            self._child = self._start()
        child = self._child
        self._served += 1
        try:
            _write_message(child.stdin, html)
        except (BrokenPipeError, OSError):
            self._kill()
            return "extract.error", None, "the extractor process died"
        ready, _, _ = select.select([child.stdout], [], [], self.timeout)
        if not ready:
            self._kill()
            return "extract.timeout", None, f"over {self.timeout:g} s"
        try:
            answer = _read_message(child.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            self._kill()
            return "extract.error", None, "the extractor process died"
        if answer[0] == "ok":
            return answer
        return "extract.error", None, answer[1]


# ---------------------------------------------------------------------------------------------
# The article-extraction benchmark's metric (scrapinghub/article-extraction-benchmark)

_WORD = re.compile(r"\w+")
SHINGLE_WORDS = 4


def word_shingles(text: str | None, n: int = SHINGLE_WORDS) -> Counter[tuple[str, ...]]:
    """The multiset of word n-grams of `text` (words: the `\\w+` matches); a text of fewer
    than n words is one shorter shingle, as the benchmark counts it."""
    words = _WORD.findall(text or "")
    return Counter(tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1)) if words[i : i + n])


def page_match(true: str | None, predicted: str | None) -> tuple[int, int, int]:
    """(TP, FP, FN) of one page: shared shingles, predicted surplus, true surplus (multisets)."""
    truth, prediction = word_shingles(true), word_shingles(predicted)
    return sum((truth & prediction).values()), sum((prediction - truth).values()), sum((truth - prediction).values())


def extraction_scores(pairs: Iterable[tuple[str | None, str | None]]) -> dict[str, float]:
    """The benchmark's precision, recall and F1 over (true text, extracted text) pairs: the mean
    per-page precision (pages with TP + FP > 0) and recall (pages with TP + FN > 0), a page with
    FP = FN = 0 scoring 1, and F1 = 2PR / (P + R) of the two means."""
    precisions: list[float] = []
    recalls: list[float] = []
    for true, predicted in pairs:
        tp, fp, fn = page_match(true, predicted)
        if tp + fp > 0:
            precisions.append(1.0 if fp == fn == 0 else tp / (tp + fp))
        if tp + fn > 0:
            recalls.append(1.0 if fp == fn == 0 else tp / (tp + fn))
    precision = sum(precisions) / len(precisions) if precisions else 0.0
    recall = sum(recalls) / len(recalls) if recalls else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
