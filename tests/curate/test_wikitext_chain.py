"""WikiText articles through normalize --detokenize wikitext and the rule filter, as the README
runs them, and `tokenmill inspect` explaining what the filter removed."""

from __future__ import annotations

import os
import subprocess
import sys

from tokenmill.curate.normalize import detokenize_wikitext
from tokenmill.infra.document_dirs import read_manifest


def test_detokenize_wikitext_lines():
    assert detokenize_wikitext(" = = Early life = = ") == "Early life"
    assert detokenize_wikitext(" = Homarus gammarus = ") == "Homarus gammarus"
    assert (
        detokenize_wikitext(
            " It weighs 0 @.@ 7 – 2 @.@ 2 kg ( 1 @.@ 5 lb ) , costs $ 1 @,@ 000 and is state @-@ owned . "
        )
        == "It weighs 0.7 – 2.2 kg (1.5 lb), costs $1,000 and is state-owned."
    )
    assert detokenize_wikitext(' He said " it is n\'t mine " ; the players \' song " It Don \'t Come Easy " . ') == (
        'He said "it isn\'t mine"; the players\' song "It Don\'t Come Easy".'
    )
    assert detokenize_wikitext("a species of <unk> lobster") == "a species of UNK lobster"
    # Paragraph structure is kept: one line in, one line out.
    assert detokenize_wikitext(" a . \n \n b . ").split("\n") == ["a.", "", "b."]


def tokenmill(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_wikitext_articles_pass_the_rules_once_detokenized(tmp_path, shared_data):
    wiki = shared_data / "corpus" / "wikitext2_valid.txt"
    run = ["--no-progress"]
    steps = [
        ["curate", "ingest", "--input", str(wiki), "--separator", "^(?= = [^=])", "--output", str(tmp_path / "ingest")],
        ["curate", "normalize", "--input", str(tmp_path / "ingest"), "--output", str(tmp_path / "plain")],
        [
            "curate",
            "normalize",
            "--input",
            str(tmp_path / "ingest"),
            "--output",
            str(tmp_path / "detok"),
            "--detokenize",
            "wikitext",
        ],
        ["curate", "filter", "--input", str(tmp_path / "plain"), "--output", str(tmp_path / "filter-plain")],
        ["curate", "filter", "--input", str(tmp_path / "detok"), "--output", str(tmp_path / "filter")],
    ]
    for step in steps:
        done = tokenmill(*step, *run)
        assert done.returncode == 0, done.stderr
    assert read_manifest(tmp_path / "detok")["stats"]["changed.detokenize"] == 60
    plain = read_manifest(tmp_path / "filter-plain")["counts"]
    detok = read_manifest(tmp_path / "filter")["counts"]
    # Tokenized, nearly every article fails Gopher's "80% of tokens contain a letter"; detokenized,
    # nearly every article passes, and what is rejected fails on its content, not on the format.
    assert plain["in"] == detok["in"] == 60
    assert plain["kept"] <= 5 and plain["rejected"]["gopher_quality.alpha_words"] >= 50
    assert detok["kept"] >= 55, detok

    done = tokenmill("inspect", str(tmp_path / "filter"), "--samples", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "rejected, by reason:" in out
    for reason in detok["rejected"]:
        assert reason in out
    if "gopher_quality.alpha_words" in detok["rejected"]:
        assert "fewer than 80% of the tokens" in out
    # What C4's line rules removed from kept documents, and why.
    assert "c4.lines_removed.terminal_punct" in out and "does not end in terminal punctuation" in out


def test_inspect_explains_with_the_thresholds_the_stage_ran_with(tmp_path, shared_data):
    wiki = shared_data / "corpus" / "wikitext2_valid.txt"
    done = tokenmill(
        "curate",
        "ingest",
        "--input",
        str(wiki),
        "--separator",
        r"\n \n",
        "--output",
        str(tmp_path / "paras"),
        "--workers",
        "1",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    done = tokenmill(
        "curate",
        "filter",
        "--input",
        str(tmp_path / "paras"),
        "--output",
        str(tmp_path / "filter"),
        "--set",
        "gopher_quality.min_words=20",
        "--workers",
        "1",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    counts = read_manifest(tmp_path / "filter")["counts"]
    assert counts["rejected"].get("gopher_quality.min_words", 0) > 0  # headings alone are fragments
    done = tokenmill("inspect", str(tmp_path / "filter"), "--json")
    import json

    report = json.loads(done.stdout)
    assert report["explanations"]["gopher_quality.min_words"].startswith("fewer than 20 words")
    assert set(report["explanations"]) >= set(counts["rejected"])
