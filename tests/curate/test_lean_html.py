"""The lean extractor's Python rules select exactly what trafilatura's XPath expressions select,
on real pages and on attribute combinations built to hit their corners, its reimplemented stages
(lean_stages) give what trafilatura's and jusText's give, and lean's text is trafilatura's text
for the same raw page, in its default and its fast mode."""

from __future__ import annotations

import gzip
import itertools
from copy import copy, deepcopy
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trafilatura
from justext.core import ParagraphMaker
from justext.core import classify_paragraphs as justext_classify_paragraphs
from justext.utils import normalize_whitespace as justext_normalize_whitespace
from lxml.etree import Element, SubElement, strip_elements, tostring
from trafilatura import xpaths
from trafilatura.baseline import html2txt
from trafilatura.external import sanitize_tree as trafilatura_sanitize_tree
from trafilatura.external import try_readability
from trafilatura.htmlprocessing import _handle_forms as trafilatura_handle_forms
from trafilatura.htmlprocessing import convert_quotes as trafilatura_convert_quotes
from trafilatura.htmlprocessing import convert_tags
from trafilatura.htmlprocessing import delete_by_link_density as trafilatura_delete_by_link_density
from trafilatura.htmlprocessing import link_density_test_tables as trafilatura_link_density_test_tables
from trafilatura.htmlprocessing import tree_cleaning as trafilatura_tree_cleaning
from trafilatura.readability_lxml import Document as ReadabilityDocument
from trafilatura.settings import BASIC_CLEAN_XPATH
from trafilatura.utils import remove_control_characters, trim
from trafilatura.xml import delete_element, xmltotxt

from tokenmill.curate.extract.lean_html import (
    DROPPED_TAGS,
    OPTIONS,
    SCRIPT_TAGS,
    _basic_clean_match,
    _extract_tree,
    _load_page,
    _main_tree,
    _main_tree_and_spare,
    _readability_summary,
    _reattach,
    _recall,
    _summary_tree,
    _unlikely_candidates,
    content_frame,
    extract_text,
    load_tree,
    page_text_length,
    raw_tree_boilerplate,
    readability_reach,
    section_matches,
)
from tokenmill.curate.extract.lean_readability import element_text_length
from tokenmill.curate.extract.lean_stages import (
    LINK_DENSITY_PASSES,
    classify_paragraphs,
    collapsed_length,
    collapsed_length_below,
    convert_quotes,
    handle_forms,
    link_density_test_tables,
    make_paragraphs,
    normalize_whitespace,
    printable_but_spaces,
    prune_by_link_density,
    sanitize_tree,
    stopwords,
    tree_cleaning,
    xml_text,
)
from tokenmill.curate.extract.lean_stages import (
    convert_tags as lean_convert_tags,
)


def parse_html(html: str) -> Any:
    """load_tree's tree without the subtrees trafilatura's cleaning deletes (None: nothing to parse)."""
    tree = load_tree(html)
    if tree is not None:
        strip_elements(tree, *DROPPED_TAGS, with_tail=False)
    return tree


def benchmark_html(shared_data: Path, limit: int | None = None) -> list[str]:
    paths = sorted((shared_data / "web" / "extraction" / "html").glob("*.html.gz"))[:limit]
    return [gzip.open(path, "rt", encoding="utf-8").read() for path in paths]


def xpath_matches(tree, expressions) -> list:
    """The elements a list of trafilatura expressions selects, each once, in document order."""
    found = {element for expression in expressions for element in expression(tree)}
    return [element for element in tree.iter() if element in found]


def basic_clean_matches(root) -> list:
    """The descendants lean's basic-clean rule selects, in document order."""
    return [element for element in root.iterdescendants(Element) if _basic_clean_match(element, {})]


def converted(tree):
    return convert_tags(trafilatura_tree_cleaning(deepcopy(tree), OPTIONS), OPTIONS)


def assert_rules_agree(tree) -> None:
    raw_rules = xpaths.RAW_TREE_PRUNE_XPATH + xpaths.REMOVE_COMMENTS_AND_LISTS_XPATH
    assert raw_tree_boilerplate(tree) == xpath_matches(tree, raw_rules)
    for root in (tree, converted(tree)):
        boilerplate, captions, teasers = section_matches(root)
        assert boilerplate == xpath_matches(root, xpaths.OVERALL_DISCARD_XPATH)
        assert captions == xpath_matches(root, xpaths.DISCARD_IMAGE_ELEMENTS)
        assert teasers == xpath_matches(root, xpaths.TEASER_DISCARD_XPATH)
        for rule, expression in enumerate(xpaths.BODY_XPATH):
            assert content_frame(root, rule) is next(iter(expression(root)), None), rule


# Values that hit each rule's tokens, anchors and case folding, and that miss them narrowly
# ("|"-separated: one value may be empty or hold spaces).
ID_VALUES = (
    "|comments|commentary|comment-list|disqus_thread|infinite-scroll|mvp-post-add-box|reply-7|hiddenbox"
    "|reader-comments|article-body|story-body|Main-Content|main|nav|ad-slot|teaser|Teaser|captioned|content"
    "|primary|articleContent|premium"
).split("|")
CLASS_VALUES = (
    "|Cookie-Banner|site-footer|post|entry|Comments|comment-body|post-comments|share-bar|elementor-share-buttons|x hidden|hide-print"
    "|cookie-notice|widget|Byline|post-content|fulltext Body|article |Page-Content|content_main|main-wrap"
    "|story|tags|caption|TeaserBox|ONETRUST-pc|con\u017fent-banner|coo\u212aie-bar"
).split("|")
OTHER_ATTRIBUTES = (
    '| style="display:none"| style="color: red; hidden"| aria-hidden="true"| role="Navigation"| role="article"'
    '| itemprop="articleBody"| data-lp-replacement-content| role="main"'
).split("|")
TAGS = ["div", "section", "article", "main", "span", "p", "ul", "ol", "details", "aside", "li", "table"]


def corner_elements() -> list[str]:
    elements = []
    for i, (tag, id_, class_) in enumerate(itertools.product(TAGS, ID_VALUES, CLASS_VALUES)):
        other = OTHER_ATTRIBUTES[i % len(OTHER_ATTRIBUTES)]
        # both attribute orders: XPath's string(@id|@class) is whichever comes first
        attributes = f' id="{id_}" class="{class_}"' if i % 2 else f' class="{class_}" id="{id_}"'
        heading = "<h1>Title</h1>" if i % 3 == 0 else ""
        elements.append(f"<{tag}{attributes}{other}>{heading}<p>text {i}</p></{tag}>")
    return elements


def test_rules_agree_with_trafilatura_on_attribute_corners():
    tree = parse_html("<html><body>" + "".join(corner_elements()) + "</body></html>")
    assert_rules_agree(tree)
    # the recall retry's page measure (on real pages: test_lean_text_is_trafilatura_text_on_the_raw_page)
    assert basic_clean_matches(tree) == xpath_matches(tree, [BASIC_CLEAN_XPATH])
    # the content frames one element at a time (on the whole page only the first match counts)
    for element in corner_elements():
        assert_rules_agree(parse_html(f"<html><body><div>{element}</div></body></html>"))


def test_rules_agree_with_trafilatura_on_real_pages(shared_data):
    for html in benchmark_html(shared_data):
        assert_rules_agree(parse_html(html))


def test_lean_text_is_trafilatura_text_on_the_raw_page(shared_data):
    # the first 30 pages take every path of the cascade: readability and jusText examined,
    # the baseline rescue and the recall retry
    for html in benchmark_html(shared_data, limit=30):
        raw = load_tree(html)
        assert page_text_length(raw) == len(html2txt(raw))  # the recall retry's page measure
        for fast in (False, True):
            expected = trafilatura.extract(html, include_comments=False, fast=fast) or ""
            assert (extract_text(html, fast=fast) or "").strip() == expected.strip()


# Dropped elements first in their parent, in a row, nested, holding scripts, with and without
# tails; a fenced frame holding scripts.
DROPPED_CORNERS = (
    "<html><head><title>T</title><script>s</script></head><body>lead<nav>n<script>x</script></nav>after"
    "<p><script>a</script><style>b</style>c<svg><g/></svg><button>b</button>d<span>e</span><iframe/></p>"
    "<div><footer><aside>f</aside>g</footer></div>end<fencedframe>q<script>r</script>t<style>u</style>"
    "</fencedframe>v<script>z</script></body></html>"
)


def test_main_tree_is_the_stripped_page_and_the_spare_the_page(shared_data):
    for html in [*benchmark_html(shared_data, limit=40), DROPPED_CORNERS]:
        tree = _load_page(html)
        page = tostring(tree)
        stripped = deepcopy(tree)
        strip_elements(stripped, *SCRIPT_TAGS, with_tail=False)
        strip_elements(stripped, *DROPPED_TAGS, with_tail=False)
        _, main, spare, scripts, _, _ = _main_tree_and_spare(html, tree, fast=False)
        assert tostring(main) == tostring(stripped)
        _reattach(scripts)
        assert tostring(spare) == page


# Deleted elements whose tails join inline and block text, control characters (a zero-width
# space, a soft hyphen) that html2txt removes only from block elements' text and tails.
PAGE_MEASURE_CORNERS = (
    "<html><body><span>a<footer>x</footer>\u200bb</span><p>c<aside>y</aside>\u00adz</p>d<script>s</script>e</body>",
    "<html><body>\u200b<div class='cookie-banner'>no</div>\u200bq<p>\u00ad<b>w</b>\u200b<aside>a</aside></p>"
    "<i>z<aside/>\u200by</i></body></html>",
    "<html><body><div id='footer'>f</div>tail\u200b<br>x<div class='cookiebot'><p>in</p></div>\u200bafter</body>",
    "<html><p>no body\u200b<aside>x</aside>\u200bq</p></html>",
)


@pytest.mark.parametrize("html", PAGE_MEASURE_CORNERS)
def test_page_text_length_is_html2txt_length(html):
    raw = load_tree(html)
    assert page_text_length(raw) == len(html2txt(raw))


STORY = "".join(
    f"<p>Paragraph {i} of the story tells, at some length, what the council decided on the new bridge"
    " and why the vote took so long.</p>"
    for i in range(6)
)
LINKS = "<ul>" + "".join(f"<li><a href='/s{i}'>Section {i}</a></li>" for i in range(8)) + "</ul>"
HEAD = "<!DOCTYPE html><html><head><title>Bridge vote</title></head><body>"
# Pages whose article only trafilatura's input repair or its rescues from the unstripped page find.
RESCUED_PAGES = {
    # BEL characters: lxml refuses to store them ("All strings must be XML compatible")
    "control characters": HEAD
    + f"<nav>{LINKS}</nav><article><h1>Bridge\x07 vote</h1>"
    + STORY.replace("bridge", "bri\x07dge")
    + "</article><footer>(c) 2024</footer></body></html>",
    # NUL characters, which the parser would keep as U+FFFD, in a page of 2-byte characters
    "NUL characters": HEAD
    + f"<nav>{LINKS}</nav><article class='sto\x00ry'><h1>Bridge\x00 vote, 2\u202f000 \u20ac</h1>"
    + STORY.replace("bridge", "bri\x00dge")
    + "</article><footer>(c) 2024</footer></body></html>",
    # a script-rendered page whose article is only in <noscript>
    "article in noscript": HEAD + f"<nav>{LINKS}</nav><div id='app'></div><noscript><article>{STORY}</article>"
    "</noscript><footer>(c) 2024</footer></body></html>",
    # an unclosed <nav>: the parser puts the rest of the page inside it
    "body inside nav": HEAD + f"<header><nav>{LINKS}<div class='main'><h1>Bridge vote</h1>{STORY}</div></body></html>",
}


# Pages whose main pass finds too little: wild text recovered from a tree the pass changed (a
# short content frame) or left as it was (no content frame).
WILD_TEXT_PAGES = {
    "short frame": f"<html><body><article><p>Only a line.</p></article><table><tr><td>{STORY}</td></tr></table></body></html>",
    "no frame": f"<html><body><table><tr><td>{STORY}</td></tr></table></body></html>",
}


@pytest.mark.parametrize("name", list(WILD_TEXT_PAGES))
def test_wild_text_is_recovered_as_trafilatura_recovers_it(name):
    html = WILD_TEXT_PAGES[name]
    for fast in (False, True):
        text = extract_text(html, fast=fast)
        assert text == trafilatura.extract(html, include_comments=False, fast=fast)
        assert "Paragraph 5 of the story" in text


@pytest.mark.parametrize("name", list(RESCUED_PAGES))
def test_pages_trafilatura_repairs_or_rescues(name):
    html = RESCUED_PAGES[name]
    for fast in (False, True):
        text = extract_text(html, fast=fast)
        assert text == trafilatura.extract(html, include_comments=False, fast=fast)
        assert "Paragraph 5 of the story" in text and "\x07" not in text


SCRIPT_ONLY = (
    "<html><head><title>App</title></head><body><div id='app'></div><script>render('app')</script></body></html>"
)
MENU = "<html><body><nav><a href='/'>Home</a></nav><footer><p>Contact</p></footer></body></html>"


@pytest.mark.parametrize("html", ["", "   ", "<html></html>", "<html><frameset></frameset></html>", SCRIPT_ONLY])
def test_pages_without_main_text(html):
    assert not extract_text(html) and not extract_text(html, fast=True)


def test_a_page_of_links_is_its_links_as_trafilatura_rescues_them():
    assert (
        extract_text(MENU)
        == extract_text(MENU, fast=True)
        == trafilatura.extract(MENU, include_comments=False)
        == "Home"
    )


def test_a_short_page_is_its_text():
    assert extract_text("<p>Short, but the page's only text.</p>") == "Short, but the page's only text."


# ---- lean_stages: trafilatura's stages, reimplemented


def test_link_density_pruning_is_trafilaturas(shared_data):
    for html in benchmark_html(shared_data, limit=60):
        tree = converted(parse_html(html))
        expected = deepcopy(tree)
        for _ in range(2):
            for tag, backtracking in LINK_DENSITY_PASSES:
                trafilatura_delete_by_link_density(expected, tag, backtracking)
        assert tostring(prune_by_link_density(tree)) == tostring(expected)


def link_table(cells: int, words: int) -> str:
    row = "".join(
        f"<td><a href='/{i}'>{'link text ' * (i % 4)}</a> {'cell words ' * (i % words)}</td>" for i in range(cells)
    )
    return f"<html><body><table><tr>{row}</tr></table></body></html>"


def test_link_dense_tables_are_trafilaturas(shared_data):
    # link-dense below and above 1,000 characters, mostly text, and 64% links in 940 characters
    # (link-dense were it over 1,000)
    near_limit = "<html><body><table><tr><td><a href='/x'>" + "link text " * 60 + "</a> " + "cell words " * 31
    pages = [*benchmark_html(shared_data), link_table(20, 1), link_table(80, 1), link_table(60, 7), near_limit]
    tables = [table for html in pages for table in converted(parse_html(html)).iter("table")]
    assert len(tables) >= 50
    verdicts = [link_density_test_tables(table, {}) for table in tables]
    assert verdicts == [trafilatura_link_density_test_tables(table) for table in tables]
    assert any(verdicts) and not all(verdicts)


def test_collapsed_length_below_a_bound_is_exact_below_it(shared_data):
    indented = "\n" + "".join(f"{' ' * 40}word{i}\n" for i in range(300))
    texts = [indented, " " * 5000 + "x", "y" * 5000]
    for html in benchmark_html(shared_data, limit=5):
        texts += [element.text_content() for element in parse_html(html).iter("body", "div", "p", "ul")]
    for text, bound in itertools.product(texts, (30, 60, 100, 300, 1000)):
        exact, bounded = collapsed_length(text), collapsed_length_below(text, bound)
        assert bounded == exact if exact < bound else bounded >= bound


def paragraph_fields(paragraphs) -> list[tuple]:
    return [(p.text, p.dom_path, p.chars_count_in_links, p.tags_count) for p in paragraphs]


def test_justext_paragraphs_are_justexts(shared_data):
    pages = benchmark_html(shared_data, limit=60) + [
        "<html><body><p>a<br><br>b<br>c <a href='/'>link\r\n text</a></p><div>\t<br><br><br>d</div></body></html>"
    ]
    for html in pages:
        tree = load_tree(html)
        assert paragraph_fields(make_paragraphs(tree)) == paragraph_fields(ParagraphMaker.make_paragraphs(tree))


def test_justext_paragraphs_read_past_deleted_elements(shared_data):
    # the tails of deleted elements join the text before them, whitespace runs across the joins
    pages = benchmark_html(shared_data, limit=30) + [
        "<html><body><p>a <aside>x</aside> b<footer>y</footer><a href='/'>l<svg/> k</a></p>"
        "<div><script>s</script>\n c<br><style>t</style><br>d</div><footer>z</footer> e</body></html>"
    ]
    for html in pages:
        tree = load_tree(html)
        deleted = deepcopy(tree)
        for element in basic_clean_matches(deleted):
            delete_element(element)
        skipped = make_paragraphs(tree, partial(_basic_clean_match, consent={}))
        assert paragraph_fields(skipped) == paragraph_fields(ParagraphMaker.make_paragraphs(deleted))


def test_justext_classification_is_justexts(shared_data):
    pages = benchmark_html(shared_data, limit=60) + [
        "<html><body><p>\u00a9 2024 the and of</p><select><option>the and of it is</option></select>"
        "<p><a href='/'>a link that is long enough to be more than a quarter</a> of it</p></body></html>"
    ]
    stoplist = stopwords(None)
    for html in pages:
        paragraphs = make_paragraphs(load_tree(html))
        classify_paragraphs(paragraphs, stoplist)
        verdicts = [(p.cf_class, p.heading) for p in paragraphs]
        justext_classify_paragraphs(paragraphs, stoplist, 50, 150, 0.1, 0.2, 0.25, True)
        assert verdicts == [(p.cf_class, p.heading) for p in paragraphs]


@pytest.mark.parametrize(
    "text", ["", " ", "a b c", "a\xa0b", "a  b", "a \t\n b", "\r", " x\x0b\x0c\x1c\x85y\u2028 \n\n z\xa0\u3000"]
)
def test_whitespace_normalised_as_justext_does(text):
    assert normalize_whitespace(text) == justext_normalize_whitespace(text)


def test_tree_cleaning_is_trafilaturas(shared_data):
    recall = copy(OPTIONS)
    recall.focus = "recall"
    for html in benchmark_html(shared_data, limit=60):
        tree = load_tree(html)
        for options in (OPTIONS, recall):
            expected = tostring(trafilatura_tree_cleaning(deepcopy(tree), options))
            assert tostring(tree_cleaning(deepcopy(tree), options)) == expected


def markup_and_text_nodes(tree) -> tuple:
    """A tree's markup and its text nodes one by one (the markup joins adjacent ones)."""
    return tostring(tree), tree.xpath("//text()")


CONVERSION_CORNERS = (
    "<p>a <a href='x'>link</a> b</p><a>outside</a> tail<a><a>nested</a></a>",
    "<sup><a></a></sup>t<sup></sup>u<sub><a>x</a></sub><div>w<sup><a></a></sup>v<sup><b></b></sup></div>",
    "<div><a>x</a>y<sup></sup>z</div><sup>kept</sup><sub><br></sub>",
    "<strong class='schema-faq-question x'>Q?</strong><strong>bold</strong><em>it</em><kbd>k</kbd>",
    "<dl><dt>t</dt><dd>d<dl><dt>in</dt><dd>x</dd></dl></dd><dd>e</dd></dl><ul><li>a<ol><li>b</li></ol></li></ul>",
    "<pre><span class='hljs-keyword'>def</span></pre><pre>x = f('a')</pre><pre><pre><span class='hljs'>x</span></pre></pre>"
    "<blockquote>q</blockquote><q>s</q><pre><span>one</span></pre>",
    "<h2 class='c'>h</h2><br><hr><del>d</del><s>s</s><strike>k</strike><details><summary>s</summary>x</details>",
    "<table><tr><td><a>cell</a></td></tr></table><span><a>loose</a><b><a>b</a></b></span><li><a>item</a></li>",
)


@pytest.mark.parametrize("html", CONVERSION_CORNERS)
def test_tag_conversion_is_trafilaturas_on_corners(html):
    no_tables = copy(OPTIONS)
    no_tables.tables = False
    page = f"<html><body>{html}</body></html>"
    for options in (OPTIONS, no_tables):
        expected, tree = load_tree(page), load_tree(page)
        assert markup_and_text_nodes(lean_convert_tags(tree, options)) == markup_and_text_nodes(
            convert_tags(expected, options)
        )
        # a subtree converted in place: its links' containers may lie above it
        wrapped = f"<html><body><div>{html}</div></body></html>"
        expected, tree = load_tree(wrapped), load_tree(wrapped)
        lean_convert_tags(tree.find("body")[0][0], options)
        convert_tags(expected.find("body")[0][0], options)
        assert markup_and_text_nodes(tree) == markup_and_text_nodes(expected)


FORM_CORNERS = (
    "<form id='aspnetForm'><p>Most of the text, \u00e9t\u00e9 \U0001f600 included.</p></form><p>a little</p>",
    "<p>the article's text, longer than the form's</p><form><label>Search</label>x</form>tail",
    "<form>half<form>nested \u00e9</form></form><p>half</p><form></form>",
    "<form></form>",
)


@pytest.mark.parametrize("html", FORM_CORNERS)
def test_forms_handled_as_trafilatura_does(html):
    page = f"<html><body>{html}</body></html>"
    expected, tree = load_tree(page), load_tree(page)
    trafilatura_handle_forms(expected)
    handle_forms(tree)
    assert markup_and_text_nodes(tree) == markup_and_text_nodes(expected)


def test_tree_cleaning_and_tag_conversion_are_trafilaturas(shared_data):
    recall, no_tables = copy(OPTIONS), copy(OPTIONS)
    recall.focus = "recall"
    no_tables.tables = False
    for html in benchmark_html(shared_data, limit=60):
        raw = _load_page(html)
        for tree in (raw, _main_tree(deepcopy(raw))):
            for options in (OPTIONS, recall, no_tables):
                expected = convert_tags(trafilatura_tree_cleaning(deepcopy(tree), options), options)
                result = lean_convert_tags(tree_cleaning(deepcopy(tree), options), options)
                assert markup_and_text_nodes(result) == markup_and_text_nodes(expected)


UNLIKELY_IN_SCRIPTS = (
    "<html class='sidebar-open'><body><div class='comment'>said</div><script class='comment-js'>var a;</script>"
    "<fencedframe><div class='footer'>framed</div></fencedframe>"
    "<div class='sidebar'>side<div class='comment'>nested<p class='footer'>deeper</p></div>tail</div><div id='main'>"
    + STORY
    + "<div class='share-footer'><script>track()</script><p>Share this</p></div></div></body></html>"
)


def test_readability_given_its_candidates_is_trafilaturas(shared_data):
    for html in [*benchmark_html(shared_data, limit=40), UNLIKELY_IN_SCRIPTS]:
        raw = load_tree(html)
        expected = try_readability(copy(raw))
        unlikely = _unlikely_candidates(raw)
        assert tostring(_summary_tree(_readability_summary(raw, unlikely))) == tostring(expected)
        # the bound that decides whether it runs holds
        page = deepcopy(raw)
        strip_elements(page, *SCRIPT_TAGS, with_tail=False)
        reach = readability_reach(raw, len(" ".join(page.text_content().split())), unlikely)
        assert len(" ".join(expected.text_content().split())) <= reach
        # and its clean-up, when it wins, is trafilatura's
        for options in (OPTIONS, _recall(OPTIONS)):
            body, text = sanitize_tree(deepcopy(expected), options)
            expected_body, expected_text = trafilatura_sanitize_tree(deepcopy(expected), options)
            assert (tostring(body), text) == (tostring(expected_body), expected_text)


def test_result_text_is_xmltotxts(shared_data):
    bodies = [_extract_tree(parse_html(html), OPTIONS)[0] for html in benchmark_html(shared_data, limit=40)]
    corners = bodies[0]
    for text in ("\tsoft\xadhyphen \u200bzero-width &nbsp;x\u2424 &#10;&#13;", "\u2028 \ufeff", "", "\x85 plain\t\n\n"):
        SubElement(corners, "p").text = text
    for body in bodies:
        assert xml_text(deepcopy(body), False) == xmltotxt(body, False)


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "\ttab\xa0nbsp",
        "\u2028line\u3000space\x85",
        "soft\xadhyphen",
        "\tzero\u200bwidth",
        "",
        " \x1f",
        "\n   ",
        "line\n\t" * 100,
        "line\n\t" * 100 + "\xad",
        "line\u3000" * 100,
    ],
)
def test_printable_but_spaces_is_what_control_character_removal_leaves(text):
    assert printable_but_spaces(text) == (remove_control_characters(text) == text)


QUOTE_CORNERS = (
    "<html><body><pre><span>one span</span></pre><pre>x = {1: 2}</pre><pre>plain prose</pre>"
    "<pre><b>bold</b> prose</pre><pre><code><span class='hljs-keyword'>def</span> f</code></pre>"
    "<pre><span class='x hljs'>not highlight.js</span><span>two</span></pre><blockquote>quoted</blockquote>"
    "<q>inline</q><pre>\n    indented code</pre><pre>print('hi')</pre></body></html>"
)


def test_quotes_converted_as_trafilatura_converts_them(shared_data):
    for html in [*benchmark_html(shared_data), QUOTE_CORNERS]:
        tree = parse_html(html)
        expected = deepcopy(tree)
        for element in tree.iter("blockquote", "pre", "q"):
            convert_quotes(element)
        for element in expected.iter("blockquote", "pre", "q"):
            trafilatura_convert_quotes(element)
        assert tostring(tree) == tostring(expected)


# Corners of readability's rules: divs renamed or not (loose text beside a link, a no-break space
# only, tags that merely start like a block's, a comment holding markup), text and breaks
# wrapped, hidden inputs, videos, headings dropped by weight or links, empty divs between
# long neighbours (a comment among them), sections cleaned for images, embeds or links, and a
# class weighed by a pattern whose case is ignored.
READABILITY_CORNERS = (
    HEAD
    + "<div id='main'><div class='text'>"
    + STORY
    + "</div><div>loose <a href='/a'>link</a></div><div><a href='/b'>only a link</a> </div>"
    "<div>\xa0<a href='/c'>spaced link</a></div><div><span><path-x>a path</path-x></span></div>"
    "<div><svg><path d='M0'/></svg>drawing, with a caption long enough to count</div>"
    "<div><!-- <p>markup</p> -->commented text<br>after a break<br> <br>last, and long enough</div>"
    "<div><input type='hidden'><input type='hidden'><input><p>a form, with a field</p></div>"
    "<iframe src='https://www.youtube.com/embed/x'></iframe><iframe src='/ad'></iframe>"
    "<h2 class='meta'>Meta heading</h2><h3><a href='/h'>Linked heading</a></h3>"
    + STORY
    + "<div class='pictured'><p></p><img src='i'></div><!-- a comment, with its own text -->"
    "<table><tr><td><img src='1'><img src='2'><img src='3'><p>short</p></td></tr></table>"
    "<ul><li><embed src='e'><embed src='f'>Two embeds and some words to pass the length</li></ul>"
    "<div class='widget'>" + LINKS + "</div><section>" + STORY + "</section>"
    # a dotless i matches widget's i when the case is ignored
    "<div class='w\u0131dget'><p>A widget, with a text long enough to be kept were it not one.</p></div>"
    "</div></body></html>"
)


def test_readability_summary_is_trafilaturas(shared_data):
    """The same summary string as trafilatura's readability on the page, and the page unchanged."""
    for html in [*benchmark_html(shared_data), UNLIKELY_IN_SCRIPTS, READABILITY_CORNERS]:
        raw = load_tree(html)
        before = tostring(raw)
        expected = ReadabilityDocument(copy(raw), min_text_length=25).summary()
        assert _readability_summary(raw, _unlikely_candidates(raw)) == expected
        assert tostring(raw) == before


@pytest.mark.parametrize(
    "text", ["", "a", "a b", "a  b", " a", "a ", "a\xa0b", "a\tb", "a\nb", "\u3000a", "a\u2028b", "a\x1cb", "a\u200bb"]
)
def test_collapsed_length_is_trimmed_length(text):
    assert collapsed_length(text) == len(trim(text))


def test_element_text_length_is_trimmed_text_content_length(shared_data):
    for html in [*benchmark_html(shared_data, limit=20), READABILITY_CORNERS]:
        for node in load_tree(html).iter():  # comments and processing instructions too
            assert element_text_length(node) == len(trim(node.text_content()))
