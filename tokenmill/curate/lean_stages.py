"""Faster equivalents of trafilatura 2.3.1 stages (pinned) that the `lean` extractor runs: each
gives the output of the trafilatura function it names, on any tree, and does less work to get it.

They matter because the lean extractor spends most of its time in trafilatura's own stages once
its XPath rules are matched in Python (see lean_html); tests/curate/test_lean_html.py checks them
against trafilatura's.
"""

from __future__ import annotations

from typing import Any

from trafilatura.htmlprocessing import is_paragraph_listing
from trafilatura.utils import LINK_FARM_RATIO, trim
from trafilatura.xml import delete_element


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
        if result or (backtracking and short_with_links and len(elem) >= 3 and len(trim(elem.text_content())) < 100):
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
    links = element.findall(".//ref")
    if not links or element.find(".//graphic") is not None:
        return False, False
    elemlen = len(trim(element.text_content()))
    lengths = []
    for link in links:
        length = link_lengths.get(link)
        if length is None:
            length = link_lengths[link] = len(trim(link.text_content()))
        lengths.append(length)
    if len(links) == 1 and lengths[0] > 100 and lengths[0] > elemlen * 0.9:
        return True, False
    if element.tag == "p":
        limitlen = 60 if element.getnext() is None else 30
    else:
        limitlen = 300 if element.getnext() is None else 100
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
