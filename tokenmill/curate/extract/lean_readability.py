"""trafilatura's readability (trafilatura.readability_lxml.Document.summary, trafilatura 2.3.1)
with the same summary, faster: each element's text is serialized once where readability asks
for it two or three times (and read directly where the element has no child), the lengths of
the links are measured once per scoring, a link density is measured only where a verdict reads
it, the class weights are matched once per (class, id) pair, and the misused divs are found and
the others' loose text wrapped in one pass over the divs."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from lxml import etree

from tokenmill.curate.extract.lean_stages import collapsed_length, collapsed_length_below
from tokenmill.curate.extract.reference import (
    DIV_TO_P_PREFIXES,
    LIST_TAGS,
    READABILITY_REGEXES,
    TAG_SCORES,
    Candidate,
    Document,
    text_length,
)

_NEGATIVE = READABILITY_REGEXES["negativeRe"]
_POSITIVE = READABILITY_REGEXES["positiveRe"]
_VIDEO = READABILITY_REGEXES["videoRe"]
# the same patterns for lowercase ASCII (they are lowercase ASCII literals)
_NEGATIVE_LOWER = re.compile(_NEGATIVE.pattern)
_POSITIVE_LOWER = re.compile(_POSITIVE.pattern)
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_CONDITIONALLY_CLEANED = ("table", "ul", "div", "aside", "header", "footer", "section")
# the descendants sanitize counts (its TEXT_CLEAN_ELEMS less <a>, which it counts unread)
_COUNTED = ("p", "img", "li", "input", "embed")

# the length from which a paragraph's score no longer grows with it: min(length / 100, 3) is 3
_FULL_SCORE_LENGTH = 301
# XML's whitespace, which XPath's normalize-space() removes
_XML_SPACE = " \t\n\r"


def _text(element: Any) -> str:
    """element.text_content() (the text of its descendants, without its tail), faster."""
    if not len(element):  # no child, comment or entity: its text nodes are all it holds
        return element.text or ""
    return etree.tostring(element, method="text", encoding=str, with_tail=False)


def element_text_length(element: Any) -> int:
    """len(trafilatura.utils.trim(element.text_content())), faster."""
    return collapsed_length(_text(element))


def _is_misused(div: Any) -> bool:
    """Whether transform_misused_divs_into_paragraphs turns `div` into a paragraph: it has no
    descendant whose tag starts like a block's, and no link unless it holds loose text."""
    for descendant in div.iterdescendants():
        tag = descendant.tag
        if type(tag) is str and tag.startswith(DIV_TO_P_PREFIXES):
            return False
    return next(div.iterdescendants("a"), None) is None or _holds_loose_text(div)


def _holds_loose_text(element: Any) -> bool:
    """Whether the XPath text()[normalize-space()] finds a text of `element`'s own."""
    if element.text and element.text.strip(_XML_SPACE):
        return True
    return any(child.tail and child.tail.strip(_XML_SPACE) for child in element)


def _wrap_loose_text(div: Any) -> None:
    """What transform_misused_divs_into_paragraphs does to a div it keeps: its text and the
    tails of its children wrapped in paragraphs, its line breaks dropped."""
    if div.text and div.text.strip():
        paragraph = div.makeelement("p")
        paragraph.text, div.text = div.text, None
        div.insert(0, paragraph)
    for child in div:  # most divs hold neither: their children are walked once
        if child.tag == "br" or (child.tail and child.tail.strip()):
            break
    else:
        return
    for position, child in reversed(list(enumerate(div))):
        if child.tail and child.tail.strip():
            paragraph = div.makeelement("p")
            paragraph.text, child.tail = child.tail, None
            div.insert(position + 1, paragraph)
        if child.tag == "br":
            child.drop_tree()


def _attribute_weight(value: str) -> int:
    """What a class or id adds to class_weight: -25 for negativeRe, +25 for positiveRe."""
    if value.isascii():  # IGNORECASE matches it as its lowercase matches case-sensitively
        low = value.lower()
        negative, positive = _NEGATIVE_LOWER.search(low), _POSITIVE_LOWER.search(low)
    else:
        negative, positive = _NEGATIVE.search(value), _POSITIVE.search(value)
    return (25 if positive else 0) - (25 if negative else 0)


class LeanReadability(Document):
    """trafilatura's readability Document on a tree its unlikely candidates were removed from
    (remove_unlikely_candidates is left out)."""

    __slots__ = ["_weights"]

    def __init__(self, doc: Any) -> None:
        super().__init__(doc, min_text_length=25)
        self._weights: dict[tuple, int] = {}

    def remove_unlikely_candidates(self) -> None:
        """Done before: the tree comes without them."""

    def transform_misused_divs_into_paragraphs(self) -> None:
        # One pass renames the misused divs and wraps the loose text of the others: renaming a
        # div changes neither test for another (a renamed div, a <p>, is a block too), and
        # wrapping changes only the div's children, which no test of another div reads.
        for element in list(self.doc.iterdescendants("div")):
            if _is_misused(element):
                element.tag = "p"
            else:
                _wrap_loose_text(element)

    def score_paragraphs(self) -> dict[Any, Candidate]:
        candidates: dict[Any, Candidate] = {}
        minimum = self.min_text_length
        for element in self.doc.iter("p", "pre", "td"):
            parent = element.getparent()
            if parent is None:
                continue
            text = _text(element)
            if len(text) < minimum:  # its collapsed length is no more
                continue
            length = collapsed_length_below(text, _FULL_SCORE_LENGTH)
            if length < minimum:
                continue
            grandparent = parent.getparent()
            for node in (parent, grandparent):
                if node is not None and node not in candidates:
                    candidates[node] = self.score_node(node)
            # the pieces of the trimmed text split at its commas, and its length below 301
            score = 1 + (text.count(",") + 1) + min((length / 100), 3)
            candidates[parent].score += score
            if grandparent is not None:
                candidates[grandparent].score += score / 2
        # the tree stays as it is: a link's length, asked by each candidate holding it, is kept
        link_lengths: dict[Any, int] = {}
        for element, candidate in candidates.items():
            link_length = 0
            for link in element.iterdescendants("a"):
                length = link_lengths.get(link)
                if length is None:
                    length = link_lengths[link] = element_text_length(link)
                link_length += length
            if link_length:  # else the density is 0 and the score stays
                candidate.score *= 1 - link_length / (element_text_length(element) or 1)
        return candidates

    def get_link_density(self, elem: Any) -> float:
        return self._link_density(elem, None)

    def _link_density(self, element: Any, content_length: int | None) -> float:
        """The element's link density; `content_length`: its text's collapsed length, if known."""
        link_length = sum(element_text_length(link) for link in element.iterdescendants("a"))
        if not link_length:
            return 0.0
        if content_length is None:
            content_length = element_text_length(element)
        return link_length / (content_length or 1)

    def class_weight(self, elem: Any) -> int:
        key = (elem.get("class"), elem.get("id"))
        weight = self._weights.get(key)
        if weight is None:
            weight = self._weights[key] = sum(_attribute_weight(value) for value in key if value)
        return weight

    def score_node(self, elem: Any) -> Candidate:
        return Candidate(self.class_weight(elem) + TAG_SCORES.get(str(elem.tag).lower(), 0), elem)

    def sanitize(self, node: Any, candidates: dict[Any, Candidate]) -> str:
        for header in list(node.iter(*_HEADINGS)):
            if self.class_weight(header) < 0 or self.get_link_density(header) > 0.33:
                header.drop_tree()
        for element in list(node.iter("form", "textarea")):
            element.drop_tree()
        for element in list(node.iter("iframe")):
            if "src" in element.attrib and _VIDEO.search(element.attrib["src"]):
                element.text = "VIDEO"
            else:
                element.drop_tree()
        # the innermost first: a removal shortens the text of the elements around it only
        for element in reversed(list(node.iter(*_CONDITIONALLY_CLEANED))):
            weight = self.class_weight(element)
            score = candidates[element].score if element in candidates else 0
            if weight + score < 0:
                element.drop_tree()
            elif self._cleaned_out(element, weight):
                element.drop_tree()
        return etree.tostring(node, encoding=str, method="xml")

    def _cleaned_out(self, element: Any, weight: int) -> bool:
        """Whether sanitize removes a table, list or division of a weight and score that keep
        it: one with fewer than ten commas, and too many images, list items, inputs, embeds
        or links, or too little text."""
        text = _text(element)
        if text.count(",") >= 10:
            return False
        counts = Counter(descendant.tag for descendant in element.iterdescendants(*_COUNTED))
        paragraphs, images, embeds = counts["p"], counts["img"], counts["embed"]
        inputs = counts["input"]
        if inputs:
            inputs -= len(element.findall('.//input[@type="hidden"]'))
        content_length = collapsed_length(text)
        if paragraphs and images > 1 + paragraphs * 1.3:
            return True
        if counts["li"] - 100 > paragraphs and element.tag not in LIST_TAGS:
            return True
        if inputs > (paragraphs / 3):
            return True
        if content_length < self.min_text_length and (images == 0 or images > 2):
            return True
        if self._link_density(element, content_length) > (0.5 if weight >= 25 else 0.2):
            return True
        if (embeds == 1 and content_length < 75) or embeds > 1:
            return True
        if content_length:
            return False
        # no text: kept between long neighbours, the nearest non-empty sibling on each side
        nearest = (
            next((length for sibling in siblings if (length := text_length(sibling))), 0)
            for siblings in (element.itersiblings(), element.itersiblings(preceding=True))
        )
        return sum(nearest) <= 1000
