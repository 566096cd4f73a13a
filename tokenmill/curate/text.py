"""Text helpers shared by curation stages: word splitting, punctuation sets, sentence counts.

Words are split by one compiled regular expression that approximates the spaCy English
tokenizer that datatrove uses for its Gopher / FineWeb rules (punctuation split off words,
`n't` and `'s`-style clitics split, numbers with separators kept whole, `...` and `--` kept as
one token). It runs in C (`re.findall`), one pass per document, which is what makes the rules
fast; the few places where it splits differently from spaCy are listed in docs/filter.md.
"""

from __future__ import annotations

import codecs
import re
import threading
from itertools import compress, repeat

# Punctuation and control characters: a token made only of these is a "symbol", not a word
# (the same role as datatrove's PUNCTUATION_SET; the list is ASCII punctuation, common
# Unicode quotes, dashes, brackets and CJK / full-width punctuation, and C0/C1 controls).
PUNCTUATION = (
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    "‘’‚‛“”„‟«»‹›–—―‐‑‒…·•►′″´¨¸˜"
    "、。，．：；？！「」『』【】〈〉《》（）〔〕［］｛｝～％＃＆＊＋－／＜＝＞＠＼＾＿｀｜"
    "━∶‧" + "".join(map(chr, (*range(0, 9), *range(11, 13), *range(14, 32), *range(127, 160))))
)

# Characters that end a sentence: Unicode's Sentence_Terminal property (the role of
# datatrove's TERMINAL_PUNCTUATION in the FineWeb line-punctuation rule). `…` is not one.
TERMINAL_PUNCTUATION = tuple(
    ".!?։؝؞؟۔܀܁܂߹࠷࠹࠽࠾।॥၊။።፧፨᙮᜵᜶។៕៖៙៚᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᭽᭾᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼⹓⹔。꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫"
    "﹒﹖﹗！．？｡"
    "𐩖𐩗𐽕𐽖𐽗𐽘𐽙𐾆𐾇𐾈𐾉𑁇𑁈𑂾𑂿𑃀𑃁𑅁𑅂𑅃𑇅𑇆𑇍𑇞𑇟𑈸𑈹𑈻𑈼𑊩𑑋𑑌𑗂𑗃𑗉𑗊𑗋𑗌𑗍𑗎𑗏𑗐𑗑𑗒𑗓𑗔𑗕𑗖𑗗"
    "𑙁𑙂𑜼𑜽𑜾𑥄𑥆𑩂𑩃𑪛𑪜𑱁𑱂𑻷𑻸\U00011f43\U00011f44𖩮𖩯𖫵𖬷𖬸𖭄𖺘𛲟𝪈"
)
PUNCTUATION += "".join(c for c in TERMINAL_PUNCTUATION if c not in PUNCTUATION) + "\r"

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")

_TOKEN = re.compile(
    r"""
      (?:[A-Za-z]\.){2,}                                  # U.S. e.g.
    | \w+[,;:?!]['’"]?-{2,}\w*                            # sir,-- again,--but friends,'--this (spaCy keeps these whole)
    | \w+-{2,}(?=\s|$)                                     # Capitol--
    | \w+,['’]\w+                                          # O,'tis
    | (?:[A-Za-z]|Mr|Mrs|Ms|Dr|St|Jr|Sr|Prof|Gen|Col|Capt|Rev|Mt|Ft|vs|etc|Inc|Ltd|Co|Corp
        |Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.(?=\s)  # J. Mr. Dr. (abbreviations)
    | [Cc]an(?=not\b)                                     # can|not
    | ['’](?:s|re|ve|ll|m|S|RE|VE|LL|M|em)\b              # clitics 's 're 've 'll 'm 'em
    | n['’]t\b                                            # do|n't
    | (?:(?!n['’]t\b)\w)+(?:['’](?!(?:s|re|ve|ll|m|S|RE|VE|LL|M)\b)\w+)*(?:[.,:/]\d+)*(?:-(?=\d)\w+)*  # words, call'd, 1,000 3.5 M-82
    | @[-.,]@                                              # WikiText's @-@ @.@ @,@
    | \.{2,}                                               # ellipsis
    | -{2,}                                                # dash --
    | [^\w\s]                                              # any other symbol, one per token
    """,
    re.VERBOSE,
)
_ALPHA_TOKEN = re.compile(r"\S*?[^\W\d_]\S*")  # a space-free token with a letter
_SENTENCE_END = re.compile(r"[.!?…]+['\"’”)\]]*\s+(?=[^\s.!?…'\"’”)\]])")
_WHITESPACE = re.compile(r"\s+")


def split_words(text: str) -> list[str]:
    """Word and symbol tokens of `text` (symbols are single tokens; see module docstring)."""
    return _TOKEN.findall(text)


def non_symbol_words(words: list[str]) -> list[str]:
    """Tokens with at least one character that is not punctuation."""
    return list(compress(words, map(str.strip, words, repeat(PUNCTUATION))))


def count_alpha_words(words: list[str]) -> int:
    """How many tokens contain at least one letter."""
    return len(_ALPHA_TOKEN.findall(" ".join(words)))


def count_sentences(line: str) -> int:
    """Sentences in a line: 1 plus the sentence ends (. ! ? ... with closing quotes or
    brackets) that are followed by more text, as spaCy's rule-based sentencizer splits."""
    if not line.strip():
        return 0
    return 1 + len(_SENTENCE_END.findall(line))


def single_line(text: str) -> str:
    """Text with every run of whitespace (newlines included) turned into one space."""
    return _WHITESPACE.sub(" ", text).strip()


# Undecodable bytes decoded with `decode_replacing` become U+FFFD and are counted here (per
# thread: a worker may run tasks in threads).
_replaced = threading.local()


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    _replaced.bytes += error.end - error.start
    return "\ufffd", error.end


codecs.register_error("tokenmill-count-replace", _count_and_replace)


def decode_replacing(data: bytes, codec: str) -> tuple[str, int]:
    """`data` decoded with each undecodable byte replaced by U+FFFD, and how many bytes were."""
    _replaced.bytes = 0
    text = data.decode(codec, errors="tokenmill-count-replace")
    return text, _replaced.bytes
