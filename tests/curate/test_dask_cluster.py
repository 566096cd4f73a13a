"""Every curation stage and `encode` on a real Dask cluster of separate processes (`dask
scheduler` + two `dask worker`s from the command line) give what the LocalCluster run gives."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from dask_processes import assert_same_stage, cluster, tokenmill

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def write_web_like_corpus(shared_data: Path, directory: Path, files: int = 4) -> Path:
    """Real paragraphs (WikiText-2 test, Shakespeare) as JSONL files, with exact and near
    duplicates, a few empty and non-English records and a PIQA goal planted, so that every
    stage keeps some documents and rejects others."""
    wiki = [p.strip() for p in (shared_data / "corpus" / "wikitext2_test.txt").read_text().split("\n")]
    wiki = [p for p in wiki if len(p) > 200 and not re.fullmatch(r"=.*=", p)][:160]
    plays = [p.strip() for p in (shared_data / "corpus" / "tinyshakespeare.txt").read_text().split("\n\n")]
    plays = [p for p in plays if len(p) > 150][:100]
    piqa = [json.loads(line) for line in (shared_data / "eval" / "piqa_valid.jsonl").open()][:5]
    rng = random.Random(7)
    texts = wiki + plays
    texts += rng.sample(wiki, 12)  # exact duplicates
    texts += [t.replace(" the ", " a ", 2) for t in rng.sample(wiki, 12)]  # near duplicates
    texts += [f"{text} {row['goal']} {row['sol1']}" for text, row in zip(plays, piqa)]  # contamination
    texts += ["", "Der schnelle braune Fuchs springt über den faulen Hund und läuft in den Wald."]
    rng.shuffle(texts)
    directory.mkdir(parents=True)
    per_file = -(-len(texts) // files)
    for f in range(files):
        with (directory / f"web-{f}.jsonl").open("w") as handle:
            for text in texts[f * per_file : (f + 1) * per_file]:
                handle.write(json.dumps({"text": text}) + "\n")
    return directory


@pytest.fixture(scope="module")
def dask_processes(tmp_path_factory):
    processes = cluster(tmp_path_factory.mktemp("dask"), workers=2)
    yield processes
    processes.close()


def test_every_stage_and_encode_on_a_dask_cluster_equal_the_local_cluster(tmp_path, shared_data, dask_processes):
    raw = write_web_like_corpus(shared_data, tmp_path / "raw")
    piqa = str(shared_data / "eval" / "piqa_valid.jsonl")
    chain = [
        ("ingest", ["--source", "web"]),
        ("normalize", []),
        ("langid", ["--languages", "en"]),
        ("filter", []),
        ("dedup", ["--method", "exact"]),
        ("dedup", ["--threshold", "0.7", "--verify"]),
        ("decontaminate", ["--task", piqa]),
    ]
    source = raw
    rejected_somewhere = set()
    for step, (stage, options) in enumerate(chain):
        local, remote = tmp_path / "local" / f"{step}-{stage}", tmp_path / "cluster" / f"{step}-{stage}"
        tokenmill("curate", stage, "--input", str(source), "--output", str(local), "--workers", "2", *options)
        tokenmill("curate", stage, "--input", str(source), "--output", str(remote), "--scheduler", dask_processes.address, *options)  # fmt: skip
        manifest = assert_same_stage(remote, local)
        assert manifest["counts"]["kept"] > 0
        rejected_somewhere |= set(manifest["counts"]["rejected"])
        source = local
    # The corpus exercises each stage's rejections, not only its pass-through.
    assert {"empty_text", "exact_duplicate", "near_duplicate"} <= rejected_somewhere
    assert any(reason.startswith("contaminated:") for reason in rejected_somewhere)

    tokenizer = tmp_path / "tokenizer.json"
    tokenmill(
        "tokenize",
        "train-tokenizer",
        "--input",
        str(source),
        "--vocab-size",
        "1000",
        "--output",
        str(tokenizer),
        quiet=False,
    )
    local, remote = tmp_path / "local" / "shard", tmp_path / "cluster" / "shard"
    common = ["--input", str(source), "--tokenizer", str(tokenizer)]
    tokenmill("tokenize", "encode", *common, "--output-prefix", str(local), "--workers", "2")
    tokenmill("tokenize", "encode", *common, "--output-prefix", str(remote), "--scheduler", dask_processes.address)
    for suffix in (".bin", ".idx"):
        assert Path(f"{remote}{suffix}").read_bytes() == Path(f"{local}{suffix}").read_bytes()
    meta = json.loads(Path(f"{remote}.json").read_text())
    assert meta["partitions"]["total"] >= 2 and meta["documents"] > 0
