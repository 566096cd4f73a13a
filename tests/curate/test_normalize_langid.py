"""Normalize and language identification on hand-made and real text."""

from __future__ import annotations

import unicodedata

import pandas as pd
import pytest

from tokenmill.curate.langid import LangIdStage
from tokenmill.curate.normalize import NormalizeStage, clean_whitespace
from tokenmill.errors import TokenmillError


def docs(texts):
    return pd.DataFrame({"id": [str(i) for i in range(len(texts))], "text": texts, "source": "t"})


def test_normalize_repairs_mojibake_composes_and_cleans_whitespace():
    decomposed = unicodedata.normalize("NFD", "café naïve")
    out = NormalizeStage().process(
        docs(["The Mona Lisa doesnâ€™t have eyebrows.", decomposed, "a  b \r\n\r\n\r\n\r\nc   ", "  \u200b "])
    )
    texts = out.kept["text"].tolist()
    assert texts[0] == "The Mona Lisa doesn't have eyebrows."
    assert texts[1] == "café naïve" and len(texts[1]) == 10
    assert texts[2] == "a b\n\nc"
    assert out.n_in == 4 and len(out.kept) + len(out.rejected) == 4
    assert out.stats["changed.fix_unicode"] >= 1 and out.stats["changed.whitespace"] >= 1


def test_each_normalize_step_can_be_turned_off():
    decomposed = unicodedata.normalize("NFD", "café")
    stage = NormalizeStage(fix_unicode=False, nfc=False, whitespace=False)
    out = stage.process(docs(["doesnâ€™t", decomposed, "a  b  "]))
    assert out.kept["text"].tolist() == ["doesnâ€™t", decomposed, "a  b  "]
    assert out.stats == {}
    only_nfc = NormalizeStage(fix_unicode=False, whitespace=False).process(docs([decomposed]))
    assert only_nfc.kept["text"].tolist() == ["café"]


def test_whitespace_clean_up_keeps_paragraph_breaks():
    assert clean_whitespace("para one.\n\n\n\npara two.\n") == "para one.\n\npara two."
    assert clean_whitespace("  indented line\n\tx") == "indented line\n\tx"


def test_langid_labels_and_keeps_chosen_languages():
    texts = [
        "The committee will publish its annual report on the state of the railways next week.",
        "Die Kommission wird ihren Jahresbericht über den Zustand der Eisenbahnen nächste Woche veröffentlichen.",
        "La commission publiera la semaine prochaine son rapport annuel sur l'état des chemins de fer.",
        "委員会は来週、鉄道の状況に関する年次報告書を公表する予定です。",
    ]
    out = LangIdStage(languages=["en", "fr"]).process(docs(texts))
    assert sorted(out.kept["lang"]) == ["en", "fr"]
    assert sorted(out.rejected["lang"]) == ["de", "ja"]
    assert set(out.rejected["reason"]) == {"langid.language"}
    assert (out.kept["lang_score"] > 0.65).all()
    everything = LangIdStage(languages=[], min_score=0.0).process(docs(texts))
    assert len(everything.kept) == 4


def test_langid_bad_options_are_clear(tmp_path):
    with pytest.raises(TokenmillError, match="min-score"):
        LangIdStage(min_score=1.5)
    with pytest.raises(TokenmillError, match="not found"):
        LangIdStage(model=str(tmp_path / "nope.bin"))


def test_normalize_an_empty_partition():
    # An empty part (a JSONL byte range holding no line start) passes through with no error.
    empty = pd.DataFrame({"id": pd.Series([], dtype=object), "text": pd.Series([], dtype=object), "source": "x"})
    output = NormalizeStage().process(empty)
    assert output.n_in == 0 and output.kept.empty and output.rejected.empty
