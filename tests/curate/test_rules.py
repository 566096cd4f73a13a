"""Each heuristic rule on hand-made documents just inside and just outside its threshold.

A rule is tested alone (`only(...)` turns the other rules of its family off), at the published
default threshold, so each boundary is the one from Gopher / C4 / FineWeb.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import fields

import pytest

from tokenmill.curate.rules import C4, Doc, FineWeb, GopherQuality, GopherRepetition, RuleSet
from tokenmill.curate.text import count_alpha_words, count_sentences, non_symbol_words, split_words
from tokenmill.errors import ConfigError


def only(family_type, *keep: str):
    """A family with only the named fields at their defaults; every other rule off."""
    family = family_type()
    for f in fields(family):
        if f.name in keep or f.name in ("enabled", "stop_words", "short_line_length", "line_punct_exclude_zero"):
            continue
        value = getattr(family, f.name)
        setattr(family, f.name, False if isinstance(value, bool) else None)
    return family


def verdict(family, text: str) -> str | None:
    return family.apply(Doc(text), Counter())[1]


def words_text(words: list[str]) -> str:
    return " ".join(words)


# ------------------------------------------------------------------------------- text helpers


def test_split_words_separates_punctuation_and_keeps_numbers_and_clitics():
    assert split_words("Hello, world! It's 3.5 km (1,000 m) -- don't #go...") == [
        "Hello",
        ",",
        "world",
        "!",
        "It",
        "'s",
        "3.5",
        "km",
        "(",
        "1,000",
        "m",
        ")",
        "--",
        "do",
        "n't",
        "#",
        "go",
        "...",
    ]
    assert split_words("Mr. Smith met J. Doe in the U.S. today.") == [
        "Mr.",
        "Smith",
        "met",
        "J.",
        "Doe",
        "in",
        "the",
        "U.S.",
        "today",
        ".",
    ]
    assert split_words("a 5 @-@ year @,@ 2 @.@ 5") == ["a", "5", "@-@", "year", "@,@", "2", "@.@", "5"]
    words = split_words("The 1990 cat , # sat …")
    assert non_symbol_words(words) == ["The", "1990", "cat", "sat"]
    assert count_alpha_words(words) == 3


def test_count_sentences():
    assert count_sentences("One. Two! Three? Four.") == 4
    assert count_sentences('He said "stop." Then left.') == 2
    assert count_sentences("No end mark") == 1
    assert count_sentences("   ") == 0


# ------------------------------------------------------------------------------- Gopher quality

FILLER = ["house", "river", "stone", "light", "green"]


def prose(n_words: int) -> list[str]:
    """n words, two distinct stop words, mean length near 4.6."""
    base = ["the", "and"] + [FILLER[i % len(FILLER)] for i in range(max(0, n_words - 2))]
    return base[:n_words]


def test_gopher_min_and_max_words():
    rule = only(GopherQuality, "min_words", "max_words")
    assert verdict(rule, words_text(prose(50)) + " .") is None
    assert verdict(rule, words_text(prose(49)) + " .") == "gopher_quality.min_words"
    # punctuation is not a word
    assert verdict(rule, words_text(prose(49)) + " . , ; !") == "gopher_quality.min_words"
    assert verdict(rule, words_text(prose(100_000))) is None
    assert verdict(rule, words_text(prose(100_001))) == "gopher_quality.max_words"


def test_gopher_mean_word_length():
    rule = only(GopherQuality, "min_mean_word_length", "max_mean_word_length")
    at_three = ["the", "and"] + ["cat"] * 48
    assert verdict(rule, words_text(at_three)) is None
    below = ["the", "and", "of"] + ["cat"] * 47  # mean 2.98
    assert verdict(rule, words_text(below)) == "gopher_quality.mean_word_length"
    # 50 words summing to 500 characters: mean exactly 10, then one more character
    at_ten = ["the", "and"] + ["abcdefghij"] * 46 + ["abcdefghijklmnopq"] * 2
    assert sum(map(len, at_ten)) == 500
    assert verdict(rule, words_text(at_ten)) is None
    above = at_ten[:-1] + ["abcdefghijklmnopqr"]
    assert verdict(rule, words_text(above)) == "gopher_quality.mean_word_length"


def test_gopher_hash_and_ellipsis_ratios():
    rule = only(GopherQuality, "max_hash_ratio")
    # 90 words + 10 '#' tokens: 10 / 100 = 0.1 is allowed; 11 / 101 is not
    assert verdict(rule, words_text(prose(90) + ["#"] * 10)) is None
    assert verdict(rule, words_text(prose(90) + ["#"] * 11)) == "gopher_quality.hash_ratio"
    rule = only(GopherQuality, "max_ellipsis_ratio")
    assert verdict(rule, words_text(prose(45) + ["..."] * 4 + ["…"])) is None  # 5 / 50
    assert verdict(rule, words_text(prose(45) + ["..."] * 5 + ["…"])) == "gopher_quality.ellipsis_ratio"  # 6 / 51


def test_gopher_bullet_and_ellipsis_lines():
    line = "the house and the river stone"
    rule = only(GopherQuality, "max_bullet_lines_ratio")
    nine = "\n".join([f"- {line}"] * 9 + [line])
    assert verdict(rule, nine) is None  # 9 / 10 = 0.9
    assert verdict(rule, "\n".join([f"  • {line}"] * 10)) == "gopher_quality.bullet_lines"
    rule = only(GopherQuality, "max_ellipsis_lines_ratio")
    three = "\n".join([f"{line}..."] * 3 + [line] * 7)
    assert verdict(rule, three) is None  # 3 / 10 = 0.3
    four = "\n".join([f"{line}…  "] * 4 + [line] * 6)
    assert verdict(rule, four) == "gopher_quality.ellipsis_lines"


def test_gopher_alpha_words():
    rule = only(GopherQuality, "min_alpha_words_ratio")
    assert verdict(rule, words_text(prose(80) + ["1990"] * 20)) is None  # 80 / 100
    assert verdict(rule, words_text(prose(79) + ["1990"] * 21)) == "gopher_quality.alpha_words"
    # punctuation tokens count as words without letters, as in datatrove
    assert verdict(rule, words_text(prose(79) + [","] * 21)) == "gopher_quality.alpha_words"


def test_gopher_stop_words_are_counted_distinct():
    rule = only(GopherQuality, "min_stop_words")
    assert verdict(rule, "the house of stone") is None
    assert verdict(rule, "the house the stone the river") == "gopher_quality.stop_words"
    assert verdict(rule, "The house And stone") == "gopher_quality.stop_words"  # case matters


def test_gopher_quality_defaults_keep_prose_and_name_first_rule():
    text = (
        "The river runs past the old stone house and the green fields that have been farmed with care "
        "for many years. " * 5
    ).strip()
    assert verdict(GopherQuality(), text) is None
    assert verdict(GopherQuality(), "Too short to be a document.") == "gopher_quality.min_words"


# ------------------------------------------------------------------------------- Gopher repetition


def unique_words(n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(n)]


def test_repetition_duplicate_paragraph_and_line_fractions():
    distinct = [words_text(unique_words(5, f"p{i}x")) for i in range(7)]
    dup = "same short"
    three = "\n\n".join(distinct + [dup] * 4)  # 4 copies: 3 duplicates of 11 paragraphs
    four = "\n\n".join(distinct[:6] + [dup] * 5)  # 4 duplicates of 11
    rule = only(GopherRepetition, "max_dup_para_frac")
    assert verdict(rule, three) is None  # 3 / 11 = 0.27
    assert verdict(rule, four) == "gopher_repetition.dup_para_frac"  # 4 / 11 = 0.36
    rule = only(GopherRepetition, "max_dup_line_frac")
    assert verdict(rule, three.replace("\n\n", "\n")) is None
    assert verdict(rule, four.replace("\n\n", "\n")) == "gopher_repetition.dup_line_frac"
    # 3 duplicates of 10 is exactly 0.3: allowed
    assert verdict(rule, "\n".join(distinct[:6] + [dup] * 4)) is None


@pytest.mark.parametrize(
    "sep,field,reason",
    [
        ("\n\n", "max_dup_para_char_frac", "gopher_repetition.dup_para_char_frac"),
        ("\n", "max_dup_line_char_frac", "gopher_repetition.dup_line_char_frac"),
    ],
)
def test_repetition_duplicate_characters(sep, field, reason):
    rule = only(GopherRepetition, field)
    dup = "x" * 20  # the second copy is 20 duplicated characters
    for total, expected in ((100, None), (99, reason)):
        filler = "f" * (total - 2 * len(dup) - 2 * len(sep))
        text = sep.join([filler, dup, dup])
        assert len(text) == total
        assert verdict(rule, text) == expected, total


@pytest.mark.parametrize("n,limit", [(2, 0.20), (3, 0.18), (4, 0.16)])
def test_repetition_top_ngram(n, limit):
    rule = only(GopherRepetition, f"max_top_{n}_gram")
    gram = [chr(ord("a") + i) * 2 for i in range(n)]  # "aa bb" / "aa bb cc" / ...
    gram_chars = len(" ".join(gram))
    repeats = 4
    head = " ".join(gram * repeats) + " "
    # the top n-gram covers gram_chars * repeats characters; pad with one long word
    inside = math.ceil(gram_chars * repeats / limit)
    for total, expected in ((inside, None), (inside - 1, f"gopher_repetition.top_{n}_gram")):
        text = head + "z" * (total - len(head))
        assert len(text) == total
        assert verdict(rule, text) == expected, (n, total)


@pytest.mark.parametrize("n", range(5, 11))
def test_repetition_duplicated_ngrams(n):
    limit = round(0.15 - 0.01 * (n - 5), 2)
    rule = only(GopherRepetition, f"max_dup_{n}_gram")
    gram = [chr(ord("a") + i) * 3 for i in range(n)]  # n distinct 3-letter words
    repeated_chars = 3 * n  # the second copy, joined without spaces
    head = " ".join(gram + gram) + " "
    inside = math.ceil(repeated_chars / limit)
    for total, expected in ((inside, None), (inside - 1, f"gopher_repetition.dup_{n}_gram")):
        text = head + "z" * (total - len(head))
        assert verdict(rule, text) == expected, (n, total)


def test_ngram_statistics_match_the_reference_definitions():
    """The NumPy n-gram levels against the plain definitions (top n-gram: len(" ".join) * count,
    first seen wins a tie; duplicated n-grams: greedy left-to-right scan jumping past repeats)."""
    import random

    from tokenmill.curate.rules.gopher_repetition import NgramLevels

    def at_level(words, n):
        """The n-gram statistics of `words` at n (None: fewer than n words)."""
        levels = NgramLevels(words)
        while levels.n < n:
            if not levels.advance():
                return None
        return levels

    def top_ngram_chars(words, n):
        levels = at_level(words, n)
        return 0 if levels is None else levels.top_chars()

    def duplicated_ngram_chars(words, n):
        levels = at_level(words, n)
        return 0 if levels is None else levels.duplicated_chars()

    def top_reference(words, n):
        grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
        if not grams:
            return 0
        gram, count = Counter(grams).most_common(1)[0]
        return len(gram) * count

    def dup_reference(words, n):
        seen, repeated, i = set(), 0, 0
        while i < len(words) - n + 1:
            gram = tuple(words[i : i + n])
            if gram in seen:
                repeated += sum(map(len, gram))
                i += n
            else:
                seen.add(gram)
                i += 1
        return repeated

    rng = random.Random(0)
    for _ in range(1500):
        vocab = ["a", "bb", "ccc", "dddd", "e", "ff"][: rng.randint(1, 6)]
        words = [rng.choice(vocab) for _ in range(rng.randint(0, 40))]
        for n in (2, 3, 4):
            assert top_ngram_chars(words, n) == top_reference(words, n), (words, n)
        for n in range(5, 11):
            assert duplicated_ngram_chars(words, n) == dup_reference(words, n), (words, n)


def test_repetition_defaults_keep_varied_text_and_reject_boilerplate():
    varied = "\n\n".join(words_text(unique_words(40, f"p{i}x")) + "." for i in range(5))
    assert verdict(GopherRepetition(), varied) is None
    boiler = "\n".join(["Click here to subscribe to our newsletter."] * 6 + ["Welcome to the site of the club."])
    assert verdict(GopherRepetition(), boiler) == "gopher_repetition.dup_line_frac"  # one paragraph, 7 lines
    assert verdict(GopherRepetition(), boiler.replace("\n", "\n\n")) == "gopher_repetition.dup_para_frac"
    assert verdict(GopherRepetition(), "") == "gopher_repetition.empty"


# ------------------------------------------------------------------------------- C4


def c4_apply(rule: C4, text: str):
    stats = Counter()
    doc, reason = rule.apply(Doc(text), stats)
    return doc.text, reason, stats


def test_c4_line_rules_remove_lines_and_count_them():
    rule = C4(min_sentences=None)
    text = "\n".join(
        [
            "  A line that ends in a period.  ",
            "A line without terminal punctuation",
            "A line that trails off...",
            "Two words.",
            "Please enable JavaScript to view this page.",
            "This site uses cookies to improve things.",
            "He said it was 'fine.'",
            'A quoted ending "here."',
            "Is this a question?",
            "A cited fact [1] and more [citation needed].",
            "word " + "x" * 1001 + " ends here.",
            "word " + "x" * 1000 + " ends here.",
        ]
    )
    edited, reason, stats = c4_apply(rule, text)
    assert reason is None
    assert edited.split("\n") == [
        "A line that ends in a period.",
        "He said it was 'fine.'",
        'A quoted ending "here."',
        "Is this a question?",
        "A cited fact  and more .",
        "word " + "x" * 1000 + " ends here.",
    ]
    assert stats["c4.lines_removed.terminal_punct"] == 2
    assert stats["c4.lines_removed.min_words_per_line"] == 1
    assert stats["c4.lines_removed.javascript"] == 1
    assert stats["c4.lines_removed.policy"] == 1
    assert stats["c4.lines_removed.max_word_length"] == 1
    assert stats["c4.lines_removed"] == 6 and stats["c4.lines_in"] == 12 and stats["c4.docs_edited"] == 1


def test_c4_document_rules():
    five = "One sentence here. Two sentences here.\nThree is here. Four is here. Five is here."
    assert c4_apply(C4(), five)[1] is None
    four = "One sentence here. Two sentences here.\nThree is here. Four is here."
    assert c4_apply(C4(), four)[1] == "c4.min_sentences"
    # sentences on removed lines do not count
    assert c4_apply(C4(), four + "\nFive is here. Six is here. But no end")[1] == "c4.min_sentences"
    assert c4_apply(C4(), five + "\nThis is Lorem Ipsum dolor sit.")[1] == "c4.lorem_ipsum"
    assert c4_apply(C4(), five + "\nThe set {a, b} is small.")[1] == "c4.curly_bracket"
    # a curly bracket on a line that is removed anyway does not reject (as in C4 and datatrove)
    assert c4_apply(C4(), five + "\nfunction() { return 1 }")[1] is None
    assert c4_apply(C4(min_sentences=None), "no terminal punctuation\nanywhere")[1] == "c4.no_lines_left"


# ------------------------------------------------------------------------------- FineWeb

LONG = "this line is long enough to not be short at all"


def test_fineweb_line_punctuation_ratio():
    rule = only(FineWeb, "min_line_punct_ratio")
    assert verdict(rule, "\n".join([LONG + "."] * 3 + [LONG] * 22)) is None  # 3 / 25 = 0.12
    assert verdict(rule, "\n".join([LONG + "!"] * 2 + [LONG] * 23)) == "fineweb.line_punct_ratio"
    # blank lines are not lines
    assert verdict(rule, "\n\n\n".join([LONG + "?"] * 3 + [LONG] * 22)) is None
    assert verdict(only(FineWeb, "min_line_punct_ratio", "line_punct_exclude_zero"), LONG) == "fineweb.line_punct_ratio"


def test_fineweb_short_lines():
    rule = only(FineWeb, "max_short_line_ratio")
    short = "x" * 30  # 30 characters is short
    assert verdict(rule, "\n".join([short] * 67 + [LONG] * 33)) is None  # 0.67
    assert verdict(rule, "\n".join([short] * 68 + [LONG] * 32)) == "fineweb.short_line_ratio"
    assert verdict(rule, "\n".join(["x" * 31] * 100)) is None


def test_fineweb_duplicate_line_characters():
    rule = only(FineWeb, "max_dup_line_char_ratio")
    dup = "d" * 10
    for total, expected in ((1000, None), (999, "fineweb.char_dup_ratio")):
        filler = "f" * (total - 2 * len(dup))
        text = "\n".join([filler, dup, dup])
        assert len(text) - text.count("\n") == total
        assert verdict(rule, text) == expected


def test_fineweb_newlines_per_word():
    rule = only(FineWeb, "max_newline_word_ratio")
    assert verdict(rule, "a b c\nd e f\ng h i\nj") is None  # 3 / 10
    assert verdict(rule, "a b c\nd e f\ng h i\nj\n") == "fineweb.list_ratio"  # 4 / 10
    assert verdict(FineWeb(), "\n \n") == "fineweb.empty"


# ------------------------------------------------------------------------------- rule set


def test_rule_set_order_switches_and_settings():
    rules = RuleSet()
    # FineWeb's order: repetition before quality
    text = "\n".join(["the same line of text and words"] * 10)
    assert rules.apply(text)[1] == "gopher_repetition.dup_line_frac"
    rules.disable("gopher_repetition")
    # 70 words pass Gopher quality; C4 then removes every line (no terminal punctuation)
    assert rules.apply(text)[1] == "c4.min_sentences"
    rules.set("gopher_quality.min_words", "off")
    assert rules.gopher_quality.min_words is None
    rules.disable("c4.terminal_punct")
    assert rules.c4.terminal_punct is False
    rules.update({"fineweb": False, "gopher_quality": {"max_hash_ratio": 0.5, "disable": ["stop_words"]}})
    assert not rules.fineweb.enabled and rules.gopher_quality.max_hash_ratio == 0.5
    assert rules.gopher_quality.min_stop_words is None
    assert verdict(rules.gopher_quality, words_text(unique_words(60))) is None  # 60 words, no stop word
    with pytest.raises(ConfigError, match="unknown rule"):
        rules.disable("c4.no_such_rule")
    with pytest.raises(ConfigError, match="unknown setting"):
        rules.set("fineweb.nope", 1)
    with pytest.raises(ConfigError, match="cannot read"):
        rules.set("gopher_quality.min_words", "many")
    with pytest.raises(ConfigError, match="unknown rule family"):
        rules.disable("gopher")
