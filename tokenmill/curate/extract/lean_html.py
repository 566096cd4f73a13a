"""The `lean` HTML -> main text extractor: trafilatura's extraction in fast mode (comments
excluded), its attribute rules matched in Python instead of XPath.

Trafilatura finds the content frame and prunes boilerplate with XPath expressions full of
`re:test(@class, ...)`; lxml answers every such call through a Python callback, for every
candidate element, present attribute or not, and those passes take most of trafilatura's time on
a typical page. Here the same rules (the same token vocabularies, imported from trafilatura) are
matched with compiled regular expressions in one walk over the elements, reading only the
attributes an element has. Tree cleaning, tag conversion, link-density pruning, jusText's
paragraphs and the text output's clean-up run as faster equivalents of trafilatura's
(lean_stages), readability as lean_readability; trafilatura's own code is left for its text
handlers. The cascade is trafilatura's, in its default or its fast mode (main extractor,
wild-text recovery, comparison with readability and jusText, baseline rescue, recall retry),
each costly pass skipped where a bound shows it cannot change the result.

Before trafilatura sees the tree, the subtrees its cleaning deletes anyway (scripts, styles,
navigation, <head>, ...) are dropped in one C-level pass, so every later pass walks fewer nodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from copy import copy, deepcopy
from typing import Any

from lxml import etree
from lxml import html as lxml_html
from lxml.etree import Element, strip_elements, strip_tags, tostring

from tokenmill.curate.extract.lean_readability import LeanReadability, element_text_length
from tokenmill.curate.extract.lean_stages import (
    collapsed_length,
    convert_tags,
    justext_rescue,
    link_density_test_tables,
    printable_but_spaces,
    prune_by_link_density,
    sanitize_tree,
    tree_cleaning,
    xml_text,
)
from tokenmill.curate.extract.reference import (
    BASELINE_BLOCK_ELEMS,
    COOKIE_CONSENT_RE,
    DEDUPE_SCAN_CAP,
    DOCTYPE_TAG,
    ESCALATION_ACCEPT_RATIO,
    ESCALATION_JUSTEXT_RATIO,
    ESCALATION_MAX_LENGTH,
    ESCALATION_PAGE_SHARE,
    FAULTY_HTML,
    INLINE_FORMATTABLE,
    INVALID_XML_CHARS,
    JUSTEXT_OVERRIDE_RATIO,
    MIN_DUPLICATE_LENGTH,
    NOT_AT_THE_END,
    READABILITY_REGEXES,
    REBUILT_BLOCKS,
    SANITIZED_XPATH,
    SPACING_PROTECTED,
    TAG_CATALOG,
    Extractor,
    _elem_text,
    _forum_thread_page,
    _prefer_readability,
    baseline,
    delete_element,
    fromstring_bytes,
    handle_textelem,
    normalize_unicode,
    process_node,
    remove_control_characters,
    text_chars_test,
    trafilatura_xpaths,
    trim,
)

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
# What readability drops first (trafilatura.readability_lxml.Document.summary).
SCRIPT_TAGS = ("script", "style", "fencedframe")
# XML-incompatible characters but NUL, which the parser replaces (U+FFFD): looked for once NUL
# is known absent (a NUL is the slowest to find in a 2-byte string, where most bytes are 0)
_XML_INCOMPATIBLE = tuple(chr(c) for c in [*range(0x01, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0xFFFE, 0xFFFF])
# str.find looks for a NUL in a 2-byte string a character at a time; a regex, twice as fast
_NUL = re.compile("\x00")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
_parser: Any = None


def _html_parser() -> Any:
    global _parser
    if _parser is None:
        # no ID table: nothing looks elements up by ID, and building it is 5% of the parse
        _parser = etree.HTMLParser(remove_comments=True, remove_pis=True, default_doctype=False, collect_ids=False)
        # lxml.html's own parser picks each element's class in a Python callback; a fixed class
        # (trafilatura needs HtmlElement's text_content) is chosen in C.
        _parser.set_element_class_lookup(etree.ElementDefaultClassLookup(element=lxml_html.HtmlElement))
    return _parser


def repair_html(html: str, characters: bool = True) -> str:
    """trafilatura's input repair (utils.repair_faulty_html): control and other XML-incompatible
    characters removed (lxml refuses to store them: "All strings must be XML compatible"), a
    faulty doctype and a self-closing <html/> fixed; and an XML declaration removed, since lxml
    refuses a str that declares its encoding. `characters=False` leaves the characters to the
    caller, which finds them faster in the parsed text (see extract_text)."""
    if characters:
        html = INVALID_XML_CHARS.sub("", html)
    if "doctype" in html[:50].lower():
        first_line, _, rest = html.partition("\n")
        html = DOCTYPE_TAG.sub("", first_line, count=1) + "\n" + rest
    for line in html[:4096].splitlines()[:4]:
        if "<html" in line and line.endswith("/>"):
            html = FAULTY_HTML.sub(r"\1>", html, count=1)
            break
    return _XML_DECLARATION.sub("", html, count=1)


def load_tree(html: str, characters: bool = True) -> Any:
    """The page's lxml tree, repaired as trafilatura repairs it (see repair_html), comments and
    processing instructions dropped (None: nothing to parse)."""
    try:
        return lxml_html.document_fromstring(repair_html(html, characters), parser=_html_parser())
    except etree.ParserError:  # nothing parseable (e.g. only whitespace)
        return None


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


def _appended_hint(value: str) -> bool:
    """Whether _APPENDED can match in `value` (or in a part of it)."""
    return "scroll" in value or "mvp-post-add-" in value


# REMOVE_COMMENTS_AND_LISTS_XPATH
_COMMENTS_ID = re.compile(f"^(?:{_X._COMMENTS_ID}|disqus_thread|dsq-comments)")
_COMMENTS_LIST_ID = re.compile(f"^(?:{_X._COMMENTS_ID})")
_COMMENTS_CLASS = re.compile(_X._COMMENTS_CLASS)


def raw_tree_boilerplate(tree: Any, comments: bool = True) -> list:
    """What RAW_TREE_PRUNE_XPATH and (with `comments`) REMOVE_COMMENTS_AND_LISTS_XPATH select:
    appended articles, share bars, comment sections (document order)."""
    doomed = []
    for element in tree.iter("div", "section", "aside", "details", "ol", "ul"):
        id_, class_ = element.get("id", ""), element.get("class", "")
        if not (id_ or class_):
            continue
        tag = element.tag
        # the substring tests, each implied by its pattern, spare most pattern searches
        if tag in ("div", "section", "aside") and (
            (
                (_appended_hint(id_ + class_) and (_APPENDED.search(id_) or _APPENDED.search(class_)))
                and (element.find(".//h1") is None or _APPENDED_ALWAYS.search(id_) or _APPENDED_ALWAYS.search(class_))
            )
            or "elementor-share-buttons" in class_
        ):
            doomed.append(element)
        elif (
            comments
            and tag != "aside"
            and (
                ("omment" in class_ and _COMMENTS_CLASS.search(class_))
                or (_COMMENTS_LIST_ID if tag in ("ol", "ul") else _COMMENTS_ID).search(id_)
            )
        ):
            doomed.append(element)
    return doomed


def prune_raw_tree(tree: Any) -> None:
    """Trafilatura's raw-tree prunes, in place (the tail text of a removed element stays). On a
    thread-forum page (schema.org DiscussionForumPosting) the comment sections are the posts:
    trafilatura keeps them there, with comments excluded."""
    for element in raw_tree_boilerplate(tree, comments=not _forum_thread_page(tree)):
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


def is_boilerplate(tag: str, attrib: dict[str, str]) -> bool:
    """Whether OVERALL_DISCARD_XPATH selects an element of this tag and these attributes (in
    document order): navigation, ads, sharing, consent, meta data and hidden elements."""
    id_, class_, style = attrib.get("id", ""), attrib.get("class", ""), attrib.get("style", "")
    if tag in _SECTION_TAGS and (
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
    # the rules read only the tag and the attributes, which repeat within a page (list items,
    # cards): each combination is judged once
    verdicts: dict[tuple, tuple[bool, bool, bool]] = {}
    for element in tree.iterdescendants(etree.Element):
        items = element.items()
        if not items:  # every rule tests an attribute
            continue
        key = (element.tag, *items)
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = verdicts[key] = _section_verdict(element.tag, dict(items))
        if verdict[0]:
            boilerplate.append(element)
        if verdict[1]:
            captions.append(element)
        if verdict[2]:
            teasers.append(element)
    return boilerplate, captions, teasers


def _section_verdict(tag: str, attrib: dict[str, str]) -> tuple[bool, bool, bool]:
    """Whether an element of this tag and these attributes is boilerplate, a caption, a teaser
    (see section_matches)."""
    if tag not in _SECTION_TAGS:
        return is_boilerplate(tag, attrib), False, False
    id_, class_ = attrib.get("id", ""), attrib.get("class", "")
    return (
        is_boilerplate(tag, attrib),
        "caption" in id_ or "caption" in class_,
        "teaser" in id_.replace("T", "t") or "teaser" in class_.replace("T", "t"),
    )


def _outermost_listed(elements: list) -> list:
    """The elements of `elements` (document order) inside none of the others. An element
    inside another comes after it, so the descendants of those kept are all it is checked
    against."""
    outermost: list = []
    inside: set = set()
    for element in elements:
        if element not in inside:
            outermost.append(element)
            if len(element):
                inside.update(element.iterdescendants())
    return outermost


def prune_sections(tree: Any, potential_tags: set[str], options: Extractor, keep_teasers: bool = False) -> Any:
    """trafilatura.main_extractor.prune_unwanted_sections for the balanced and recall focus."""
    boilerplate, captions, teasers = section_matches(tree)
    # trafilatura's guard: prune nothing when that would remove more than 6/7 of the text
    if boilerplate:
        outer = _outermost_listed(boilerplate)
        old_len = len(tree.text_content())
        if old_len - sum(len(e.text_content()) for e in outer) > old_len / 7:
            _delete_all(outer)
    if "graphic" not in potential_tags:
        _delete_all(captions)
    if options.focus != "recall" and not keep_teasers:
        _delete_all(teasers)
    tree = prune_by_link_density(tree)
    if "table" in potential_tags:
        link_lengths: dict = {}
        for element in [e for e in tree.iter("table") if link_density_test_tables(e, link_lengths)]:
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


# Each rule's patterns need a class or an id: an element with neither is judged without them.


def _article_frame(element: Any) -> bool:
    class_, id_ = element.get("class", ""), element.get("id", "")
    if not (class_ or id_):
        return element.get("itemprop") == "articleBody"
    return bool(
        class_ in ("post", "entry")
        or element.get("itemprop") == "articleBody"
        or id_ == "articleContent"
        or _ARTICLE_ID.search(id_)
        or _ARTICLE_CLASS.search(class_)
    )


def _story_frame(element: Any) -> bool:
    class_, id_ = element.get("class", ""), element.get("id", "")
    if not (class_ or id_):
        return element.get("role") == "article"
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
    if not (class_ or id_):
        return False
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


# XPath expressions trafilatura passes as strings (compiled on every call): compiled once
# (plain strings: lxml's default text results each carry their parent)
_PARAGRAPH_TEXT_ANYWHERE = etree.XPath("//p//text()", smart_strings=False)
_PARAGRAPH_TEXT = etree.XPath(".//p//text()", smart_strings=False)
# SANITIZED_XPATH's tags (".//aside|.//audio|..."), matched in C
_UNSANITIZED_TAGS = tuple(part.removeprefix(".//") for part in SANITIZED_XPATH.split("|"))


def unsanitized(body: Any) -> bool:
    """Whether SANITIZED_XPATH selects anything in `body`: elements trafilatura's result should not hold."""
    return next(body.iterdescendants(*_UNSANITIZED_TAGS), None) is not None


# ---------------------------------------------------------------------------------------------
# trafilatura.main_extractor's _extract, extract_content and recover_wild_text, with the rules
# above (control flow unchanged, the balanced and recall focus only). Adapted from trafilatura
# 2.3.1 (Apache License 2.0, copyright Adrien Barbaresi); pyproject.toml bounds the version to
# the minor release they follow, and tests/curate/test_lean_html.py checks them against it.


def _extract(tree: Any, options: Extractor) -> tuple[Any, str, bool]:
    """(result body, its text, whether `tree` was changed: not where no content frame is found)."""
    potential_tags = set(TAG_CATALOG) | {"table", "td", "th", "tr"}
    result_body = Element("body")
    changed = False
    for rule in range(len(_FRAME_RULES)):
        subtree = content_frame(tree, rule)
        if subtree is None:
            continue
        changed = True
        subtree = prune_sections(subtree, potential_tags, options)
        if len(subtree) == 0:
            continue
        # no paragraphs containing text, or not enough
        ptest = _PARAGRAPH_TEXT_ANYWHERE(subtree)
        if not ptest or len("".join(ptest)) < options.min_extracted_size * 3:
            potential_tags.add("div")
        subelems = list(subtree.iterdescendants(etree.Element))  # XPath .//*, without XPath
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
    return result_body, " ".join(result_body.itertext()).strip(), changed


def _recover_wild_text(tree: Any, result_body: Any, options: Extractor, consumed: set) -> Any:
    potential_tags = set(TAG_CATALOG) | {"table", "td", "th", "tr"}
    search_expr = ".//code|.//p|.//quote|.//table|.//div[contains(@class, 'w3-code')]"
    if options.focus == "recall":
        potential_tags.update(["div", "lb"])
        search_expr += "|.//div|.//lb|.//list"
    search_tree = prune_sections(tree, potential_tags, options, keep_teasers=options.fast)
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


def _consumed(tree: Any, options: Extractor) -> set:
    """The elements of `tree` (a cleaned tree before the main pass) the main pass consumes,
    found by running it again on a copy (deterministic, and needed on 6 of the 207 gold pages,
    where recording every element's place on every page would cost more)."""
    replay = deepcopy(tree)
    order = list(replay.iter())
    _extract(replay, options)
    return {twin for element, twin in zip(order, tree.iter(), strict=True) if element.tag == "done"}


def extract_content(cleaned_tree: Any, options: Extractor, rebuild: Callable[[], Any] | None = None) -> tuple[Any, str]:
    """The main extractor on a cleaned, converted tree: (result body, its text). The wild-text
    recovery reads the tree as it was before the extraction changed it: `rebuild` makes it
    again when needed (one page in fifteen), else a copy is kept."""
    backup_tree = deepcopy(cleaned_tree) if rebuild is None else None
    result_body, temp_text, changed = _extract(cleaned_tree, options)
    # wild <p> elements when nothing or too little was found
    if len(result_body) == 0 or len(temp_text) < options.min_extracted_size:
        if not changed:  # no content frame: the tree is as it was
            backup_tree, consumed = cleaned_tree, set()
        else:
            if backup_tree is None:
                backup_tree = rebuild()
            consumed = _consumed(backup_tree, options)
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
# Bounds that decide, before running them, whether trafilatura's costlier passes can change
# the result.

_UNLIKELY = READABILITY_REGEXES["unlikelyCandidatesRe"]
_MAYBE_CANDIDATE = READABILITY_REGEXES["okMaybeItsACandidateRe"]
_BLOCKS = tuple(sorted(BASELINE_BLOCK_ELEMS))
# text readability writes for an embedded video (trafilatura.readability_lxml), at most per <iframe>
_VIDEO_MARK = len(" VIDEO")


def readability_reach(tree: Any, page_chars: int, unlikely: list) -> int:
    """An upper bound on the length of the text trafilatura's readability extracts from a
    raw-pruned `tree` (left unchanged) whose text, less its scripts and styles, collapses to
    `page_chars` characters: that length less the unlikely candidates readability removes
    first. Its output is a subset of what is left, in document order, and removing a
    contiguous run of text R from a text shortens its collapsed form by at least
    len(trim(R)) - 1. `unlikely`: _unlikely_candidates(tree), the outermost removed elements
    (their text holds their descendants'). A candidate holding a script is
    counted by its script-free children, one in a script (not in `page_chars`) not at all."""
    # one pass finds the iframes and the scripts (none on the kept page: see _main_tree_and_spare)
    found = list(tree.iter("iframe", *SCRIPT_TAGS))
    scripts = [element for element in found if element.tag != "iframe"]
    scripted = _holders(scripts)
    # the elements in a script (HTML gives scripts and styles no child elements: rarely any)
    in_script = {inner for element in scripts for inner in element.iterdescendants()}
    reach = page_chars
    for element in unlikely:
        if element.tag in SCRIPT_TAGS or element in in_script:
            continue
        for run in _script_free(element, scripted):
            reach -= max(element_text_length(run) - 1, 0)
    return reach + _VIDEO_MARK * (len(found) - len(scripts))


def _holders(elements: list) -> set:
    """The ancestors of `elements`."""
    holders: set = set()
    for element in elements:
        parent = element.getparent()
        while parent is not None and parent not in holders:
            holders.add(parent)
            parent = parent.getparent()
    return holders


def _script_free(element: Any, scripted: set) -> list:
    """`element`, or where it holds a script its script-free descendants, outermost first."""
    if element not in scripted:
        return [element]
    return [run for child in element if child.tag not in SCRIPT_TAGS for run in _script_free(child, scripted)]


def _unlikely_candidates(tree: Any) -> list:
    """The outermost elements readability's remove_unlikely_candidates drops (a class or id
    matching unlikelyCandidatesRe and not okMaybeItsACandidateRe; not <html> or <body>), in
    document order. The ones inside them go with them, so the walk skips their subtrees. The
    verdicts are cached per (class, id): the pages repeat a few class names."""
    verdicts: dict[tuple, bool] = {}
    unlikely = []
    walk = etree.iterwalk(tree, events=("start",))
    next(walk)  # the root
    for _, element in walk:
        class_, id_ = element.get("class"), element.get("id")
        if class_ is None and id_ is None:
            continue
        key = (class_, id_)
        verdict = verdicts.get(key)
        if verdict is None:
            attrs = " ".join(filter(None, key))
            low = attrs.lower()
            verdict = verdicts[key] = bool(
                len(attrs) >= 2 and _UNLIKELY.search(low) and not _MAYBE_CANDIDATE.search(low)
            )
        if verdict and element.tag != "body":
            unlikely.append(element)
            walk.skip_subtree()
    return unlikely


def page_text_bound(tree: Any, page_chars: int) -> int:
    """An upper bound on len(trafilatura.baseline.html2txt(tree)) for a tree whose text, less
    its SCRIPT_TAGS, collapses to `page_chars` characters: that length (the body's text is
    part of it), plus the two spaces html2txt puts around each block of the body (blocks in a
    fenced frame, which html2txt drops, only loosen it)."""
    body = tree.find("body")
    root = tree if body is None else body
    return page_chars + 2 * sum(1 for _ in root.iter(*_BLOCKS))


_BASIC_CLEAN_TAGS = frozenset(("aside", "fencedframe", "footer", "script", "style", "svg", "template"))
_COOKIE_CONSENT = re.compile(COOKIE_CONSENT_RE, re.I)


def _basic_clean_match(element: Any, consent: dict[str, bool]) -> bool:
    """Whether BASIC_CLEAN_XPATH selects `element`; `consent` caches the cookie-consent
    verdicts per class or id value."""
    tag = element.tag
    if tag in _BASIC_CLEAN_TAGS:
        return True
    class_, id_ = element.get("class"), element.get("id")
    if class_ is None:
        if id_ is None:
            return False
        return (tag == "div" and "footer" in id_) or _cookie_consent(id_, consent)
    if id_ is None:
        return (tag == "div" and "footer" in class_) or _cookie_consent(class_, consent)
    return (
        (tag == "div" and "footer" in _first_of(element.attrib, "class", "id"))
        or _cookie_consent(class_, consent)
        or _cookie_consent(id_, consent)
    )


# every alternative of COOKIE_CONSENT_RE holds one of these words
_COOKIE_CONSENT_HINT = re.compile("cookie|consent|borlabs|cmplz|onetrust|moove")


def _cookie_consent(value: str, consent: dict[str, bool]) -> bool:
    """Whether COOKIE_CONSENT_RE matches `value`, case ignored (cached in `consent`). An ASCII
    value without any of its words is no match; other values go to the pattern, whose
    ignored case also matches letters such as U+017F (long s) to ASCII ones."""
    verdict = consent.get(value)
    if verdict is None:
        if value.isascii():
            verdict = _COOKIE_CONSENT_HINT.search(value.lower()) is not None and bool(_COOKIE_CONSENT.search(value))
        else:
            verdict = bool(_COOKIE_CONSENT.search(value))
        consent[value] = verdict
    return verdict


def page_text_length(raw: Any) -> int:
    """len(trafilatura.baseline.html2txt(raw)) for a parsed page, without its copy of the page.
    html2txt deletes what BASIC_CLEAN_XPATH selects (a deleted element's tail joins the text
    before it), puts a space before the text and the tail of each block element, control
    characters removed from those, and collapses the text. Here one walk skips the deleted
    subtrees and collects the same pieces of text, in order."""
    body = raw.find(".//body")
    root = raw if body is None else body
    consent: dict[str, bool] = {}
    pieces: list[str] = []
    # whether the text read now (an element's text or tail, and the tails of deleted elements
    # that join it) belongs to a block element
    block = False
    walk = etree.iterwalk(root, events=("start", "end"))
    skipped = None
    for event, element in walk:
        if event == "start":
            if element is not root and _basic_clean_match(element, consent):
                text = element.tail
                walk.skip_subtree()
                skipped = element
            else:
                block = element.tag in BASELINE_BLOCK_ELEMS
                if block:
                    pieces.append(" ")
                text = element.text
        elif element is skipped or element is root:
            continue
        else:
            block = element.tag in BASELINE_BLOCK_ELEMS
            if block:
                pieces.append(" ")
            text = element.tail
        if text:
            pieces.append(_cleaned(text) if block else text)
    return collapsed_length("".join(pieces))


def _cleaned(text: str) -> str:
    """remove_control_characters(text), which keeps whitespace and printable characters: most
    texts hold only those, found faster than by its per-character walk."""
    return text if printable_but_spaces(text) else remove_control_characters(text)


def external_may_win(body: Any, text: str, reach: int, options: Extractor) -> bool:
    """Whether trafilatura.external.compare_extraction can replace (body, text), given that
    readability's text is at most `reach` long: False is certain, True means run it."""
    length, short = len(text), options.min_extracted_size
    if options.focus == "recall" and length > short * 10:  # its bypass
        return False
    # jusText examines short and unclean results
    if length < short or unsanitized(body):
        return True
    # readability wins only when its text is over twice as long (1x-1.5x in recall), or when
    # it is over twice the minimum and the own result has no paragraph text or more tables than paragraphs
    if reach > (length if options.focus == "recall" else 2 * length):
        return True
    return reach > 2 * short and (
        not _PARAGRAPH_TEXT(body) or len(body.findall(".//table")) > len(body.findall(".//p"))
    )


# ---------------------------------------------------------------------------------------------
# The cascade: trafilatura.core.trafilatura_sequence (comments excluded, balanced focus), in
# trafilatura's default mode or its fast mode. The main pass runs on the pre-stripped tree; the
# later passes, for the pages whose result they can change, on the unstripped page trafilatura
# sees: in default mode a copy kept before stripping (half the pages need it, and a copy costs
# a quarter of a parse), in fast mode (a page in ten needs it) the page parsed again. The kept
# copy's scripts and styles stay out until the baseline reads them (JSON-LD): every other pass
# drops them first, their tails joining the text before them as they do when detached.

OPTIONS = Extractor(output_format="txt", fast=False, comments=False)
FAST_OPTIONS = Extractor(output_format="txt", fast=True, comments=False)


def _recall(options: Extractor) -> Extractor:
    recall = copy(options)
    recall.focus = "recall"
    return recall


def _clean_tree(tree: Any, options: Extractor) -> Any:
    # tree_cleaning and convert_tags change the tree in place; callers pass a tree they own
    return convert_tags(tree_cleaning(tree, options), options)


def _extract_tree(tree: Any, options: Extractor, twin: Callable[[], Any] | None = None) -> tuple[Any, str]:
    """The main pass on `tree` (consumed); `twin`, if given, makes an equal tree again, for
    the wild-text recovery on the pages that need it (else a copy of the cleaned tree is kept)."""
    rebuild = None if twin is None else lambda: _clean_tree(twin(), options)
    return extract_content(_clean_tree(tree, options), options, rebuild)


def _main_tree(tree: Any) -> Any:
    """The raw-pruned page as the main pass reads it: without the subtrees its cleaning deletes."""
    strip_elements(tree, *SCRIPT_TAGS, with_tail=False)
    strip_elements(tree, *DROPPED_TAGS, with_tail=False)
    return tree


def _readability_summary(raw: Any, unlikely: list) -> str | None:
    """The HTML readability's summary gives on a copy of `raw` (None: readability failed),
    given the unlikely candidates: they are detached for the copy, which readability would
    drop first (the ones inside them too, to no effect: they are gone with them). Readability
    drops scripts, styles and fenced frames first, so candidates among them are left to it."""
    undo = _detach([element for element in unlikely if element.tag not in SCRIPT_TAGS])
    tree = copy(raw)
    _reattach(undo)
    try:
        return LeanReadability(tree).summary()
    except Exception:  # trafilatura's guard: readability failing yields nothing
        return None


def _summary_tree(summary: str | None) -> Any:
    """try_readability's tree for a summary (an empty element where there is none)."""
    tree = None if summary is None else fromstring_bytes(summary)
    return tree if tree is not None else lxml_html.HtmlElement()


def _justext(tree: Any, options: Extractor) -> tuple[Any, str]:
    """trafilatura.external.justext_rescue (see lean_stages.justext_rescue), `tree` unchanged."""
    consent: dict[str, bool] = {}
    return justext_rescue(tree, options, lambda element: _basic_clean_match(element, consent))


class _RawPage:
    """The raw-pruned page the later passes read (and never change), with what they derive from
    it once: readability's unlikely candidates, and readability's result, which the recall
    retry's comparison needs again."""

    def __init__(self, tree: Any, scripts: list[tuple] | None = None) -> None:
        self.tree = tree
        self._scripts = scripts  # the page's detached scripts and styles (see _detach)
        self._unlikely: list | None = None
        self._readability: tuple[str | None, str] | None = None

    def with_scripts(self) -> Any:
        """The page with its scripts and styles."""
        if self._scripts is not None:
            _reattach(self._scripts)
            self._scripts = None
        return self.tree

    @property
    def unlikely(self) -> list:
        """_unlikely_candidates(tree)."""
        if self._unlikely is None:
            self._unlikely = _unlikely_candidates(self.tree)
        return self._unlikely

    def readability(self) -> tuple[Any, str]:
        """trafilatura's readability result on the page and its text; the caller may change the
        result (the comparison sanitizes it), so a later call parses its summary again."""
        if self._readability is None:
            summary = _readability_summary(self.tree, self.unlikely)
            body = _summary_tree(summary)
            text = trim(tostring(body, method="text", encoding="utf-8").decode("utf-8"))
            self._readability = summary, text
            return body, text
        summary, text = self._readability
        return _summary_tree(summary), text


def _compare(raw: _RawPage, body: Any, text: str, options: Extractor) -> tuple[Any, str]:
    """trafilatura.external.compare_extraction (balanced and recall focus) on the raw page,
    adapted from trafilatura 2.3.1 like the main extractor above: the cleaned tree jusText
    reads is made only when jusText runs (one comparison in forty on the benchmark)."""
    len_text = len(text)
    if options.focus == "recall" and len_text > options.min_extracted_size * 10:  # its bypass
        return body, text
    algo_body, algo_text = raw.readability()
    len_algo = len(algo_text)
    use_readability = _prefer_readability(body, algo_body, algo_text, len_text, len_algo, options)
    if use_readability:
        body, text, len_text = algo_body, algo_text, len_algo
    # an unclean or short result: jusText may replace it
    unclean = unsanitized(body)
    if unclean or len_text < options.min_extracted_size:
        body2, text2 = _justext(tree_cleaning(copy(raw.tree), options), options)
        len_text2 = len(text2)
        if unclean:
            accept = len_text <= JUSTEXT_OVERRIDE_RATIO * len_text2 and (
                len_text2 > len_text or not options.images or body.find(".//graphic") is None
            )
        else:
            accept = len_text < len_text2
        if text2 and accept:
            body, text = body2, text2
            use_readability = False
    if use_readability:
        body, text = sanitize_tree(body, options)
    return body, text


def extract_text(html: str, fast: bool = False) -> str | None:
    """The page's main text (None when there is none) as trafilatura.extract(html,
    include_comments=False, fast=fast) finds it."""
    tree = _load_page(html)
    if tree is None:
        return None
    options = FAST_OPTIONS if fast else OPTIONS
    html, tree, spare, scripts, page_chars, page_bound = _main_tree_and_spare(html, tree, fast)
    twin = None if spare is None else lambda: _main_tree(deepcopy(spare))
    # lxml makes an element's Python object whenever a walk reaches it and none is alive: held
    # through the main pass, whose cleaning and rules walk the tree a dozen times, each is made
    # once (1-2% of the time)
    elements = list(tree.iter())
    body, text = _extract_tree(tree, options, twin)  # consumes the tree
    del elements
    raw = None
    if not fast and external_may_win(body, text, page_chars, options):
        raw = _raw_page(html, spare, scripts)
        if external_may_win(body, text, readability_reach(raw.tree, page_chars, raw.unlikely), options):
            body, text = _compare(raw, body, text, options)
    # baseline rescue on the raw page, kept only if it adds text
    if len(text) < options.min_extracted_size:
        raw = raw or _raw_page(html, spare, scripts)
        b_body, b_text, b_len = baseline(raw.with_scripts())  # baseline copies its input
        if b_len > len(text):
            body, text = b_body, b_text
    # a short extraction covering little of the page: retry in recall mode
    if 0 < len(text) < ESCALATION_MAX_LENGTH and len(text) < ESCALATION_PAGE_SHARE * (
        page_text_bound(spare, page_chars) if page_bound is None else page_bound
    ):
        raw = raw or _raw_page(html, spare, scripts)
        if len(text) < ESCALATION_PAGE_SHARE * page_text_length(raw.tree):
            body, text = _escalate(raw, body, text, options)
    if len(text) < options.min_output_size:
        return None
    return normalize_unicode(xml_text(body, options.formatting).strip())


def _main_tree_and_spare(html: str, tree: Any, fast: bool) -> tuple[str, Any, Any, list | None, int, int]:
    """From the raw-pruned page: the HTML (repaired where XML-incompatible characters are
    found), the tree the main pass reads (without the subtrees it drops), the raw page kept
    for the later passes (None: parsed again if needed) without its scripts and styles, what
    puts them back (see _detach), and the page's collapsed text length
    (scripts and styles left out) with page_text_bound's bound where no page is kept (None:
    found on the kept page by the pages that need it)."""
    # in default mode half the pages need the raw page, and copying it costs a quarter of
    # parsing it again (fast mode rarely needs it: parsed then). The dropped subtrees (half
    # the nodes) are detached for the copy and put back, so only the main pass's tree is copied.
    scripts = None if fast else _detach(_outermost_scripts(tree))
    if fast:
        strip_elements(tree, *SCRIPT_TAGS, with_tail=False)
    page_text = tree.text_content()
    # XML-incompatible characters: trafilatura removes them before parsing. Found faster in the
    # page's text than in its HTML (the text is what reaches lxml's checks); a NUL may end the
    # parse, so it is looked for in the HTML.
    if _NUL.search(html) or any(char in page_text for char in _XML_INCOMPATIBLE):
        html = INVALID_XML_CHARS.sub("", html)
        tree, scripts = _load_page(html), None
        strip_elements(tree, *SCRIPT_TAGS, with_tail=False)
        page_text = tree.text_content()
    page_chars = collapsed_length(page_text)  # bounds readability's text, before its removals
    if scripts is None:
        page_bound = page_text_bound(tree, page_chars)
        strip_elements(tree, *DROPPED_TAGS, with_tail=False)
        return html, tree, None, None, page_chars, page_bound
    dropped = _detach(_outermost(tree, DROPPED_TAGS))
    main = deepcopy(tree)
    _reattach(dropped)
    return html, main, tree, scripts, page_chars, None


def _outermost(tree: Any, tags: tuple[str, ...]) -> list:
    """The elements of `tags` in `tree` that are not inside another one, in document order."""
    walk = etree.iterwalk(tree, events=("start",), tag=tags)
    outermost = []
    for _, element in walk:
        outermost.append(element)
        walk.skip_subtree()
    return outermost


def _outermost_scripts(tree: Any) -> list:
    """_outermost(tree, SCRIPT_TAGS), faster: the parser gives scripts and styles only text, so
    unless a fenced frame holds elements none is inside another, and a plain iteration (half
    the cost of a walk) finds them."""
    found = list(tree.iter(*SCRIPT_TAGS))
    return _outermost(tree, SCRIPT_TAGS) if any(len(element) for element in found) else found


def _detach(outermost: list) -> list[tuple]:
    """Removes `outermost` (elements of a tree, none inside another, in document order) with
    their subtrees as strip_elements(tree, *their tags, with_tail=False) does, each one's tail
    joining the text before it, and returns what _reattach needs to undo it."""
    undo = []
    for element in outermost:
        parent, previous, tail = element.getparent(), element.getprevious(), element.tail
        before = parent.text if previous is None else previous.tail
        if tail:
            if previous is None:
                parent.text = (before or "") + tail
            else:
                previous.tail = (before or "") + tail
        undo.append((element, parent, previous, before))
        parent.remove(element)  # its tail goes with it, and comes back with it
    return undo


def _reattach(undo: list[tuple]) -> None:
    """Puts back what _detach removed: the tree is as it was before."""
    for element, parent, previous, before in reversed(undo):
        if previous is None:
            parent.insert(0, element)
            parent.text = before
        else:
            previous.addnext(element)
            previous.tail = before


def _raw_page(html: str, spare: Any = None, scripts: list[tuple] | None = None) -> _RawPage:
    """The raw-pruned page as trafilatura's later passes see it (left unchanged by them):
    `spare`, the copy of the page parsed as it stands (`scripts` puts back its scripts and
    styles), unless an attribute or a script holds characters that trafilatura's repair removes
    before parsing (a spare page holds no NUL: see _main_tree_and_spare)."""
    if spare is not None and not any(char in html for char in _XML_INCOMPATIBLE):
        return _RawPage(spare, scripts)
    raw = load_tree(html)
    prune_raw_tree(raw)
    return _RawPage(raw)


def _load_page(html: str) -> Any:
    """The raw-pruned tree, XML-incompatible characters left in."""
    tree = load_tree(html, characters=False)
    if tree is not None:
        prune_raw_tree(tree)
    return tree


def _escalate(raw: _RawPage, body: Any, text: str, options: Extractor) -> tuple[Any, str]:
    """trafilatura's recall escalation: the main pass (and in default mode the comparison) in
    recall mode, and in default mode a jusText candidate; the clearly longer result wins."""
    recall = _recall(options)
    r_body, r_text = _extract_tree(copy(raw.tree), recall, lambda: copy(raw.tree))
    if not options.fast:
        r_body, r_text = _compare(raw, r_body, r_text, recall)
    j_text = ""
    if not options.fast:
        j_body, j_text = _justext(raw.tree, options)
    if len(j_text) > len(r_text) and len(j_text) > ESCALATION_JUSTEXT_RATIO * len(text):
        return j_body, j_text
    if len(r_text) >= options.min_extracted_size and len(r_text) > ESCALATION_ACCEPT_RATIO * len(text):
        return r_body, r_text
    return body, text
