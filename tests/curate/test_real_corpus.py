"""The curation stages on the real corpora: WikiText articles and Shakespeare."""

from __future__ import annotations

import pandas as pd

from tokenmill.cli import main
from tokenmill.curate.ingest import ingest
from tokenmill.curate.langid import LangIdStage
from tokenmill.curate.normalize import NormalizeStage
from tokenmill.curate.stage import run_stage
from tokenmill.infra.document_dirs import read_manifest

WIKITEXT_ARTICLE = r"^(?= = [^=])"


def balanced(manifest) -> bool:
    counts = manifest["counts"]
    return counts["in"] == counts["kept"] + sum(counts["rejected"].values())


def test_wikitext_and_shakespeare_through_ingest_normalize_langid(
    tmp_path, shared_data, dask_client, dask_client_1, capsys
):
    corpus = shared_data / "corpus"
    wiki = ingest(
        [corpus / "wikitext2_valid.txt", corpus / "wikitext2_test.txt"],
        tmp_path / "wiki",
        separator=WIKITEXT_ARTICLE,
        client=dask_client,
        progress=False,
    )
    # Each file starts with a blank line before its first title: two empty pieces, no lost article.
    assert wiki["counts"]["rejected"] == {"empty_text": 2}
    assert 110 <= wiki["counts"]["kept"] <= 140
    plays = ingest(
        corpus / "tinyshakespeare.txt", tmp_path / "plays", separator=r"\n\s*\n", client=dask_client, progress=False
    )
    assert plays["counts"]["kept"] > 7000 and plays["counts"]["rejected"] == {}

    for name in ("wiki", "plays"):
        normalized = run_stage(
            NormalizeStage(), tmp_path / name, tmp_path / f"{name}-norm", client=dask_client, progress=False
        )
        assert balanced(normalized) and normalized["counts"]["in"] == read_manifest(tmp_path / name)["counts"]["kept"]
        langid = run_stage(
            LangIdStage(), tmp_path / f"{name}-norm", tmp_path / f"{name}-lang", client=dask_client, progress=False
        )
        assert balanced(langid)
    wiki_lang = read_manifest(tmp_path / "wiki-lang")
    # Whole Wikipedia articles are English with confidence.
    assert wiki_lang["counts"]["kept"] == wiki["counts"]["kept"]
    assert wiki_lang["stats"] == {"lang.en": wiki["counts"]["kept"]}
    plays_lang = read_manifest(tmp_path / "plays-lang")
    # Speeches are short (many are one line); most are still recognised as English.
    assert plays_lang["counts"]["kept"] / plays_lang["counts"]["in"] > 0.75
    assert plays_lang["stats"]["lang.en"] / plays_lang["counts"]["in"] > 0.8

    # One worker gives the same documents as two.
    run_stage(LangIdStage(), tmp_path / "plays-norm", tmp_path / "plays-lang-1", client=dask_client_1, progress=False)
    frames = []
    for directory in ("plays-lang", "plays-lang-1"):
        files = sorted((tmp_path / directory / "kept").glob("*.parquet"))
        frames.append(pd.concat([pd.read_parquet(f) for f in files]).sort_values("id", ignore_index=True))
    pd.testing.assert_frame_equal(frames[0], frames[1])

    assert main(["inspect", str(tmp_path / "plays-lang"), "--samples", "1"]) == 0
    printed = capsys.readouterr().out
    assert "stage langid" in printed and "langid.low_score" in printed and "kept samples:" in printed
