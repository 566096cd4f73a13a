"""The dedup stage on real text: exact and fuzzy dedup with planted near-duplicates of WikiText
articles, precision/recall against true Jaccard, 1 vs 2 workers, incremental index, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.synthetic import all_true_pairs, cluster_pairs, plant_near_duplicates, precision_recall, wikitext_articles
from tokenmill.cli import main as tokenmill_main
from tokenmill.curate.dedup import DedupConfig, run_dedup
from tokenmill.curate.documents import write_documents
from tokenmill.errors import ConfigError


@pytest.fixture(scope="module")
def articles(shared_data):
    corpus = shared_data / "corpus"
    return wikitext_articles(corpus / "wikitext2_valid.txt") + wikitext_articles(corpus / "wikitext2_test.txt")


@pytest.fixture(scope="module")
def planted(articles):
    return plant_near_duplicates(articles, rates=(0.0, 0.01, 0.02, 0.05, 0.1, 0.2), copies_per_rate=15, seed=3)


def write_parts(frame: pd.DataFrame, directory, n_parts: int = 3):
    for i in range(n_parts):
        write_documents(frame.iloc[i::n_parts], directory / f"part-{i}.parquet")
    return directory


def read_stage(directory) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    kept = pd.read_parquet(directory / "kept")
    rejected = (
        pd.read_parquet(directory / "rejected")
        if any((directory / "rejected").iterdir())
        else pd.DataFrame(columns=["id"])
    )
    return kept, rejected, json.loads((directory / "manifest.json").read_text())


def check_accounting(manifest, kept, rejected, n_in):
    counts = manifest["counts"]
    assert counts["in"] == n_in == counts["kept"] + sum(counts["rejected"].values())
    assert len(kept) == counts["kept"] and len(rejected) == sum(counts["rejected"].values())
    assert set(kept["id"]).isdisjoint(rejected["id"])


def test_exact_dedup_across_partitions(tmp_path, articles, dask_client):
    base = pd.DataFrame({"id": [f"a{i}" for i in range(60)], "text": articles[:60], "source": "wiki"})
    # Copies spread over other partitions; one differs only by whitespace and case.
    copies = pd.DataFrame(
        {
            "id": ["c0", "c1", "c2", "c3"],
            "text": [articles[0], articles[5], "  " + articles[5].replace(" ", "   ") + "\n", articles[7].upper()],
            "source": "copies",
            "quality_score": [0.9, 0.1, 0.2, 0.3],
        }
    )
    docs = pd.concat([copies, base], ignore_index=True)
    src = write_parts(docs, tmp_path / "in", 4)
    manifest = run_dedup(
        src, tmp_path / "out", DedupConfig(method="exact", normalize="none"), client=dask_client, progress=False
    )
    kept, rejected, manifest = read_stage(tmp_path / "out")
    check_accounting(manifest, kept, rejected, len(docs))
    assert manifest["counts"]["rejected"] == {"exact_duplicate": 3}
    # Input order decides: part-0 holds c0 (row 0) and a0 (row 4); c0 comes first.
    assert dict(zip(rejected["id"], rejected["kept_id"])) == {"a0": "c0", "a5": "c1", "c2": "c1"}
    assert (rejected["reason"] == "exact_duplicate").all()
    assert not (tmp_path / ".out.work").exists()  # checkpoints removed after success
    # With lower-casing, the upper-cased copy is a duplicate too; keep by quality.
    run_dedup(
        src,
        tmp_path / "out2",
        DedupConfig(method="exact", normalize="lower", keep="quality"),
        client=dask_client,
        progress=False,
    )
    kept, rejected, manifest = read_stage(tmp_path / "out2")
    assert manifest["counts"]["rejected"] == {"exact_duplicate": 4}
    assert dict(zip(rejected["id"], rejected["kept_id"]))["a0"] == "c0"
    assert dict(zip(rejected["id"], rejected["kept_id"]))["a7"] == "c3"  # 0.3 beats no score


def test_exact_index_dedups_new_data_against_the_old_corpus(tmp_path, articles, dask_client):
    """Exact dedup with --index: a later run rejects documents already in the corpus (kept id
    from the old run) and its own duplicates, then adds what it kept to the index."""
    index = tmp_path / "index"
    old = pd.DataFrame({"id": [f"old{i}" for i in range(40)], "text": articles[:40], "source": "old"})
    old = pd.concat([old, pd.DataFrame({"id": ["old_dup"], "text": [articles[3]], "source": "old"})], ignore_index=True)
    config = DedupConfig(method="exact", normalize="lower", index=str(index))
    run_dedup(write_parts(old, tmp_path / "old"), tmp_path / "old_out", config, client=dask_client, progress=False)
    kept_old, rejected_old, _ = read_stage(tmp_path / "old_out")
    assert set(rejected_old["id"]) == {"old_dup"}
    meta = json.loads((index / "index.json").read_text())
    assert meta["documents"] == 40 and meta["params"]["method"] == "exact"

    new = pd.DataFrame(
        {
            "id": ["n0", "n1", "n2", "n3", "n4"],
            "text": [articles[2].upper(), articles[50], articles[50], articles[51], articles[10]],
            "source": "new",
        }
    )
    run_dedup(write_parts(new, tmp_path / "new", 2), tmp_path / "new_out", config, client=dask_client, progress=False)
    kept, rejected, manifest = read_stage(tmp_path / "new_out")
    check_accounting(manifest, kept, rejected, len(new))
    assert manifest["dedup"]["index_documents"] == 40
    # n2 sits in the first file (n0, n2, n4), so it comes before n1 in input order.
    assert dict(zip(rejected["id"], rejected["kept_id"])) == {"n0": "old2", "n1": "n2", "n4": "old10"}
    assert set(kept["id"]) == {"n2", "n3"}
    assert json.loads((index / "index.json").read_text())["documents"] == 42
    # A third run sees the second one's documents too.
    again = pd.DataFrame({"id": ["m0"], "text": [articles[51]], "source": "again"})
    run_dedup(
        write_parts(again, tmp_path / "again", 1), tmp_path / "again_out", config, client=dask_client, progress=False
    )
    _, rejected, _ = read_stage(tmp_path / "again_out")
    assert dict(zip(rejected["id"], rejected["kept_id"])) == {"m0": "n3"}
    # Each run is one batch under its own key; one that kept nothing new lists no rows file.
    meta, rows = _index_state(index)
    assert [len(b["files"]) for b in meta["batches"]] == [3, 2, 0] and all(rows.values())
    assert len({b["key"] for b in meta["batches"]}) == 3 and meta["documents"] == sum(rows.values()) == 42
    # An exact index is not a fuzzy one, and the normalization must match.
    with pytest.raises(ConfigError, match="method: index 'exact' vs run 'fuzzy'"):
        run_dedup(tmp_path / "again", tmp_path / "x", DedupConfig(index=str(index)), client=dask_client, progress=False)
    with pytest.raises(ConfigError, match="normalize: index 'lower' vs run 'none'"):
        run_dedup(
            tmp_path / "again",
            tmp_path / "x",
            DedupConfig(method="exact", index=str(index)),
            client=dask_client,
            progress=False,
        )


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing of the run after this point happens (a BaseException, so
    that no handler of the run catches it)."""


def _decisions(directory) -> tuple[list[str], dict[str, str]]:
    kept, rejected, _ = read_stage(directory)
    return sorted(kept["id"]), dict(zip(rejected["id"], rejected["kept_id"]))


def _index_state(index) -> tuple[dict, dict[str, int]]:
    """index.json and the rows of each file it lists."""
    import pyarrow.parquet as pq

    meta = json.loads((index / "index.json").read_text())
    return meta, {name: pq.ParquetFile(index / name).metadata.num_rows for name in meta["files"]}


@pytest.mark.slow
def test_a_run_stopped_after_its_index_update_reruns_to_the_undisturbed_output(
    tmp_path, planted, dask_client, monkeypatch, capsys
):
    """A run killed right after index.json is written (output published, its documents in the
    index, no summary printed, work directory left), then the same command again: it finds its
    own batch in the index, prints the summary and ends with the undisturbed output, appending
    nothing. Its documents are never near-duplicates of themselves, even when rewritten inputs
    make it another run."""
    from tokenmill.curate.dedup import pipeline

    src = write_parts(planted.documents.iloc[:90], tmp_path / "in")
    run = {"client": dask_client, "progress": False}
    run_dedup(src, tmp_path / "calm", DedupConfig(index=str(tmp_path / "calm_index")), **run)
    calm = _decisions(tmp_path / "calm")
    calm_meta, calm_rows = _index_state(tmp_path / "calm_index")
    assert calm[1] and all(calm_rows.values())  # some near-duplicates; no empty rows file

    index = tmp_path / "index"
    config = DedupConfig(index=str(index), keep_work=True)
    write = pipeline.atomic_write_text

    def write_then_die(path, text):
        write(path, text)
        if Path(path).name == "index.json":
            raise _Killed

    monkeypatch.setattr(pipeline, "atomic_write_text", write_then_die)
    with pytest.raises(_Killed):
        run_dedup(src, tmp_path / "out", config, **run)
    monkeypatch.setattr(pipeline, "atomic_write_text", write)
    meta, rows = _index_state(index)
    assert rows == calm_rows and meta["documents"] == calm_meta["documents"] and len(meta["batches"]) == 1

    # The same command again: output and index are in place, so it prints the summary and stops.
    argv = ["curate", "dedup", "--input", str(src), "--output", str(tmp_path / "out"), "--index", str(index)]
    capsys.readouterr()
    assert tokenmill_main([*argv, "--scheduler", dask_client.scheduler.address, "--no-progress", "--keep-work"]) == 0
    err = capsys.readouterr().err
    assert f"dedup: in 90, kept {len(calm[0])}, rejected {len(calm[1])}" in err
    assert "already hold this run's result" in err
    assert _decisions(tmp_path / "out") == calm
    assert _index_state(index) == (meta, rows)

    # The output lost: the run queries the index as it was before its own batch, so its work
    # directory's fingerprint holds and every phase resumes; nothing is appended again.
    shutil.rmtree(tmp_path / "out")
    again = run_dedup(src, tmp_path / "out", config, **run)
    assert again["resumed_phases"] == ["signatures", "candidates", "components", "decisions"]
    assert _decisions(tmp_path / "out") == calm
    assert _index_state(index) == (meta, rows)

    # Rewritten inputs make another run, which finds each kept document in the index under
    # its own id: kept again and not added twice.
    for part in src.iterdir():
        part.write_bytes(part.read_bytes())
    fresh = run_dedup(src, tmp_path / "out3", DedupConfig(index=str(index)), **run)
    assert _decisions(tmp_path / "out3") == calm
    assert fresh["dedup"]["already_indexed"] == meta["documents"]
    meta3, rows3 = _index_state(index)
    assert rows3 == rows and meta3["documents"] == meta["documents"]
    assert meta3["batches"][-1] | {"added": 0} == {
        "key": fresh["dedup"]["run_key"],
        "owner": None,
        "files": [],
        "documents": 0,
        "added": 0,
    }


def fuzzy_quality(directory, planted):
    kept, rejected, manifest = read_stage(directory)
    check_accounting(manifest, kept, rejected, len(planted.documents))
    predicted = cluster_pairs(pd.concat([kept, rejected], ignore_index=True))
    truth = all_true_pairs(planted.documents, 0.8)
    truth_high = all_true_pairs(planted.documents, 0.9)
    return precision_recall(predicted, truth, truth_high), kept, rejected


def test_fuzzy_dedup_precision_recall_on_planted_duplicates(tmp_path, planted, dask_client):
    src = write_parts(planted.documents, tmp_path / "in")
    run_dedup(src, tmp_path / "plain", DedupConfig(threshold=0.8), client=dask_client, progress=False)
    run_dedup(src, tmp_path / "verified", DedupConfig(threshold=0.8, verify=True), client=dask_client, progress=False)
    plain, _, _ = fuzzy_quality(tmp_path / "plain", planted)
    verified, kept, rejected = fuzzy_quality(tmp_path / "verified", planted)
    print("without verification", plain)
    print("with verification", verified)
    assert verified["recall_high"] >= 0.95
    assert verified["precision"] >= 0.95
    assert plain["recall_high"] >= 0.95
    assert plain["predicted_pairs"] >= verified["predicted_pairs"]
    # Every rejected document names its cluster and the kept document, which was kept.
    assert (rejected["reason"] == "near_duplicate").all()
    assert rejected["kept_id"].isin(kept["id"]).all()
    assert rejected["cluster_id"].notna().all()
    kept_in_clusters = kept.dropna(subset=["cluster_id"])
    assert set(rejected["cluster_id"]) <= set(kept_in_clusters["cluster_id"])
    # Unedited copies (J >= 0.9 even with shuffled paragraphs) are all caught.
    exact_copies = planted.pairs[planted.pairs["rate"] == 0.0]
    caught = set(rejected["id"])
    assert all(a in caught or b in caught for a, b in zip(exact_copies["original"], exact_copies["copy"]))


@pytest.mark.slow
def test_fuzzy_output_is_the_same_with_one_and_two_workers(tmp_path, planted, dask_client, dask_client_1):
    docs = planted.documents.iloc[:150]
    src = write_parts(docs, tmp_path / "in", 5)
    run_dedup(src, tmp_path / "w1", DedupConfig(keep="longest"), client=dask_client_1, progress=False)
    run_dedup(src, tmp_path / "w2", DedupConfig(keep="longest"), client=dask_client, progress=False)
    k1, r1, m1 = read_stage(tmp_path / "w1")
    k2, r2, m2 = read_stage(tmp_path / "w2")
    assert m1["counts"] == m2["counts"] and m1["counts"]["rejected"]["near_duplicate"] > 0
    assert m1["timings"]["workers"] == 1 and m2["timings"]["workers"] == 2
    key = ["id", "kept_id", "cluster_id"]
    assert r1[key].sort_values("id").reset_index(drop=True).equals(r2[key].sort_values("id").reset_index(drop=True))
    # keep=longest: no rejected document is longer than the one kept for it.
    lengths = dict(zip(k1["id"], k1["text"].str.len()))
    assert all(len(t) <= lengths[k] for t, k in zip(r1["text"], r1["kept_id"]))


@pytest.mark.slow
def test_incremental_index_dedups_new_data_against_the_old_corpus(tmp_path, planted, dask_client):
    docs = planted.documents
    pairs = planted.pairs[planted.pairs["rate"] <= 0.01]
    copy_ids = set(pairs["copy"])
    old = docs[~docs["id"].isin(copy_ids)]
    new = pd.concat([docs[docs["id"].isin(copy_ids)], old.iloc[:0]])
    index = tmp_path / "index"
    run_dedup(
        write_parts(old, tmp_path / "old"),
        tmp_path / "old_out",
        DedupConfig(index=str(index), verify=True),
        client=dask_client,
        progress=False,
    )
    meta = json.loads((index / "index.json").read_text())
    kept_old, _, _ = read_stage(tmp_path / "old_out")
    assert meta["documents"] == len(kept_old) and meta["params"]["bands"] == 9 and meta["shingles"]
    run_dedup(
        write_parts(new, tmp_path / "new", 2),
        tmp_path / "new_out",
        DedupConfig(index=str(index), verify=True),
        client=dask_client,
        progress=False,
    )
    kept, rejected, manifest = read_stage(tmp_path / "new_out")
    check_accounting(manifest, kept, rejected, len(new))
    assert manifest["dedup"]["index_documents"] == len(kept_old)
    originals = dict(zip(pairs["copy"], pairs["original"]))
    # Copies whose original survived in the index are rejected in favour of an old document.
    high = set(pairs.loc[pairs["jaccard"] >= 0.9, "copy"])
    expected = {c for c, o in originals.items() if o in set(kept_old["id"]) and c in high}
    assert expected <= set(rejected["id"]) and len(expected) >= 15
    assert rejected["kept_id"].isin(kept_old["id"]).all()
    assert json.loads((index / "index.json").read_text())["documents"] == len(kept_old) + len(kept)
    # An index built with other parameters is refused.
    with pytest.raises(ConfigError, match="other parameters"):
        run_dedup(
            tmp_path / "new",
            tmp_path / "x",
            DedupConfig(index=str(index), verify=True, num_perm=64),
            client=dask_client,
            progress=False,
        )


@pytest.mark.slow
def test_finished_phases_are_not_redone_after_a_crash(tmp_path, planted, dask_client):
    src = write_parts(planted.documents.iloc[:120], tmp_path / "in")
    work = tmp_path / "work"
    config = DedupConfig(work_dir=str(work), keep_work=True)
    first = run_dedup(src, tmp_path / "out", config, client=dask_client, progress=False)
    # As if the run died during the decisions phase, after writing one signature file less.
    shutil.rmtree(work / "decisions")
    (work / "decisions.done").unlink()
    (work / "signatures.done").unlink()
    (work / "signatures" / "part-00001.parquet").unlink()
    second = run_dedup(src, tmp_path / "out", config, client=dask_client, progress=False)
    assert second["resumed_phases"] == ["candidates", "components"]
    assert json.loads((work / "signatures.done").read_text())["resumed"] == 2  # 2 of 3 files reused
    assert first["counts"] == second["counts"]
    # Another config does not reuse the checkpoints.
    third = run_dedup(
        src, tmp_path / "out", DedupConfig(work_dir=str(work), threshold=0.7), client=dask_client, progress=False
    )
    assert third["resumed_phases"] == []


@pytest.mark.slow
def test_cjk_near_duplicates_use_character_shingles(tmp_path, dask_client):
    base = (
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习并改进性能。深度学习使用多层神经网络来表示复杂的函数，"
        "在图像识别、语音识别和自然语言处理中取得了显著的成果。研究人员不断提出新的模型结构和训练方法。"
    )
    other = (
        "東京は日本の首都であり、世界有数の大都市です。多くの企業の本社が集まり、交通網も非常に発達しています。"
        "毎年多くの観光客が訪れ、伝統と現代が共存する街として知られています。"
    )
    docs = pd.DataFrame(
        {
            "id": ["zh", "zh-copy", "ja", "ja-copy", "en"],
            "text": [
                base,
                base.replace("显著", "很大"),
                other,
                other + "春には桜が咲きます。",
                "An English sentence " * 10,
            ],
            "source": "cjk",
        }
    )
    src = write_parts(docs, tmp_path / "in", 2)
    run_dedup(src, tmp_path / "out", DedupConfig(threshold=0.7, verify=True), client=dask_client, progress=False)
    kept, rejected, _ = read_stage(tmp_path / "out")
    assert dict(zip(rejected["id"], rejected["kept_id"])) == {"zh-copy": "zh", "ja-copy": "ja"}


def test_a_torch_minhash_device_with_the_legacy_scheme_is_one_line_before_any_work(tmp_path, capsys):
    # The torch path's signatures equal numba's (tests/curate/test_minhash.py), so its output
    # is numba's; legacy (mod 2**61-1) has no torch path.
    src = write_parts(
        pd.DataFrame({"id": ["a"], "text": ["one two three four five six"], "source": ["t"]}), tmp_path / "in", 1
    )
    code = tokenmill_main(
        ["curate", "dedup", "--input", str(src), "--output", str(tmp_path / "o"), "--minhash-device", "cpu"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "--minhash-device cpu: the legacy scheme" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.work").exists()


def test_cli_runs_dedup_and_reports_bad_input(tmp_path, planted, dask_client, capsys):
    src = write_parts(planted.documents.iloc[:80], tmp_path / "in", 2)
    address = dask_client.scheduler.address
    code = tokenmill_main(
        [
            "curate",
            "dedup",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out"),
            "--scheduler",
            address,
            "--no-progress",
            "--threshold",
            "0.8",
            "--scheme",
            "fast",
            "--verify",
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert any(line.startswith("dedup: in 80") for line in err.splitlines())
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]["scheme"] == "fast"
    assert (
        tokenmill_main(["curate", "dedup", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o2")]) == 1
    )
    assert "input not found" in capsys.readouterr().err
    assert (
        tokenmill_main(["curate", "dedup", "--input", str(src), "--output", str(tmp_path / "o3"), "--bands", "4"]) == 1
    )
    assert "--bands and --rows" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="normalize"):
        DedupConfig(normalize="lower,stem")


@pytest.mark.slow
def test_label_propagation_finds_components_of_long_chains(tmp_path, dask_client):
    from tokenmill.curate.dedup.components import connected_components
    from tokenmill.curate.dedup.work import parquet_files, write_parquet_atomic

    rng = np.random.default_rng(0)
    # A 300-node path in shuffled node order (worst case for plain propagation), a star, a
    # 2-cycle of index-style negative uids, and random small components.
    path = rng.permutation(300) + 1000
    edges = [(a, b) for a, b in zip(path[:-1], path[1:])]
    edges += [(5000, 5000 + k) for k in range(1, 40)]
    edges += [(-(1 << 62) + 7, 6000), (-(1 << 62) + 3, 6000)]
    edges += [(10_000 + 2 * k, 10_001 + 2 * k) for k in range(50)]
    frame = pd.DataFrame(edges, columns=["u", "v"])
    frame = pd.DataFrame({"u": frame.min(axis=1), "v": frame.max(axis=1)}).astype("int64")
    for i in range(3):
        write_parquet_atomic(frame.iloc[i::3], tmp_path / "edges" / f"part-{i}.parquet")
    result = connected_components(
        dask_client, parquet_files(tmp_path / "edges"), tmp_path / "cc", npartitions=3, progress=False
    )
    labels = pd.concat([pd.read_parquet(f) for f in parquet_files(tmp_path / "cc" / "final")]).set_index("node")[
        "label"
    ]
    assert result["components"] == 1 + 1 + 1 + 50 and result["nodes"] == 300 + 40 + 3 + 100
    assert (labels.loc[path] == path.min()).all()
    assert labels.loc[6000] == -(1 << 62) + 3
    assert result["iterations"] < 20  # pointer jumping: far fewer than the path length
    # A finished run is not redone.
    again = connected_components(
        dask_client, parquet_files(tmp_path / "edges"), tmp_path / "cc", npartitions=3, progress=False
    )
    assert again == result
    # Killed after the converged state was written but before the labels were published:
    # the rerun re-checks the last labels, which are still in place, and publishes them.
    (tmp_path / "cc" / "final").rename(tmp_path / "cc" / f"iter-{result['iterations']:03d}")
    resumed = connected_components(
        dask_client, parquet_files(tmp_path / "edges"), tmp_path / "cc", npartitions=3, progress=False
    )
    assert resumed["nodes"] == result["nodes"] and resumed["components"] == result["components"]
    relabelled = pd.concat([pd.read_parquet(f) for f in parquet_files(tmp_path / "cc" / "final")])
    assert relabelled.set_index("node")["label"].sort_index().equals(labels.sort_index())


@pytest.mark.parametrize("method", ["exact", "fuzzy"])
def test_an_empty_input_part_is_no_error(tmp_path, articles, dask_client, method):
    """A stage that rejects a whole batch publishes an empty kept part; dedup reads past it."""
    docs = articles[:6] + [articles[0]]
    write_documents(
        pd.DataFrame({"id": [f"d{i}" for i in range(len(docs))], "text": docs, "source": "w"}),
        tmp_path / "in" / "a.parquet",
    )
    write_documents(pd.DataFrame({"id": [], "text": [], "source": []}, dtype=str), tmp_path / "in" / "b.parquet")
    manifest = run_dedup(
        tmp_path / "in", tmp_path / "out", DedupConfig(method=method), client=dask_client, progress=False
    )
    assert manifest["counts"]["in"] == 7 and manifest["counts"]["kept"] == 6
