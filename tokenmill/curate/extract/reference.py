"""trafilatura and jusText, the reference the extractors are measured against: the one module
of tokenmill that imports them.

`trafilatura_text` is trafilatura's public extraction: the `trafilatura` extractor, and the
lean extractors' fallback under releases they were not proven on, so it reads no internal name.
Every other name here is an internal of trafilatura or jusText that the lean extractors reuse
(`_INTERNALS`, on the releases of `html_text.LEAN_PROVEN_VERSIONS`). Each is imported on first
use (PEP 562), so a release that drops one stops lean's import with the usual `cannot import
name` error, never the `trafilatura` extractor, and loading this module costs nothing until an
extractor runs.
"""

from __future__ import annotations

import importlib
from typing import Any


def trafilatura_text(html: str) -> str | None:
    """trafilatura's main text of a page (its default mode, comments excluded)."""
    import trafilatura

    return trafilatura.extract(html, include_comments=False)


# The internals lean reads: its name for each -> "module:attribute", or "module" for a module.
_INTERNALS = {
    "trafilatura_xpaths": "trafilatura.xpaths",
    "trafilatura_external": "trafilatura.external",
    "BASELINE_BLOCK_ELEMS": "trafilatura.baseline:_BLOCK_ELEMS",
    "baseline": "trafilatura.baseline:baseline",
    "ESCALATION_ACCEPT_RATIO": "trafilatura.core:ESCALATION_ACCEPT_RATIO",
    "ESCALATION_JUSTEXT_RATIO": "trafilatura.core:ESCALATION_JUSTEXT_RATIO",
    "ESCALATION_MAX_LENGTH": "trafilatura.core:ESCALATION_MAX_LENGTH",
    "ESCALATION_PAGE_SHARE": "trafilatura.core:ESCALATION_PAGE_SHARE",
    "_forum_thread_page": "trafilatura.core:_forum_thread_page",
    "JUSTEXT_OVERRIDE_RATIO": "trafilatura.external:JUSTEXT_OVERRIDE_RATIO",
    "SANITIZED_XPATH": "trafilatura.external:SANITIZED_XPATH",
    "_prefer_readability": "trafilatura.external:_prefer_readability",
    "CODE_INDICATORS": "trafilatura.htmlprocessing:CODE_INDICATORS",
    "CONVERSIONS": "trafilatura.htmlprocessing:CONVERSIONS",
    "PRESERVE_IMG_CLEANING": "trafilatura.htmlprocessing:PRESERVE_IMG_CLEANING",
    "REND_TAG_MAPPING": "trafilatura.htmlprocessing:REND_TAG_MAPPING",
    "is_paragraph_listing": "trafilatura.htmlprocessing:is_paragraph_listing",
    "process_node": "trafilatura.htmlprocessing:process_node",
    "prune_html": "trafilatura.htmlprocessing:prune_html",
    "recover_math": "trafilatura.htmlprocessing:recover_math",
    "trafilatura_convert_tags": "trafilatura.htmlprocessing:convert_tags",
    "NOT_AT_THE_END": "trafilatura.main_extractor:NOT_AT_THE_END",
    "REBUILT_BLOCKS": "trafilatura.main_extractor:REBUILT_BLOCKS",
    "_elem_text": "trafilatura.main_extractor:_elem_text",
    "handle_image": "trafilatura.main_extractor:handle_image",
    "handle_textelem": "trafilatura.main_extractor:handle_textelem",
    "Candidate": "trafilatura.readability_lxml:Candidate",
    "DIV_TO_P_PREFIXES": "trafilatura.readability_lxml:DIV_TO_P_PREFIXES",
    "Document": "trafilatura.readability_lxml:Document",
    "LIST_TAGS": "trafilatura.readability_lxml:LIST_TAGS",
    "READABILITY_REGEXES": "trafilatura.readability_lxml:REGEXES",
    "TAG_SCORES": "trafilatura.readability_lxml:TAG_SCORES",
    "text_length": "trafilatura.readability_lxml:text_length",
    "COOKIE_CONSENT_RE": "trafilatura.settings:_COOKIE_CONSENT_RE",
    "DEDUPE_SCAN_CAP": "trafilatura.settings:DEDUPE_SCAN_CAP",
    "Extractor": "trafilatura.settings:Extractor",
    "INLINE_FORMATTABLE": "trafilatura.settings:INLINE_FORMATTABLE",
    "JUSTEXT_LANGUAGES": "trafilatura.settings:JUSTEXT_LANGUAGES",
    "MANUALLY_CLEANED": "trafilatura.settings:MANUALLY_CLEANED",
    "MANUALLY_STRIPPED": "trafilatura.settings:MANUALLY_STRIPPED",
    "MIN_DUPLICATE_LENGTH": "trafilatura.settings:MIN_DUPLICATE_LENGTH",
    "TAG_CATALOG": "trafilatura.settings:TAG_CATALOG",
    "DOCTYPE_TAG": "trafilatura.utils:DOCTYPE_TAG",
    "FAULTY_HTML": "trafilatura.utils:FAULTY_HTML",
    "INVALID_XML_CHARS": "trafilatura.utils:INVALID_XML_CHARS",
    "LINK_FARM_RATIO": "trafilatura.utils:LINK_FARM_RATIO",
    "SPACING_PROTECTED": "trafilatura.utils:SPACING_PROTECTED",
    "fromstring_bytes": "trafilatura.utils:fromstring_bytes",
    "normalize_unicode": "trafilatura.utils:normalize_unicode",
    "remove_control_characters": "trafilatura.utils:remove_control_characters",
    "text_chars_test": "trafilatura.utils:text_chars_test",
    "trim": "trafilatura.utils:trim",
    "TEI_VALID_TAGS": "trafilatura.xml:TEI_VALID_TAGS",
    "delete_element": "trafilatura.xml:delete_element",
    "process_element": "trafilatura.xml:process_element",
    "unescape": "trafilatura.xml:unescape",
    "xmltotxt": "trafilatura.xml:xmltotxt",
    "PARAGRAPH_TAGS": "justext.core:PARAGRAPH_TAGS",
    "revise_paragraph_classification": "justext.core:revise_paragraph_classification",
    "JustextParagraph": "justext.paragraph:Paragraph",
    "get_stoplist": "justext.utils:get_stoplist",
}


def __getattr__(name: str) -> Any:
    if name not in _INTERNALS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, attribute = _INTERNALS[name].partition(":")
    module = importlib.import_module(module_name)
    if not attribute:
        value = module
    elif hasattr(module, attribute):
        value = getattr(module, attribute)
    else:
        # the message Python gives for `from MODULE import ATTRIBUTE`, naming the release's file
        raise ImportError(f"cannot import name {attribute!r} from {module_name!r} ({module.__file__})")
    globals()[name] = value  # resolved once
    return value
