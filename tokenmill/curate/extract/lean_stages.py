"""Faster equivalents of trafilatura 2.3.1 stages (pinned) that the `lean` extractor runs: each
gives the output of the trafilatura (or jusText) function it names, on the trees lean passes
it, and does less work to get it.

They matter because the lean extractor spends most of its time in trafilatura's own stages once
its XPath rules are matched in Python (see lean_html); tests/curate/test_lean_html.py checks them
against trafilatura's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from copy import deepcopy
from functools import cache
from typing import Any

from lxml.etree import Element, SubElement, XPath, iterwalk, strip_tags

from tokenmill.curate.extract.reference import (
    CODE_INDICATORS,
    CONVERSIONS,
    JUSTEXT_LANGUAGES,
    LINK_FARM_RATIO,
    MANUALLY_CLEANED,
    MANUALLY_STRIPPED,
    PARAGRAPH_TAGS,
    PRESERVE_IMG_CLEANING,
    REND_TAG_MAPPING,
    TEI_VALID_TAGS,
    Extractor,
    JustextParagraph,
    delete_element,
    get_stoplist,
    handle_image,
    is_paragraph_listing,
    process_element,
    prune_html,
    recover_math,
    remove_control_characters,
    revise_paragraph_classification,
    trafilatura_convert_tags,
    trafilatura_external,
    trim,
    unescape,
    xmltotxt,
)


def collapsed_length(text: str) -> int:
    """len(trafilatura.utils.trim(text)) without hashing the text for trim's cache: at once
    for a text whose only spaces are single ASCII spaces between words (a printable text holds
    no other whitespace), else by joining its words."""
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return len(text)
    return len(" ".join(text.split()))


def collapsed_length_below(text: str, bound: int) -> int:
    """collapsed_length(text) where it is below `bound`, else a length of at least `bound`.
    Most texts a bound is asked of are long: growing prefixes are measured first (the
    collapsed prefix of a text is a prefix of the collapsed text); indentation can make a
    page's text mostly whitespace, hence the growth."""
    prefix_size = 2 * bound + 64
    while 2 * prefix_size < len(text):
        length = collapsed_length(text[:prefix_size])
        if length >= bound:
            return length
        prefix_size *= 4
    return collapsed_length(text)


def _link_holders(subtree: Any) -> set:
    """The elements of `subtree` (itself included) with a <ref> descendant."""
    holders: set = set()
    for ref in subtree.iter("ref"):
        parent = ref.getparent()
        while parent is not None and parent not in holders:
            holders.add(parent)
            if parent is subtree:
                break
            parent = parent.getparent()
    return holders


def tree_cleaning(tree: Any, options: Extractor) -> Any:
    """trafilatura.htmlprocessing.tree_cleaning. It walks the tree once per step (MathML,
    figures and tables, forms) and once per tag it deletes (some forty, each loop deleting
    while iterating); here one walk first finds the elements of these tags (the steps add
    none), and only the steps and loops of the tags found run, unchanged."""
    cleaning_list, stripping_list = MANUALLY_CLEANED.copy(), MANUALLY_STRIPPED.copy()
    clean_forms = "form" in cleaning_list
    if clean_forms:
        cleaning_list.remove("form")
    if not options.tables:
        cleaning_list.extend(["table", "td", "th", "tr"])
    found: dict[str, list] = {}
    for element in tree.iter(*cleaning_list, "figure", "form", "math", "table"):
        found.setdefault(element.tag, []).append(element)
    if "math" in found:
        recover_math(tree)
    if options.tables:
        # figures holding a table and ARIA layout tables are kept, as containers (a figure's
        # tables follow it: the figures tested first see the tables as they are)
        for figure in found.get("figure", ()):
            if figure.find(".//table") is not None:
                figure.tag = "div"
        for table in found.get("table", ()):
            if table.get("role") in ("presentation", "none"):
                table.tag = "div"
    if options.images:
        cleaning_list = [e for e in cleaning_list if e not in PRESERVE_IMG_CLEANING]
        stripping_list.remove("img")
    strip_tags(tree, stripping_list)
    # recall: undo the deletions if they remove every paragraph (copy only if none can survive)
    tcopy = None
    if (
        options.focus == "recall"
        and tree.find(".//p") is not None
        and (
            "p" in cleaning_list or not any(next(p.iterancestors(cleaning_list), tree) is tree for p in tree.iter("p"))
        )
    ):
        tcopy = deepcopy(tree)
    for expression in cleaning_list:
        if expression in found:
            for element in tree.iter(expression):
                delete_element(element)
    if tcopy is not None and tree.find(".//p") is None:
        tree = tcopy
    if clean_forms and "form" in found:
        handle_forms(tree)
    return prune_html(tree, options.focus)


def convert_quotes(element: Any) -> None:
    """trafilatura.htmlprocessing.convert_quotes: a <pre> becomes <code> if it wraps a single
    span, holds highlight.js spans (their attributes cleared) or code-like text, and any other
    quoting element <quote>. trafilatura compiles its highlight.js XPath on every call."""
    is_code = False
    if element.tag == "pre":
        highlighted = False
        for span in element.iterdescendants("span"):
            if span.get("class", "").startswith("hljs"):
                span.attrib.clear()
                highlighted = True
        text = element.text or ""
        is_code = (
            (len(element) == 1 and element[0].tag == "span")
            or highlighted
            or any(indicator in text for indicator in CODE_INDICATORS)
        )
    element.tag = "code" if is_code else "quote"


# len(element.text_content()) (lxml.html's text_content is XPath's string()), counted by libxml2
# without decoding the text into a Python string
_TEXT_LENGTH = XPath("string-length()")


def handle_forms(tree: Any) -> None:
    """trafilatura.htmlprocessing._handle_forms: a <form> holding most of the page's text is a
    layout wrapper, kept as a <div>; the others are deleted. The lengths are counted in C."""
    forms = list(tree.iter("form"))
    if not forms:
        return
    total = int(_TEXT_LENGTH(tree))
    for form in forms:
        if total and int(_TEXT_LENGTH(form)) > total / 2:
            form.tag = "div"
        else:
            delete_element(form)


def sanitize_tree(tree: Any, options: Extractor) -> tuple[Any, str]:
    """trafilatura.external.sanitize_tree (the clean-up of readability's result) with the
    tree_cleaning above; adapted from trafilatura 2.3.1 (Apache License 2.0)."""
    cleaned_tree = tree_cleaning(tree, options)
    strip_tags(cleaned_tree, "span", *(() if options.links else ("a",)))
    cleaned_tree = convert_tags(cleaned_tree, options, options.url)
    for elem in list(cleaned_tree.iter("graphic")):
        image = handle_image(elem, options)
        if image is None:
            delete_element(elem)
        else:
            elem.attrib.clear()
            elem.attrib.update(image.attrib)
    # the first row holding a <th> in each table is its head
    seen_groups: set = set()
    for row in cleaned_tree.iter("tr"):
        parent = row.getparent()
        if parent not in seen_groups and row.find("th") is not None:
            seen_groups.add(parent)
            for cell in row.iterchildren("th"):
                cell.set("role", "head")
    for elem in cleaned_tree.iter("td", "th", "tr"):
        elem.tag = "row" if elem.tag == "tr" else "cell"
    strip_tags(cleaned_tree, *({str(elem.tag) for elem in cleaned_tree.iter("*")} - TEI_VALID_TAGS))
    return cleaned_tree, trim(" ".join(cleaned_tree.itertext()))


# what convert_tags reads or changes: links, formatting (Yoast FAQ questions and sub/sup among
# it) and the CONVERSIONS tags
CONVERTED_TAGS = ("a", *REND_TAG_MAPPING, *CONVERSIONS)
HEADING_TAGS = frozenset(("h1", "h2", "h3", "h4", "h5", "h6"))
LIST_TAGS = frozenset(("dl", "ol", "ul"))
QUOTE_TAGS = frozenset(("blockquote", "pre", "q"))


def convert_tags(tree: Any, options: Extractor, url: str | None = None) -> Any:
    """trafilatura.htmlprocessing.convert_tags (links, images and formatting off, when the URL
    is not read; otherwise trafilatura's own). It walks the tree once per step (links, Yoast FAQ
    questions, empty sub/sup, formatting, conversions) and climbs from every link to its
    nearest container; here one walk collects the elements of every step, in document order,
    a link's container is known from its parent's, and the steps run in trafilatura's order on
    the elements collected (none adds or renames an element another step reads)."""
    if options.links or options.images or options.formatting:
        return trafilatura_convert_tags(tree, options, url)
    links, questions, scripts, conversions = [], [], [], []
    formatted = False
    for element in tree.iter(CONVERTED_TAGS):
        tag = element.tag
        if tag == "a":
            links.append(element)
        elif tag in CONVERSIONS:
            conversions.append(element)
        else:
            formatted = True
            if tag == "strong":
                questions.append(element)
            elif tag in ("sub", "sup"):
                scripts.append(element)
    stripped = _links_to_refs(tree, links, ("div", "li", "p", "table") if options.tables else ("div", "li", "p"))
    if stripped and scripts:  # whether a sub/sup is empty is read once the links are stripped
        strip_tags(tree, "a")
    for element in questions:
        if "schema-faq-question" in element.get("class", ""):
            element.attrib.clear()
            element.set("rend", "h3")
            element.tag = "head"
    # an empty sub/sup goes, its tail kept (it would be stripped with the formatting anyway,
    # but trafilatura joins the tail to the text before it)
    for element in scripts:
        if not element.text and len(element) == 0:
            delete_element(element)
    # the links and the formatting stripped in one walk: the same tree as one after the other
    if stripped or formatted:
        strip_tags(tree, "a", *REND_TAG_MAPPING)
    for element in conversions:
        tag = element.tag
        if tag == "br" or tag == "hr":
            element.tag = "lb"
        elif tag in HEADING_TAGS:
            element.attrib.clear()
            element.set("rend", tag)
            element.tag = "head"
        elif tag in LIST_TAGS:
            _convert_list(element, tag)
        elif tag in QUOTE_TAGS:
            convert_quotes(element)
        else:
            CONVERSIONS[tag](element)
    return tree


def _links_to_refs(tree: Any, links: list, containers: tuple[str, ...]) -> bool:
    """convert_tags' links: each one a container below `tree` holds becomes a <ref>; whether
    any is left (to be stripped). Whether an element's links are held is kept per element,
    so each climb stops at the first element already answered."""
    # trafilatura's test: the nearest container ancestor exists and is not `tree`
    held = {tree: tree.tag not in containers and next(tree.iterancestors(containers), None) is not None}
    stripped = False
    for link in links:
        node = link.getparent()
        climbed = []
        while True:
            answer = held.get(node)
            if answer is not None:
                break
            if node is None:
                answer = False
                break
            climbed.append(node)
            if node.tag in containers:
                answer = True
                break
            node = node.getparent()
        for node in climbed:
            held[node] = answer
        if answer:
            link.tag = "ref"
        else:
            stripped = True
    return stripped


def _convert_list(element: Any, tag: str) -> None:
    """trafilatura.htmlprocessing.convert_lists."""
    element.set("rend", tag)
    element.tag = "list"
    number = 1
    for item in element.iter("dd", "dt", "li"):
        item_tag = item.tag
        if item_tag != "li":
            item.set("rend", f"{item_tag}-{number}")
            if item_tag == "dd":
                number += 1
        item.tag = "item"


# the link-density passes of prune_unwanted_sections, in order: (tag, backtracking)
LINK_DENSITY_PASSES = (("div", True), ("list", False), ("p", False))


def prune_by_link_density(tree: Any) -> Any:
    """The link-density passes of trafilatura.main_extractor.prune_unwanted_sections (balanced
    and recall focus): delete_by_link_density for div, list and p elements, twice. An element's
    verdict depends only on its subtree, whether it has a next sibling and its parent's tag, so
    the second round tests only the elements a deletion touched (ancestors and previous
    siblings of the deleted elements); the others keep the verdict they had, to be kept."""
    touched: set = set()
    for tag, backtracking in LINK_DENSITY_PASSES:
        _delete_by_link_density(tree, tag, backtracking, touched)
    for tag, backtracking in LINK_DENSITY_PASSES:
        if touched:
            _delete_by_link_density(tree, tag, backtracking, touched, only=touched)
    return tree


def _delete_by_link_density(
    subtree: Any, tagname: str, backtracking: bool, touched: set, only: set | None = None
) -> None:
    """trafilatura.htmlprocessing.delete_by_link_density (favor_precision off) on the elements
    in `only` (default all), adding the elements whose verdict the deletions may change to
    `touched`. Its test keeps every element without a <ref> descendant, so only the elements
    holding links are tested: found from the links upwards instead of searched one by one."""
    holders = _link_holders(subtree)
    link_lengths: dict = {}  # the tree is unchanged until the deletions: each link measured once
    deletions = []
    for elem in subtree.iter(tagname):
        if elem not in holders or (only is not None and elem not in only):
            continue
        result, short_with_links = link_density_test(elem, link_lengths)
        if result or (
            backtracking and short_with_links and len(elem) >= 3 and collapsed_length(elem.text_content()) < 100
        ):
            # trafilatura keeps a paragraph holding a list item's content (GH #788)
            parent = elem.getparent()
            if tagname == "p" and parent is not None and parent.tag in ("item", "td", "th"):
                continue
            deletions.append(elem)
    for elem in dict.fromkeys(deletions):
        previous = elem.getprevious()
        if previous is not None:
            touched.add(previous)
        touched.update(elem.iterancestors())
        delete_element(elem)


def link_density_test(element: Any, link_lengths: dict) -> tuple[bool, bool]:
    """trafilatura.htmlprocessing.link_density_test (favor_precision off), each link's trimmed
    text length taken from `link_lengths`, a cache for a tree that does not change."""
    links = list(element.iterdescendants("ref"))  # findall(".//ref") without ElementPath
    if not links or next(element.iterdescendants("graphic"), None) is not None:
        return False, False
    lengths = []
    for link in links:
        length = link_lengths.get(link)
        if length is None:
            length = link_lengths[link] = collapsed_length(link.text_content())
        lengths.append(length)
    if element.tag == "p":
        limitlen = 60 if element.getnext() is None else 30
    else:
        limitlen = 300 if element.getnext() is None else 100
    # the element's length is compared with these bounds only: known exactly below the largest
    bound = limitlen
    if len(links) == 1 and lengths[0] > 100:
        bound = max(bound, int(lengths[0] / 0.9) + 1)
    elif len(links) > 4:
        bound = max(bound, int(sum(lengths) / LINK_FARM_RATIO) + 1)
    elemlen = collapsed_length_below(element.text_content(), bound)
    if len(links) == 1 and lengths[0] > 100 and lengths[0] > elemlen * 0.9:
        return True, False
    if elemlen < limitlen:
        lengths = [length for length in lengths if length]
        if not lengths:
            return True, False
        linklen, elemnum = sum(lengths), len(lengths)
        shortelems = sum(1 for length in lengths if length < 10)
        return linklen > elemlen * 0.8 or (elemnum > 1 and shortelems / elemnum > 0.8), True
    # large near-total-link farms, unless each link is a listing's card or alone in its paragraph
    if len(links) > 4:
        linklen, elemnum = sum(lengths), sum(1 for length in lengths if length)
        if linklen > elemlen * LINK_FARM_RATIO and linklen < 100 * elemnum and not is_paragraph_listing(links):
            return True, False
    return False, False


def link_density_test_tables(element: Any, link_lengths: dict) -> bool:
    """trafilatura.htmlprocessing.link_density_test_tables: whether a table is mostly link text
    (links measured as in link_density_test). Its length is measured as far as the verdict
    reads it: exactly below 1,000 characters or twice the link text."""
    links = list(element.iterdescendants("ref"))
    if not links:
        return False
    linklen = 0
    for link in links:
        length = link_lengths.get(link)
        if length is None:
            length = link_lengths[link] = collapsed_length(link.text_content())
        linklen += length
    elemlen = collapsed_length_below(element.text_content(), max(1000, 2 * linklen + 1))
    if elemlen < 200:
        return False
    return linklen > 0.8 * elemlen if elemlen < 1000 else linklen > 0.5 * elemlen


# ---------------------------------------------------------------------------------------------
# jusText as trafilatura runs it (trafilatura.external.justext_rescue): jusText's paragraph
# maker is a SAX handler (lxml builds each element's attributes and namespace map for it) whose
# paragraphs rebuild their text on every read, and classification reads it a dozen times. Here
# the same state machine runs on a plain walk and each paragraph's text is built once;
# jusText's own classification then runs on these paragraphs.

# justext.utils.normalize_whitespace (a run of whitespace holding a line break becomes "\n",
# any other run " ") without its per-run Python callback
_BREAKING_SPACE = re.compile(r"\s*[\n\r]\s*")
_SPACE = re.compile(r"[^\S\n]+")


def normalize_whitespace(text: str) -> str:
    """justext.utils.normalize_whitespace. A printable text without two spaces in a row holds
    no whitespace but single spaces: it is left as it is (most texts are)."""
    if text.isprintable() and "  " not in text:
        return text
    return _SPACE.sub(" ", _BREAKING_SPACE.sub("\n", text))


class Paragraph(JustextParagraph):
    """A jusText paragraph whose text is set once, when it is complete."""

    text = ""

    def __init__(self, dom_path: str) -> None:
        self.dom_path = dom_path
        self.text_nodes: list[str] = []
        self.chars_count_in_links = 0
        self.tags_count = 0
        self.class_type = ""


def make_paragraphs(root: Any, skip: Callable[[Any], bool] | None = None) -> list[Paragraph]:
    """justext.core.ParagraphMaker.make_paragraphs: the blocks of text of `root`, each with its
    DOM path, link characters and tag count (the XPath of each, unused by the classification,
    is left out). `root` holds no comments or processing instructions (lean's parser drops
    them), which the walk would skip with their tails. `skip`: the paragraphs of `root` once
    the elements it selects are deleted (trafilatura.xml.delete_element: each one's tail joins
    the text before it), without deleting them."""
    paragraphs: list[Paragraph] = []
    tags: list[str] = []
    paragraph = Paragraph("")
    link = br = False
    # the text read last, and the tails of skipped elements that join it
    pending: list[str] = []

    def new_paragraph() -> Paragraph:
        if paragraph.text_nodes:
            # one text node is normalized already, and stays so stripped
            nodes = paragraph.text_nodes
            paragraph.text = nodes[0].strip() if len(nodes) == 1 else normalize_whitespace("".join(nodes).strip())
            if paragraph.text:
                paragraphs.append(paragraph)
        return Paragraph(".".join(tags))

    def characters() -> None:
        nonlocal br
        content = "".join(pending)
        pending.clear()
        if not content or content.isspace():
            return
        text = normalize_whitespace(content)
        paragraph.text_nodes.append(text)
        if link:
            paragraph.chars_count_in_links += len(text)
        br = False

    walk = iterwalk(root, events=("start", "end"))
    skipped = None
    for event, element in walk:
        if event == "start" and skip is not None and element is not root and skip(element):
            pending.append(element.tail or "")
            walk.skip_subtree()
            skipped = element
            continue
        if element is skipped:  # its end
            continue
        characters()
        name = element.tag.rpartition("}")[2]
        if event == "start":
            tags.append(name)
            if name in PARAGRAPH_TAGS or (name == "br" and br):
                if name == "br":  # <br><br> separates paragraphs, it is no tag within one
                    paragraph.tags_count -= 1
                paragraph = new_paragraph()
            else:
                br = name == "br"
                if br:
                    paragraph.text_nodes.append(" ")
                elif name == "a":
                    link = True
                paragraph.tags_count += 1
            pending.append(element.text or "")
        else:
            tags.pop()
            if name in PARAGRAPH_TAGS:
                paragraph = new_paragraph()
            if name == "a":
                link = False
            pending.append(element.tail or "")
    characters()
    new_paragraph()
    return paragraphs


@cache
def stopwords(language: str | None) -> frozenset[str]:
    """The lower-cased stoplist trafilatura gives jusText for a language of JUSTEXT_LANGUAGES
    (None: every language's). jusText lower-cases it into a set on every call, which on the
    all-language list (150,000 words) costs more than classifying a page."""
    if language is None:
        stoplist = trafilatura_external.JT_STOPLIST or trafilatura_external.jt_stoplist_init()
    else:
        stoplist = get_stoplist(language)
    return frozenset(word.lower() for word in stoplist)


def classify_paragraphs(paragraphs: list[Paragraph], stoplist: frozenset[str]) -> None:
    """justext.core.classify_paragraphs with trafilatura's settings (lengths 50 and 150,
    stopword densities 0.1 and 0.2, link density 0.25, no headings), given the lower-cased
    stoplist; the stopwords are counted only where the verdict reads them."""
    for paragraph in paragraphs:
        text = paragraph.text
        length = len(text)
        paragraph.heading = False
        if length and paragraph.chars_count_in_links / length > 0.25:
            paragraph.cf_class = "bad"
        elif "\xa9" in text or "&copy" in text or "select" in paragraph.dom_path:
            paragraph.cf_class = "bad"
        elif length < 50:
            paragraph.cf_class = "bad" if paragraph.chars_count_in_links > 0 else "short"
        else:
            words = text.split()
            density = sum(word.lower() in stoplist for word in words) / len(words) if words else 0
            if density >= 0.2:
                paragraph.cf_class = "good" if length > 150 else "neargood"
            else:
                paragraph.cf_class = "neargood" if density >= 0.1 else "bad"


def justext_rescue(tree: Any, options: Extractor, skip: Callable[[Any], bool] | None = None) -> tuple[Any, str]:
    """trafilatura.external.justext_rescue on `tree`, given a predicate selecting the elements
    trafilatura's basic cleaning deletes from it (lean_html's basic-clean rules): `tree` is
    read as if they were deleted (see make_paragraphs), and left unchanged."""
    stoplist = stopwords(JUSTEXT_LANGUAGES.get(options.lang))
    body = Element("body")
    try:
        paragraphs = make_paragraphs(tree, skip)
        classify_paragraphs(paragraphs, stoplist)
        revise_paragraph_classification(paragraphs, 150)
    except Exception:  # trafilatura's guard: jusText failing yields no text
        return body, ""
    for paragraph in paragraphs:
        if not paragraph.is_boilerplate:
            SubElement(body, "p").text = paragraph.text
    return body, trim(" ".join(body.itertext()))


# ---------------------------------------------------------------------------------------------
# The result as text: trafilatura.xml.xmltotxt, whose clean-up of each line (utils.sanitize with
# preserve_space) walks a line character by character unless it is all printable, and a line
# holding a tab or other whitespace is not.


def xml_text(body: Any, formatting: bool) -> str:
    """trafilatura.xml.xmltotxt(body, formatting)."""
    if formatting:
        return xmltotxt(body, formatting)
    parts: list[str] = []
    process_element(body, parts, False)
    return unescape(sanitize_keeping_space("".join(parts)))


def printable_but_spaces(text: str) -> bool:
    """Whether every character of `text` but its whitespace is printable (what
    trafilatura.utils.remove_control_characters leaves unchanged). A long text is checked with
    its usual non-printable whitespace (line breaks, tabs, no-break spaces) taken out rather
    than split into words."""
    if text.isprintable() or text.isspace():
        return True
    if len(text) > 256:
        text = text.replace("\n", "").replace("\t", "").replace("\xa0", "").replace("\r", "")
        if text.isprintable():
            return True
    return "".join(text.split()).isprintable()


def sanitize_keeping_space(text: str) -> str:
    """trafilatura.utils.sanitize(text, preserve_space=True): space entities decoded,
    characters neither printable nor whitespace removed, empty lines dropped."""
    lines = []
    for line in text.splitlines():
        if "&" in line:
            line = line.replace("&#13;", "\r").replace("&#10;", "\n").replace("&nbsp;", "\u00a0")
        if not printable_but_spaces(line):
            line = remove_control_characters(line)
        if line:
            lines.append(line)
    return "\n".join(lines).replace("\u2424", "")
