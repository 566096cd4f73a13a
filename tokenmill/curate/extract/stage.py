"""Extract: HTML pages -> the main text of each page (boilerplate, menus and comments removed).

Documents whose `content_type` is an HTML type (all documents when there is no such column,
or where it is empty) get `text` replaced by the page's main text and a `title`; other
documents (WET text, plain text) pass through unchanged. Every other column is kept.

Extraction runs in a child process per Dask worker, one page at a time: a page that takes
longer than `timeout` seconds kills the child (`extract.timeout`), a child that dies is
replaced (`extract.error`), a child that cannot load its extractor stops the stage, and the child is recycled after `recycle_after` pages so that
memory held by lxml and libxml2 on long runs is returned. Pages larger than `max_bytes`
(`extract.too_large`) or that are binary data (`extract.binary`) never reach an extractor.

Extractors (`EXTRACTORS`):
- `trafilatura`: trafilatura's full path (with its readability and jusText fallbacks),
  comments excluded: the quality reference.
- `lean` (default): trafilatura's text (its default mode). The page is parsed once by lxml
  with comments dropped, the subtrees that trafilatura discards anyway (scripts, styles,
  navigation, footers, asides, forms' widgets, embedded media) stripped in C by
  `lxml.etree.strip_elements`, then trafilatura's passes run on that smaller tree with its
  attribute rules matched in Python instead of XPath (tokenmill/curate/extract/lean_html.py); the
  comparison with readability and jusText, the baseline and the recall retry run on the page
  parsed again, unstripped, and only where a bound shows they can change the result.
- `lean-fast`: the same for trafilatura's fast mode (no readability and jusText comparison).
  Both run only under the trafilatura and jusText releases they were proven on
  (`html_text.LEAN_PROVEN_VERSIONS`); under others the stage warns and runs `trafilatura`.
- `resiliparse`: Resiliparse's `extract_plain_text` main-content mode on its lexbor parser, without
  comment sections, post meta data, alt texts and list bullets: about 13 times trafilatura's
  speed at F1 0.934 against the reference's 0.960 (more boilerplate kept).
"""

from __future__ import annotations

import atexit
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenmill.curate.extract.html_text import (
    DEFAULT_EXTRACTOR,
    EXTRACTORS,
    HTML_TYPES,
    ExtractorProcess,
    is_binary,
    usable_extractor,
    utf8_size_over,
)
from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

REASONS = {
    "extract.empty": "the page has no main text (an index, a login wall, a page of links or scripts only)",
    "extract.too_large": "the page is larger than {max_bytes} bytes",
    "extract.binary": "the page is binary data, not HTML",
    "extract.timeout": "extracting the page took longer than {timeout} seconds",
    "extract.error": "the extractor failed on the page (an exception, or its process died)",
}

# One child per worker process and configuration, reused across partitions.
_PROCESSES: dict[tuple[str, float, int], ExtractorProcess] = {}


def extractor_process(extractor: str, timeout: float, recycle_after: int) -> ExtractorProcess:
    key = (extractor, timeout, recycle_after)
    if key not in _PROCESSES:
        if not _PROCESSES:
            atexit.register(_close_processes)
        _PROCESSES[key] = ExtractorProcess(extractor, timeout=timeout, recycle_after=recycle_after)
    return _PROCESSES[key]


def _close_processes() -> None:
    """Stop the children when this process exits (they would also stop at end of input)."""
    for process in _PROCESSES.values():
        process.close()


def is_html_type(content_type: Any) -> bool:
    """An HTML MIME type (parameters and case ignored); a missing type counts as HTML."""
    if content_type is None or (isinstance(content_type, float) and content_type != content_type):
        return True
    mime = str(content_type).split(";", 1)[0].strip().lower()
    return mime == "" or mime in HTML_TYPES


# ---------------------------------------------------------------------------------------------
# The stage


@dataclass
class ExtractStage(StageOptions):
    extractor: str = option(
        DEFAULT_EXTRACTOR,
        cli={"choices": list(EXTRACTORS)},
        help=f"lean (default: trafilatura's text, on a pre-cleaned tree), lean-fast (trafilatura's fast mode),"
        f" trafilatura (the quality reference, slower) or resiliparse (fastest, keeps more boilerplate)"
        f" (default {DEFAULT_EXTRACTOR})",
    )
    max_bytes: int = option(
        4 * 1024 * 1024, help="reject pages larger than this many UTF-8 bytes as extract.too_large (default 4 MiB)"
    )
    timeout: float = option(
        20.0, help="reject a page whose extraction takes longer than this (seconds) as extract.timeout (default 20)"
    )
    recycle_after: int = option(
        1000, help="restart the extractor process after this many pages, returning its memory (default 1000)"
    )

    name = "extract"

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ConfigError(f"extractor must be one of {', '.join(EXTRACTORS)}, got {self.extractor!r}")
        # Before any page: lean under libraries it was not proven on gives way to trafilatura,
        # which the manifest then names as the extractor that ran.
        self.extractor = usable_extractor(self.extractor)
        if self.max_bytes <= 0:
            raise ConfigError(f"max_bytes must be > 0, got {self.max_bytes}")
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be > 0, got {self.timeout}")
        if self.recycle_after < 1:
            raise ConfigError(f"recycle_after must be >= 1, got {self.recycle_after}")

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        traf = ("trafilatura", "lxml", "jusText")
        libraries = {"lean": traf, "lean-fast": traf, "trafilatura": traf}
        return {name: version(name) for name in libraries.get(self.extractor, ("resiliparse",))}

    def process(self, docs: pd.DataFrame) -> Batch:
        import numpy as np
        import pandas as pd

        docs = docs.reset_index(drop=True)
        if "content_type" in docs.columns:
            html_mask = docs["content_type"].map(is_html_type).to_numpy(dtype=bool)
        else:
            html_mask = np.ones(len(docs), dtype=bool)
        stats: Counter[str] = Counter(passed_through=int((~html_mask).sum()))
        texts, titles, page_reasons = self._extract_all(docs["text"].to_numpy()[html_mask].tolist(), stats)
        reasons = np.full(len(docs), None, dtype=object)
        reasons[html_mask] = page_reasons
        rejected_mask = pd.notna(reasons)
        out = docs.copy()
        if "title" not in out.columns:
            out["title"] = pd.Series(None, index=out.index, dtype=object)
        out.loc[html_mask, "text"] = texts
        out.loc[html_mask, "title"] = titles
        stats["extracted"] = int(html_mask.sum() - rejected_mask.sum())
        return Batch(
            n_in=len(docs),
            kept=out[~rejected_mask],
            rejected=reject(docs[rejected_mask], pd.Series(reasons[rejected_mask], index=docs.index[rejected_mask])),
            stats=dict(stats),
        )

    def _extract_all(
        self, pages: Iterable[Any], stats: Counter[str]
    ) -> tuple[list[str | None], list[str | None], list[str | None]]:
        """Per page: text, title and rejection reason (None when kept)."""
        process = extractor_process(self.extractor, self.timeout, self.recycle_after)
        started = process.started
        texts: list[str | None] = []
        titles: list[str | None] = []
        reasons: list[str | None] = []
        for html in pages:
            reason, title, text = self._extract_one(process, html)
            if reason is None and not text:
                reason = "extract.empty"
            texts.append(text if reason is None else html)
            titles.append(title if reason is None else None)
            reasons.append(reason)
        stats["extractor_processes"] += process.started - started
        return texts, titles, reasons

    def _extract_one(self, process: ExtractorProcess, html: Any) -> tuple[str | None, str | None, str]:
        if not isinstance(html, str) or not html.strip():
            return "extract.empty", None, ""
        if utf8_size_over(html, self.max_bytes):
            return "extract.too_large", None, ""
        if is_binary(html):
            return "extract.binary", None, ""
        status, title, text = process.extract(html)
        if status != "ok":
            log.debug("extract: %s (%s)", status, text)
            return status, None, ""
        return None, title, text


STAGES = (
    Stage(
        "extract",
        ExtractStage,
        help="HTML pages -> main text and title (trafilatura, resiliparse, or the lean default)",
        description="Replace the HTML in `text` by the page's main text and add `title`, for documents whose"
        " content_type is HTML (all documents without that column); others pass through unchanged. Pages are"
        " extracted in a child process with a time limit; pages with no main text, too large, binary, too slow"
        " or that break the extractor are rejected (extract.empty, extract.too_large, extract.binary,"
        " extract.timeout, extract.error).",
    ),
)
