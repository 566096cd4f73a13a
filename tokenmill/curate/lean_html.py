"""The `lean` HTML -> main text extractor: trafilatura's extraction in fast mode (comments
excluded), its attribute rules matched in Python instead of XPath.

Trafilatura finds the content frame and prunes boilerplate with XPath expressions full of
`re:test(@class, ...)`; lxml answers every such call through a Python callback, for every
candidate element, present attribute or not, and those passes take most of trafilatura's time on
a typical page. Here the same rules (the same token vocabularies, imported from trafilatura) are
matched with compiled regular expressions in one walk over the elements, reading only the
attributes an element has. Everything else is trafilatura's own code: tree cleaning, tag
conversion, link-density pruning, the text handlers and the text output. The cascade is
trafilatura's for fast mode (main extractor, wild-text recovery, baseline rescue, recall retry).

Before trafilatura sees the tree, the subtrees its cleaning deletes anyway (scripts, styles,
navigation, <head>, ...) are dropped in one C-level pass, so every later pass walks fewer nodes.
"""

from __future__ import annotations

import re
from copy import copy, deepcopy
from typing import Any

from lxml import etree
from lxml import html as lxml_html
from lxml.etree import Element, strip_elements, strip_tags
from trafilatura import xpaths as trafilatura_xpaths
from trafilatura.baseline import baseline
from trafilatura.core import ESCALATION_ACCEPT_RATIO, ESCALATION_MAX_LENGTH, ESCALATION_PAGE_SHARE
from trafilatura.htmlprocessing import (
    convert_tags,
    delete_by_link_density,
    link_density_test_tables,
    process_node,
    tree_cleaning,
)
from trafilatura.main_extractor import NOT_AT_THE_END, REBUILT_BLOCKS, _elem_text, handle_textelem
from trafilatura.settings import (
    DEDUPE_SCAN_CAP,
    INLINE_FORMATTABLE,
    MIN_DUPLICATE_LENGTH,
    TAG_CATALOG,
    Extractor,
)
from trafilatura.utils import SPACING_PROTECTED, normalize_unicode, text_chars_test, trim
from trafilatura.xml import delete_element, xmltotxt

# ---------------------------------------------------------------------------------------------
# Parsing

# Tags whose whole subtree trafilatura's tree cleaning deletes (or that carry no text).
DROPPED_TAGS = (
    "head",
    "script",
    "style",
    "svg",
    "noscript",
    "iframe",
    "template",
    "nav",
    "footer",
    "aside",
    "select",
    "button",
    "embed",
    "object",
    "canvas",
    "video",
    "audio",
    "map",
    "menu",
    "link",
    "meta",
)
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
_parser: Any = None


def _html_parser() -> Any:
    global _parser
    if _parser is None:
        _parser = etree.HTMLParser(remove_comments=True, remove_pis=True, default_doctype=False)
        # lxml.html's own parser picks each element's class in a Python callback; a fixed class
        # (trafilatura needs HtmlElement's text_content) is chosen in C.
        _parser.set_element_class_lookup(etree.ElementDefaultClassLookup(element=lxml_html.HtmlElement))
    return _parser


def parse_html(html: str) -> Any:
    """The page's lxml tree without the subtrees trafilatura would delete (None: nothing to parse)."""
    # lxml refuses a str that declares its encoding (XHTML's `<?xml ... encoding="utf-8"?>`).
    html = _XML_DECLARATION.sub("", html, count=1)
    try:
        tree = lxml_html.document_fromstring(html, parser=_html_parser())
    except etree.ParserError:  # nothing parseable (e.g. only whitespace)
        return None
    strip_elements(tree, *DROPPED_TAGS, with_tail=False)
    return tree


# ---------------------------------------------------------------------------------------------
# Trafilatura's XPath rules as Python predicates. XPath's string(@a|@b) is the value of whichever
# attribute comes first in the source, hence _first_of.


def _first_of(attrib: Any, a: str, b: str) -> str:
    value_a, value_b = attrib.get(a), attrib.get(b)
    if value_a is None or value_b is None:
        return value_a or value_b or ""
    for key in attrib:
        if key == a:
            return value_a
        if key == b:
            return value_b
    return ""


def _any(tokens: tuple[str, ...], flags: int = 0) -> re.Pattern[str]:
    return re.compile("|".join(tokens), flags)


_X = trafilatura_xpaths

# RAW_TREE_PRUNE_XPATH: infinite-scroll containers of appended articles, share-button bars.
_APPENDED = re.compile("mvp-post-add-(?:box|wrap)|infinite-?scroll")
_APPENDED_ALWAYS = re.compile("mvp-post-add-(?:box|wrap)")
# REMOVE_COMMENTS_AND_LISTS_XPATH
_COMMENTS_ID = re.compile(f"^(?:{_X._COMMENTS_ID}|disqus_thread|dsq-comments)")
_COMMENTS_LIST_ID = re.compile(f"^(?:{_X._COMMENTS_ID})")
_COMMENTS_CLASS = re.compile(_X._COMMENTS_CLASS)


def raw_tree_boilerplate(tree: Any) -> list:
    """What RAW_TREE_PRUNE_XPATH and REMOVE_COMMENTS_AND_LISTS_XPATH select: appended articles,
    share bars, comment sections (document order)."""
    doomed = []
    for element in tree.iter("div", "section", "aside", "details", "ol", "ul"):
        id_, class_ = element.get("id", ""), element.get("class", "")
        if not (id_ or class_):
            continue
        tag = element.tag
        if tag in ("div", "section", "aside") and (
            (
                (_APPENDED.search(id_) or _APPENDED.search(class_))
                and (element.find(".//h1") is None or _APPENDED_ALWAYS.search(id_) or _APPENDED_ALWAYS.search(class_))
            )
            or "elementor-share-buttons" in class_
        ):
            doomed.append(element)
        elif tag != "aside" and (
            _COMMENTS_CLASS.search(class_) or (_COMMENTS_LIST_ID if tag in ("ol", "ul") else _COMMENTS_ID).search(id_)
        ):
            doomed.append(element)
    return doomed


def prune_raw_tree(tree: Any) -> None:
    """Trafilatura's raw-tree prunes, in place (the tail text of a removed element stays)."""
    for element in raw_tree_boilerplate(tree):
        delete_element(element)


# OVERALL_DISCARD_XPATH, DISCARD_IMAGE_ELEMENTS and TEASER_DISCARD_XPATH (on the converted tree)
_SECTION_TAGS = frozenset(("div", "item", "list", "p", "section", "span"))
_CONSENT = _any(_X._CONSENT_ID_CLASS_TOKENS)
_DISCARD_ID = _any(_X._OVERALL_DISCARD_BOTH_TOKENS + _X._OVERALL_DISCARD_ID_TOKENS)
_DISCARD_CLASS = _any(_X._OVERALL_DISCARD_BOTH_TOKENS + _X._OVERALL_DISCARD_CLASS_TOKENS)
_HIDDEN_ID = re.compile("reader-comments|akismet")
_HIDDEN_CLASS = re.compile(
    "^hide-|comments-title|nocomments|-reply-|message|akismet|suggest-links|-hide-|hide-print| hidden| hide|noprint|notloaded"
)


def is_boilerplate(element: Any) -> bool:
    """Whether OVERALL_DISCARD_XPATH selects the element: navigation, ads, sharing, consent,
    meta data and hidden elements."""
    attrib = element.attrib
    id_, class_, style = attrib.get("id", ""), attrib.get("class", ""), attrib.get("style", "")
    if element.tag in _SECTION_TAGS and (
        "data-lp-replacement-content" in attrib
        or "nav" in attrib.get("role", "").replace("N", "n")
        or "MostPopularStories" in attrib.get("data-component", "")
        or _CONSENT.search(_first_of(attrib, "id", "class"))
        or _DISCARD_ID.search(id_)
        or _DISCARD_CLASS.search(class_)
    ):
        return True
    return (
        class_ == "comments-title"
        or _first_of(attrib, "id", "class").startswith("reply-")
        or "hidden" in _first_of(attrib, "id", "style")
        or "display:none" in style
        or "display: none" in style
        or bool(_HIDDEN_ID.search(id_))
        or bool(_HIDDEN_CLASS.search(class_))
        or attrib.get("aria-hidden") == "true"
    )


def _delete_all(elements: list) -> None:
    for element in elements:
        delete_element(element)


def section_matches(tree: Any) -> tuple[list, list, list]:
    """The descendants OVERALL_DISCARD_XPATH, DISCARD_IMAGE_ELEMENTS and TEASER_DISCARD_XPATH
    select (each in document order), in one walk."""
    boilerplate: list = []
    captions: list = []
    teasers: list = []
    for element in tree.iterdescendants(etree.Element):
        if not element.attrib:  # every rule tests an attribute
            continue
        if is_boilerplate(element):
            boilerplate.append(element)
        if element.tag in _SECTION_TAGS:
            id_, class_ = element.get("id", ""), element.get("class", "")
            if "caption" in id_ or "caption" in class_:
                captions.append(element)
            if "teaser" in id_.replace("T", "t") or "teaser" in class_.replace("T", "t"):
                teasers.append(element)
    return boilerplate, captions, teasers


def prune_sections(tree: Any, potential_tags: set[str], options: Extractor, keep_teasers: bool = False) -> Any:
    """trafilatura.main_extractor.prune_unwanted_sections for the balanced and recall focus."""
    boilerplate, captions, teasers = section_matches(tree)
    # trafilatura's guard: prune nothing when that would remove more than 6/7 of the text
    if boilerplate:
        matched = set(boilerplate)
        outer = [e for e in boilerplate if not any(a in matched for a in e.iterancestors())]
        old_len = len(tree.text_content())
        if old_len - sum(len(e.text_content()) for e in outer) > old_len / 7:
            _delete_all(outer)
    if "graphic" not in potential_tags:
        _delete_all(captions)
    if options.focus != "recall" and not keep_teasers:
        _delete_all(teasers)
    for _ in range(2):
        tree = delete_by_link_density(tree, "div", backtracking=True)
        tree = delete_by_link_density(tree, "list", backtracking=False)
        tree = delete_by_link_density(tree, "p", backtracking=False)
    if "table" in potential_tags:
        for element in [e for e in tree.iter("table") if link_density_test_tables(e) is True]:
            delete_element(element, keep_tail=False)
    strip_tags(tree, "span", *(() if "ref" in potential_tags else ("ref",)))
    return tree


# BODY_XPATH: the candidate content frames, tried in order.
_FRAME_TAGS = ("article", "div", "main", "section")
_ARTICLE_ID = _any(_X._ARTICLE_CONTENT_ID_TOKENS)
_ARTICLE_CLASS = _any(_X._ARTICLE_CONTENT_CLASS_TOKENS)
_STORY_ID = _any(_X._STORY_ID_TOKENS)
_STORY_CLASS = _any(_X._STORY_CLASS_TOKENS)
_FULLTEXT = re.compile("fulltext", re.I)
_MAIN_ID = _any(_X._MAIN_CONTENT_ID_TOKENS)
_MAIN_CLASS = _any(_X._MAIN_CONTENT_CLASS_TOKENS)


def _article_frame(element: Any) -> bool:
    class_, id_ = element.get("class", ""), element.get("id", "")
    return bool(
        class_ in ("post", "entry")
        or element.get("itemprop") == "articleBody"
        or id_ == "articleContent"
        or _ARTICLE_ID.search(id_)
        or _ARTICLE_CLASS.search(class_)
    )


def _story_frame(element: Any) -> bool:
    class_, id_ = element.get("class", ""), element.get("id", "")
    return bool(
        element.get("role") == "article"
        or id_ in ("article", "story")
        or class_ in ("postarea", "art-postcontent", "text", "cell", "story")
        or _STORY_ID.search(id_)
        or _FULLTEXT.search(class_)
        or _STORY_CLASS.search(class_)
    )


def _main_content_frame(element: Any) -> bool:
    class_, id_ = element.get("class", ""), element.get("id", "")
    return bool(
        id_ == "content"
        or class_ == "content"
        or _MAIN_ID.search(id_)
        or _MAIN_CLASS.search(class_)
        or "main-content" in id_.replace("C", "c").replace("M", "m")
        or "main-content" in class_.replace("C", "c").replace("M", "m")
        or "page-content" in class_.replace("C", "c").replace("P", "p")
    )


def _main_frame(element: Any) -> bool:
    return element.tag == "main" or any(element.get(name, "").startswith("main") for name in ("class", "id", "role"))


_FRAME_RULES = (_article_frame, None, _story_frame, _main_content_frame, _main_frame)


def content_frame(tree: Any, rule: int) -> Any:
    """The first element (document order) that BODY_XPATH[rule] selects, or None."""
    if _FRAME_RULES[rule] is None:
        return tree.find(".//article")
    match = _FRAME_RULES[rule]
    return next((e for e in tree.iterdescendants(*_FRAME_TAGS) if match(e)), None)


# ---------------------------------------------------------------------------------------------
# trafilatura.main_extractor's _extract, extract_content and recover_wild_text, with the rules
# above (control flow unchanged, the balanced and recall focus only). Adapted from trafilatura
# 2.3.1 (Apache License 2.0, copyright Adrien Barbaresi); pyproject.toml bounds the version to
# the minor release they follow, and tests/curate/test_lean_html.py checks them against it.


def _extract(tree: Any, options: Extractor) -> tuple[Any, str]:
    potential_tags = set(TAG_CATALOG) | {"table", "td", "th", "tr"}
    result_body = Element("body")
    for rule in range(len(_FRAME_RULES)):
        subtree = content_frame(tree, rule)
        if subtree is None:
            continue
        subtree = prune_sections(subtree, potential_tags, options)
        if len(subtree) == 0:
            continue
        # no paragraphs containing text, or not enough
        ptest = subtree.xpath("//p//text()")
        if not ptest or len("".join(ptest)) < options.min_extracted_size * 3:
            potential_tags.add("div")
        subelems = subtree.xpath(".//*")
        # a single text run (only lb or inline elements): process the frame itself
        tags = {e.tag for e in subelems}
        if tags == {"lb"} or (subtree.tag == "div" and "div" in potential_tags and tags <= INLINE_FORMATTABLE | {"lb"}):
            subelems = [subtree]
        # the frame's own text before its first child, kept if the frame is accepted
        lead, start = None, len(result_body)
        if subelems != [subtree] and text_chars_test(subtree.text):
            lead = Element("p")
            lead.text = subtree.text
            lead = process_node(lead, options)
        for elem in subelems:
            # an element already moved into the result with an emitted ancestor
            if elem.getroottree().getroot() is result_body:
                continue
            tag, tail = elem.tag, elem.tail
            processed_elem = handle_textelem(elem, potential_tags, options)
            if processed_elem is not None:
                result_body.append(processed_elem)
                if elem.getroottree().getroot() is not result_body:
                    elem.tag = "done"
            # text right after a rebuilt block is a paragraph of its own
            if (
                tag in REBUILT_BLOCKS
                and text_chars_test(tail)
                and (processed_elem is None or processed_elem.tail is None)
            ):
                tail_elem = Element("p")
                tail_elem.text = tail
                if process_node(tail_elem, options) is not None:
                    result_body.append(tail_elem)
        while len(result_body) > 0 and (result_body[-1].tag in NOT_AT_THE_END):
            delete_element(result_body[-1], keep_tail=False)
        # exit once there is real content, not just a lone image
        if sum(e.tag != "graphic" for e in result_body) > 1:
            if lead is not None:
                result_body.insert(start, lead)
            break
    return result_body, " ".join(result_body.itertext()).strip()


def _recover_wild_text(tree: Any, result_body: Any, options: Extractor, consumed: set) -> Any:
    potential_tags = set(TAG_CATALOG) | {"table", "td", "th", "tr"}
    search_expr = ".//code|.//p|.//quote|.//table|.//div[contains(@class, 'w3-code')]"
    if options.focus == "recall":
        potential_tags.update(["div", "lb"])
        search_expr += "|.//div|.//lb|.//list"
    search_tree = prune_sections(tree, potential_tags, options, keep_teasers=True)
    subelems = search_tree.xpath(search_expr)
    elem_texts = [_elem_text(el) for el in result_body]
    existing = "\n".join(filter(None, elem_texts))
    existing_elems = set(elem_texts)
    handled: set = set()
    for subelem in subelems:
        if subelem in consumed or any(a in handled for a in subelem.iterancestors()):
            continue
        processed = handle_textelem(subelem, potential_tags, options)
        if processed is None:
            continue
        if processed is subelem:
            handled.add(subelem)
        text = _elem_text(processed)
        images = {img.get("src") for img in processed.iter("graphic")}
        if not text and images and images <= {g.get("src") for g in result_body.iter("graphic")}:
            continue
        under_cap = len(existing) <= DEDUPE_SCAN_CAP
        fragment = trim(text + (processed.tail or "")) if text_chars_test(processed.tail) else ""
        if text and (
            text in existing_elems
            or (
                under_cap
                and ((len(text) > MIN_DUPLICATE_LENGTH and text in existing) or (fragment and fragment in existing))
            )
        ):
            continue
        result_body.append(processed)
        if under_cap:
            existing += "\n" + (fragment or text)
        existing_elems.add(text)
    return result_body


def extract_content(cleaned_tree: Any, options: Extractor) -> tuple[Any, str]:
    """The main extractor on a cleaned, converted tree: (result body, its text)."""
    backup_tree = deepcopy(cleaned_tree)
    order = list(cleaned_tree.iter())
    result_body, temp_text = _extract(cleaned_tree, options)
    # wild <p> elements when nothing or too little was found
    if len(result_body) == 0 or len(temp_text) < options.min_extracted_size:
        consumed = {twin for elem, twin in zip(order, backup_tree.iter(), strict=True) if elem.tag == "done"}
        result_body = _recover_wild_text(backup_tree, result_body, options, consumed)
        temp_text = " ".join(result_body.itertext()).strip()
    # drop substantial elements repeating the previous one
    previous = None
    for el in list(result_body):
        current = _elem_text(el)
        if current and current == previous and len(current) > MIN_DUPLICATE_LENGTH:
            delete_element(el, keep_tail=False)
        else:
            previous = current
    strip_elements(result_body, "done")
    strip_tags(result_body, "div")
    # an <lb> that only separated pruned blocks keeps no whitespace-only tail (outside code/pre)
    for linebreak in result_body.iter("lb"):
        if (
            linebreak.tail
            and not text_chars_test(linebreak.tail)
            and not any(anc.tag in SPACING_PROTECTED for anc in linebreak.iterancestors())
        ):
            linebreak.tail = None
    return result_body, temp_text


# ---------------------------------------------------------------------------------------------
# The cascade

OPTIONS = Extractor(output_format="txt", fast=True, comments=False)
RECALL_OPTIONS = copy(OPTIONS)
RECALL_OPTIONS.focus = "recall"


def _extract_tree(tree: Any, options: Extractor) -> tuple[Any, str]:
    # tree_cleaning and convert_tags change the tree in place; callers pass a tree they own
    return extract_content(convert_tags(tree_cleaning(tree, options), options), options)


def extract_text(html: str) -> str | None:
    """The page's main text (None when there is none)."""
    try:
        return _extract_text(html)
    except (TypeError, ValueError):  # what trafilatura's extract() takes as "no text" too
        return None


def _extract_text(html: str) -> str | None:
    tree = parse_html(html)
    if tree is None:
        return None
    prune_raw_tree(tree)
    # the page's text length, for the recall retry below (trafilatura measures it with html2txt)
    page = tree.find("body")
    page_chars = len(" ".join((tree if page is None else page).text_content().split()))
    # the main pass consumes the tree: the rescues below parse the page again, which costs less
    # than copying every tree for the few pages that need one
    body, text = _extract_tree(tree, OPTIONS)
    raw = None
    if len(text) < OPTIONS.min_extracted_size:
        raw = parse_html(html)
        prune_raw_tree(raw)
        b_body, b_text, b_len = baseline(raw)  # baseline copies its input
        if b_len > len(text):
            body, text = b_body, b_text
    # a short extraction covering little of the page: retry in recall mode, keep if clearly longer
    if 0 < len(text) < ESCALATION_MAX_LENGTH and len(text) < ESCALATION_PAGE_SHARE * page_chars:
        if raw is None:
            raw = parse_html(html)
            prune_raw_tree(raw)
        r_body, r_text = _extract_tree(raw, RECALL_OPTIONS)
        if len(r_text) >= OPTIONS.min_extracted_size and len(r_text) > ESCALATION_ACCEPT_RATIO * len(text):
            body, text = r_body, r_text
    if len(text) < OPTIONS.min_output_size:
        return None
    return normalize_unicode(xmltotxt(body, OPTIONS.formatting))
