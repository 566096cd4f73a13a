"""Normalize: undo a corpus's tokenization (optional), repair mojibake (ftfy), Unicode NFC, and
whitespace clean-up.

Each step can be turned off. Documents that are empty after normalization are rejected with
`empty_after_normalize`; `stats` counts how many documents each step changed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

_TRAILING_SPACE = re.compile(r"[ \t\u00a0]+$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")


def clean_whitespace(text: str) -> str:
    """Unify line endings, drop trailing spaces, squeeze runs of spaces between words and of
    blank lines (paragraph breaks survive as one blank line), strip the ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _TRAILING_SPACE.sub("", text)
    text = _INNER_SPACES.sub(" ", text)
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip()


# WikiText (Merity et al. 2016) is stored tokenized: `1 @,@ 000`, `word , word .`, `( x )`,
# `do n't`, headings as ` = = Title = = `, rare words as `<unk>`. Left so, a fifth of its tokens
# have no letter and the quality rules (Gopher's alpha_words) reject nearly every article.
_WT_HEADING = re.compile(r"^((?:= )+)(.*?)((?: =)+)$")
_WT_NUMBER_JOIN = re.compile(r" @([-,.])@ ")
_WT_CLITIC = re.compile(r" (n't|'t|'s|'re|'ve|'ll|'m|'d)(?=\W|$)", re.IGNORECASE)
_WT_PLURAL_POSSESSIVE = re.compile(r"(?<=s) '(?= |$)")
_WT_QUOTED = re.compile(r'" ([^"]*?) "')
_WT_SPACE_BEFORE = re.compile(r" +([,.;:!?%)\]}])")
_WT_SPACE_AFTER = re.compile(r"([(\[{$£€]) +")
_WT_UNK = re.compile(r"<unk>")
# `<unk>` is one word in WikiText but three tokens (`<`, `unk`, `>`) to the rules' word splitter
# (and to spaCy's): written as one word it counts once, as in the corpus.
WIKITEXT_UNK = "UNK"


def detokenize_wikitext(text: str) -> str:
    """WikiText's tokenized text as ordinary prose: numbers joined (`1,000`, `2.5`, `two-year`),
    punctuation and brackets attached, double quotes paired on a line, clitics joined (`don't`,
    `players'`), headings as plain title lines (as Wikipedia text extractors write them), and
    `<unk>` (a word outside WikiText's vocabulary, lost) as the single word `UNK`."""
    lines = []
    for line in text.split("\n"):
        line = _WT_UNK.sub(WIKITEXT_UNK, line.strip())
        heading = _WT_HEADING.match(line)
        if heading and heading.group(1).count("=") == heading.group(3).count("="):
            line = heading.group(2).strip()
        line = _WT_NUMBER_JOIN.sub(r"\1", line)
        line = _WT_CLITIC.sub(r"\1", line)
        line = _WT_PLURAL_POSSESSIVE.sub("'", line)
        line = _WT_QUOTED.sub(r'"\1"', line)
        line = _WT_SPACE_BEFORE.sub(r"\1", line)
        line = _WT_SPACE_AFTER.sub(r"\1", line)
        lines.append(line)
    return "\n".join(lines)


REASONS = {"empty_after_normalize": "nothing but whitespace left after normalization"}

# `--detokenize` choices: the name of a corpus's tokenization -> the function that undoes it.
DETOKENIZERS = {"wikitext": detokenize_wikitext}


@dataclass
class NormalizeStage(StageOptions):
    fix_unicode: bool = option(True, help="skip ftfy.fix_text", flag="--no-fix-unicode")
    nfc: bool = option(True, help="skip Unicode NFC normalization", flag="--no-nfc")
    whitespace: bool = option(True, help="skip whitespace clean-up", flag="--no-whitespace")
    # a DETOKENIZERS name: undo that corpus's tokenization first
    detokenize: str | None = option(
        None,
        cli={"choices": sorted(DETOKENIZERS)},
        help="undo a corpus's tokenization first: wikitext joins ' @-@ ', ' @,@ ', ' @.@ ', attaches punctuation,"
        " brackets, quotes and clitics, writes headings as plain lines and <unk> as UNK (default: none)",
    )

    name = "normalize"

    def __post_init__(self) -> None:
        if self.detokenize is not None and self.detokenize not in DETOKENIZERS:
            raise ConfigError(f"detokenize must be one of {', '.join(DETOKENIZERS)}, got {self.detokenize!r}")

    def versions(self) -> dict[str, str]:
        import ftfy

        return {"ftfy": ftfy.__version__, "unicodedata": unicodedata.unidata_version}

    def normalize(self, text: str) -> tuple[str, list[str]]:
        """The normalized text and the names of the steps that changed it."""
        changed = []
        if self.detokenize is not None:
            detokenized = DETOKENIZERS[self.detokenize](text)
            if detokenized != text:
                changed.append("detokenize")
            text = detokenized
        if self.fix_unicode:
            import ftfy

            fixed = ftfy.fix_text(text, normalization="NFC" if self.nfc else None)
            if fixed != text:
                changed.append("fix_unicode")
            text = fixed
        if self.nfc:
            composed = unicodedata.normalize("NFC", text)
            if composed != text:
                changed.append("nfc")
            text = composed
        if self.whitespace:
            cleaned = clean_whitespace(text)
            if cleaned != text:
                changed.append("whitespace")
            text = cleaned
        return text, changed

    def process(self, docs: pd.DataFrame) -> Batch:
        import pandas as pd

        stats: dict[str, int] = {}
        texts = []
        for text in docs["text"].tolist():
            normalized, changed = self.normalize(text)
            texts.append(normalized)
            for step in changed:
                stats[f"changed.{step}"] = stats.get(f"changed.{step}", 0) + 1
        # Strings even when the batch is empty (an empty list would become a float column).
        docs = docs.assign(text=pd.Series(texts, index=docs.index, dtype=object))
        empty = docs["text"].str.strip().str.len() == 0
        return Batch(
            n_in=len(docs), kept=docs[~empty], rejected=reject(docs[empty], "empty_after_normalize"), stats=stats
        )


STAGES = (
    Stage(
        "normalize",
        NormalizeStage,
        help="fix Unicode (ftfy), NFC, clean whitespace; optionally undo WikiText's tokenization",
        description="Repair mojibake and HTML entities (ftfy), compose Unicode (NFC) and clean whitespace, after"
        " undoing a corpus's tokenization with --detokenize. The stats count the documents each step changed;"
        " a document left empty is rejected (empty_after_normalize).",
    ),
)
