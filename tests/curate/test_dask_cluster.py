"""Every curation stage and `encode` on a real Dask cluster of separate processes (`dask
scheduler` + two `dask worker`s from the command line) give what the LocalCluster run gives.
The LocalCluster side is the test session's 2-worker LocalCluster, the one `--workers 2` starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dask_processes import assert_same_stage, cluster, tokenmill, write_web_like_corpus

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module")
def dask_processes(tmp_path_factory):
    processes = cluster(tmp_path_factory.mktemp("dask"), workers=2)
    yield processes
    processes.close()


def test_every_stage_and_encode_on_a_dask_cluster_equal_the_local_cluster(
    tmp_path, shared_data, dask_processes, dask_client
):
    local_cluster = dask_client.scheduler.address
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
        tokenmill(
            "curate", stage, "--input", str(source), "--output", str(local), "--scheduler", local_cluster, *options
        )
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
    tokenmill("tokenize", "encode", *common, "--output-prefix", str(local), "--scheduler", local_cluster)
    tokenmill("tokenize", "encode", *common, "--output-prefix", str(remote), "--scheduler", dask_processes.address)
    for suffix in (".bin", ".idx"):
        assert Path(f"{remote}{suffix}").read_bytes() == Path(f"{local}{suffix}").read_bytes()
    meta = json.loads(Path(f"{remote}.json").read_text())
    assert meta["partitions"]["total"] >= 2 and meta["documents"] > 0


def test_an_expression_singleton_dying_between_lookups_is_rebuilt_not_a_key_error() -> None:
    """Dask's expression singletons, as tokenmill's clients leave them: an instance that dies
    between the lookup's two steps (another thread's garbage collection, as when a
    LocalCluster's scheduler rebuilds the graph its own process submitted) is made again."""
    import gc
    import weakref

    from dask._expr import SingletonExpr

    from tokenmill.infra.cluster import guard_expression_singletons

    guard_expression_singletons()

    class Leaf(SingletonExpr):
        _parameters = ["value"]

    def leaf(value: int) -> Leaf:  # named by a token of our own: a test's class has no stable one
        return Leaf(value, _determ_token=f"value-{value}")

    first = leaf(1)
    assert leaf(1) is first and leaf(2) is not first  # still one instance per expression
    holder = [first]
    del first

    class DyingOnLookup(weakref.WeakValueDictionary):
        """Whatever `in` found dies right after: the other thread's collection."""

        def __contains__(self, key: object) -> bool:
            found = super().__contains__(key)
            holder.clear()
            gc.collect()
            return found

    Leaf._instances = DyingOnLookup(Leaf._instances)
    again = leaf(1)
    assert again.operands == [1] and leaf(1) is again
