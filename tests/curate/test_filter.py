"""The filter stage: accounting, reasons, C4 edits, options, CLI, and the real corpora."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from tokenmill.curate.documents import write_documents
from tokenmill.curate.filter import FilterStage
from tokenmill.curate.stage import run_stage
from tokenmill.errors import ConfigError
from tokenmill.infra.document_dirs import read_manifest

GOOD = (
    "The river runs past the old stone house and the green fields that have been farmed with care for many years.\n"
    "Every spring the water rises over the banks, and the farmers move their sheep to the higher ground.\n"
    "In summer the children swim in the pools below the mill, where the current is slow and the water is warm.\n"
    "Autumn brings the harvest, when the whole village works together to bring in the grain before the rain.\n"
    "In winter the river freezes at the edges, and the old men sit by the fire telling stories of floods."
)


# 8 sentences of 4 words: fewer than Gopher's 50 words, but C4's 5 sentences and no repetition
SHORT = (
    "Mills grind grain slowly. Rivers carry water south. Sheep graze beside hedges. Children swim every summer. "
    "Farmers harvest golden wheat. Bakers wake before dawn. Bells ring across valleys. Travellers rest near bridges."
)


def frame(texts: dict[str, object]) -> pd.DataFrame:
    return pd.DataFrame({"id": list(texts), "text": list(texts.values()), "source": "test"})


def read_dir(path) -> pd.DataFrame:
    files = sorted(path.glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def test_filter_stage_keeps_rejects_and_edits():
    docs = frame(
        {
            "good": GOOD,
            "menu": GOOD + "\nHome\nAbout us\nContact",  # C4 removes the three menu lines
            "short": SHORT,
            "braces": GOOD + "\nThe set {a, b} has two members in it.",
            "none": None,
        }
    )
    out = FilterStage().process(docs)
    assert out.n_in == 5 and len(out.kept) + len(out.rejected) == 5
    kept = dict(zip(out.kept["id"], out.kept["text"]))
    assert set(kept) == {"good", "menu"}
    assert kept["good"] == GOOD and kept["menu"] == GOOD
    reasons = dict(zip(out.rejected["id"], out.rejected["reason"]))
    assert reasons == {"short": "gopher_quality.min_words", "braces": "c4.curly_bracket", "none": "filter.no_text"}
    # rejected documents keep their original text
    assert out.rejected.set_index("id").loc["braces", "text"].endswith("{a, b} has two members in it.")
    assert out.stats["c4.lines_removed"] == 3 and out.stats["c4.lines_removed.terminal_punct"] == 3
    assert out.stats["c4.docs_edited"] == 1


def test_filter_options_turn_rules_off_and_change_thresholds(tmp_path):
    docs = frame({"short": SHORT, "braces": GOOD + "\nThe set {a, b} has two members in it."})
    assert FilterStage().process(docs).kept.empty
    relaxed = FilterStage.from_options(
        disable=["c4.curly_bracket", "fineweb", "gopher_quality.stop_words"],
        settings={"gopher_quality.min_words": "10", "gopher_repetition.max_top_2_gram": "off"},
    )
    out = relaxed.process(docs)
    assert sorted(out.kept["id"]) == ["braces", "short"]
    assert relaxed.manifest_config()["rules"]["gopher_quality"]["min_words"] == 10
    config = tmp_path / "rules.yaml"
    config.write_text(
        "gopher_quality:\n  min_words: 10\n  min_stop_words: null\nc4:\n  disable: [curly_bracket]\nfineweb: false\ngopher_repetition: false\n"
    )
    assert sorted(FilterStage.from_options(config).process(docs).kept["id"]) == ["braces", "short"]
    # the same mapping given to the dataclass (as a pipeline recipe does)
    mapping = {
        "gopher_quality": {"min_words": 10, "min_stop_words": None},
        "c4": {"disable": ["curly_bracket"]},
        "fineweb": False,
        "gopher_repetition": False,
    }
    assert sorted(FilterStage(rules=mapping).process(docs).kept["id"]) == ["braces", "short"]
    with pytest.raises(ConfigError):
        FilterStage.from_options(disable=["gopher_quality.nonsense"])
    with pytest.raises(ConfigError, match="not found"):
        FilterStage.from_options(tmp_path / "missing.yaml")


def detokenize_wikitext(text: str) -> str:
    """WikiText-2 is tokenized (` , `, ` @-@ `, `<unk>`); put it back into running text."""
    text = text.replace("<unk>", "unk")
    text = re.sub(r" @([-.,])@ ", r"\1", text)
    text = re.sub(r" ([.,;:!?)\]'])", r"\1", text)
    text = re.sub(r"([(\[]) ", r"\1", text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    # strip the lines and keep one blank line between paragraphs (what normalize does)
    text = "\n".join(line.strip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def corpus_frames(corpus) -> tuple[pd.DataFrame, pd.DataFrame]:
    articles = []
    for split in ("valid", "test"):
        raw = (corpus / f"wikitext2_{split}.txt").read_text(encoding="utf-8")
        articles += [a for a in re.split(r"(?m)^(?= = [^=].* = \s*$)", raw) if a.strip()]
    wiki = pd.DataFrame(
        {
            "id": [f"wiki-{i}" for i in range(len(articles))],
            "text": [detokenize_wikitext(a) for a in articles],
            "source": "wikitext2",
        }
    )
    speeches = (corpus / "tinyshakespeare.txt").read_text(encoding="utf-8").split("\n\n")
    scenes = ["\n\n".join(speeches[i : i + 30]) for i in range(0, len(speeches), 30)]
    plays = pd.DataFrame({"id": [f"scene-{i}" for i in range(len(scenes))], "text": scenes, "source": "shakespeare"})
    return wiki, plays


def test_filter_on_real_corpora(tmp_path, shared_data, dask_client):
    wiki, plays = corpus_frames(shared_data / "corpus")
    write_documents(wiki, tmp_path / "in" / "wiki.parquet")
    write_documents(plays, tmp_path / "in" / "plays.parquet")
    manifest = run_stage(FilterStage(), tmp_path / "in", tmp_path / "filter", client=dask_client, progress=False)
    counts = manifest["counts"]
    assert counts["in"] == len(wiki) + len(plays)
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    assert read_manifest(tmp_path / "filter")["counts"] == counts
    assert all(re.fullmatch(r"(gopher_quality|gopher_repetition|c4|fineweb)\.\w+", r) for r in counts["rejected"])

    kept = read_dir(tmp_path / "filter" / "kept")
    rejected = read_dir(tmp_path / "filter" / "rejected")
    assert len(kept) == counts["kept"] and len(rejected) == sum(counts["rejected"].values())
    assert set(kept["id"]) | set(rejected["id"]) == set(wiki["id"]) | set(plays["id"])
    by_source = kept["source"].value_counts()
    # Encyclopaedia articles mostly pass web-text heuristics ...
    assert by_source["wikitext2"] / len(wiki) > 0.7
    # ... verse passes less often (short lines, lines without terminal punctuation, repeated
    # speaker names), but prose-like scenes do.
    assert 0.2 < by_source["shakespeare"] / len(plays) < 0.8
    play_reasons = rejected[rejected["source"] == "shakespeare"]["reason"].value_counts()
    assert play_reasons.index[0] in (
        "gopher_quality.alpha_words",
        "fineweb.short_line_ratio",
        "gopher_repetition.dup_line_frac",
    )
    # C4 removed lines (headings, verse lines without terminal punctuation) and edited kept texts
    stats = manifest["stats"]
    assert stats["c4.lines_removed"] > 0 and stats["c4.lines_removed.terminal_punct"] > 0
    assert stats["c4.lines_in"] > stats["c4.lines_removed"]
    assert not kept["text"].str.contains(r"(?m)^ ?=.*= ?$").any()  # article headings are gone
    assert (
        kept["text"]
        .map(lambda t: all(line.rstrip().endswith((".", "?", "!", '"', "'")) for line in t.split("\n")))
        .all()
    )


@pytest.mark.slow
def test_filter_same_documents_with_one_and_two_workers(tmp_path, shared_data, dask_client, dask_client_1):
    wiki, plays = corpus_frames(shared_data / "corpus")
    for i in range(4):  # four partitions
        write_documents(pd.concat([wiki, plays]).iloc[i::4], tmp_path / "in" / f"part-{i}.parquet")
    outputs = []
    for name, client in (("two", dask_client), ("one", dask_client_1)):
        run_stage(FilterStage(), tmp_path / "in", tmp_path / name, client=client, progress=False)
        outputs.append(
            {
                part: read_dir(tmp_path / name / part).sort_values("id").reset_index(drop=True)
                for part in ("kept", "rejected")
            }
        )
    for part in ("kept", "rejected"):
        assert outputs[0][part].equals(outputs[1][part])


def test_filter_cli(tmp_path, curate_cli, capsys):
    docs = frame({"good": GOOD, "short": SHORT, "menu": GOOD + "\nHome\nContact"})
    write_documents(docs, tmp_path / "in" / "part.parquet")
    assert curate_cli("filter", tmp_path / "in", tmp_path / "out") == 0
    printed = capsys.readouterr().err
    assert "filter: in 3, kept 2, rejected 1" in printed and "gopher_quality.min_words: 1" in printed
    assert "c4 removed 2 of" in printed
    manifest = read_manifest(tmp_path / "out")
    assert manifest["counts"] == {"in": 3, "kept": 2, "rejected": {"gopher_quality.min_words": 1}}
    assert manifest["config"]["rules"]["gopher_quality"]["min_words"] == 50

    assert (
        curate_cli(
            "filter",
            tmp_path / "out",
            tmp_path / "out2",
            "--no-c4",
            "--no-fineweb",
            "--set",
            "gopher_quality.min_words=5",
            "--disable",
            "gopher_repetition",
        )
        == 0
    )
    manifest = read_manifest(tmp_path / "out2")
    assert manifest["counts"]["kept"] == 2 and manifest["config"]["rules"]["c4"]["enabled"] is False

    assert curate_cli("filter", tmp_path / "in", tmp_path / "bad", "--set", "gopher_quality.min_words=lots") == 1
    assert "cannot read 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
