"""Decontamination against the real benchmark files in ../shared/data/eval."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.synthetic import wikitext_articles
from tokenmill.curate.decontaminate import EvalTask, build_table, run_decontaminate
from tokenmill.curate.dedup.shingles import TextNormalization
from tokenmill.curate.documents import write_documents
from tokenmill.errors import TokenmillError


@pytest.fixture(scope="module")
def eval_dir(shared_data):
    return shared_data / "eval"


def lines(path, n):
    with open(path) as handle:
        return [json.loads(next(handle)) for _ in range(n)]


def test_documents_quoting_eval_text_are_rejected_with_task_and_ngram(tmp_path, shared_data, eval_dir, dask_client):
    articles = wikitext_articles(shared_data / "corpus" / "wikitext2_valid.txt")[:30]
    lambada = lines(eval_dir / "lambada_openai_test.jsonl", 3)
    boolq = lines(eval_dir / "boolq_dev.jsonl", 2)
    piqa = lines(eval_dir / "piqa_valid.jsonl", 1)
    docs = pd.DataFrame(
        {
            "id": [f"wiki-{i}" for i in range(len(articles))]
            + ["lambada-leak", "boolq-leak", "piqa-leak", "near-miss", "too-short"],
            "text": articles
            + [
                articles[0][:400] + "\n" + lambada[1]["text"].upper() + " And then the story went on.",
                "Quiz: " + boolq[0]["passage"][:300].replace(",", " ,") + " ... " + boolq[0]["question"],
                "How to do it: " + piqa[0]["sol1"] + " " + piqa[0]["sol2"] + " " + piqa[0]["goal"],
                # Only 12 consecutive words of a LAMBADA passage: below the 13-gram.
                " ".join(lambada[2]["text"].split()[:12]) + " unrelated ending words here",
                "in the",
            ],
            "source": "mixed",
        }
    )
    for i in range(2):
        write_documents(docs.iloc[i::2], tmp_path / "in" / f"p{i}.parquet")
    tasks = [
        str(eval_dir / "lambada_openai_test.jsonl"),
        f"boolq={eval_dir / 'boolq_dev.jsonl'}:passage,question",
        f"piqa={eval_dir / 'piqa_valid.jsonl'}",
    ]
    manifest = run_decontaminate(tmp_path / "in", tmp_path / "out", tasks, client=dask_client, progress=False)
    counts = manifest["counts"]
    assert counts["in"] == len(docs) == counts["kept"] + sum(counts["rejected"].values())
    rejected = pd.read_parquet(tmp_path / "out" / "rejected").set_index("id")
    assert rejected["reason"].to_dict() == {
        "lambada-leak": "contaminated:lambada_openai_test",
        "boolq-leak": "contaminated:boolq",
        "piqa-leak": "contaminated:piqa",
    }
    # The matched n-gram is 13 normalized words that occur in the eval text.
    for ngram in rejected["matched_ngram"]:
        assert len(ngram.split()) == 13
    assert rejected.loc["lambada-leak", "matched_ngram"] in TextNormalization().apply(lambada[1]["text"])
    assert rejected.loc["lambada-leak", "matched_ngrams"] >= 10
    kept = pd.read_parquet(tmp_path / "out" / "kept")
    assert {"near-miss", "too-short", "wiki-0"} <= set(kept["id"])
    assert manifest["eval_tasks"]["lambada_openai_test"]["ngrams"] > 200_000


def test_table_skips_short_eval_texts_and_reads_fields(eval_dir):
    table = build_table((EvalTask.parse(f"wino={eval_dir / 'winogrande_dev.jsonl'}:sentence"),), 13, "lower,punct")
    stats = table.stats["wino"]
    assert stats["texts"] == 1267 and stats["too_short"] < 100 and stats["ngrams"] > 5000
    everything = build_table((EvalTask.parse(str(eval_dir / "winogrande_dev.jsonl")),), 13, "lower,punct")
    assert everything.stats["winogrande_dev"]["texts"] > 1267  # all string fields: sentence, options, answer


def test_bad_task_files_are_clear_errors(tmp_path, eval_dir, curate_cli, capsys):
    with pytest.raises(TokenmillError, match="not found"):
        EvalTask.parse(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(TokenmillError, match="bad.jsonl:2"):
        EvalTask.parse(str(bad)).texts()
    with pytest.raises(TokenmillError, match="field"):
        EvalTask.parse(f"{eval_dir / 'boolq_dev.jsonl'}:nope").texts()
    write_documents(pd.DataFrame({"id": ["a"], "text": ["x"], "source": ["s"]}), tmp_path / "in" / "a.parquet")
    code = curate_cli("decontaminate", tmp_path / "in", tmp_path / "o", "--task", str(bad))
    assert code == 1 and "bad.jsonl:2" in capsys.readouterr().err


def test_cli_decontaminate(tmp_path, shared_data, eval_dir, curate_cli, capsys):
    lambada = lines(eval_dir / "lambada_openai_test.jsonl", 1)[0]["text"]
    docs = pd.DataFrame(
        {"id": ["clean", "leak"], "text": ["Nothing to see here, just words " * 5, lambada], "source": "s"}
    )
    write_documents(docs, tmp_path / "in" / "a.parquet")
    code = curate_cli(
        "decontaminate",
        tmp_path / "in",
        tmp_path / "out",
        "--task",
        f"lambada={eval_dir / 'lambada_openai_test.jsonl'}",
        "--fields",
        "text",
    )
    assert code == 0
    assert "contaminated:lambada: 1" in capsys.readouterr().err
