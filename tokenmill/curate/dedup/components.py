"""Connected components of the duplicate graph by iterative min-label propagation over Dask
dataframes, with pointer jumping.

Each node starts with the smallest id among itself and its neighbours; an iteration
(1) propagates labels along every edge (a shuffle-join of edges with labels, then a group-by
min) and (2) jumps pointers (label <- label of label), which halves path lengths so the number
of iterations grows with the log of a component's diameter rather than the diameter. The
edges and labels stay partitioned across workers throughout; only the count of labels that
changed reaches the client. Every iteration's labels are written to Parquet, so a crash resumes
from the last finished iteration and memory does not accumulate task graphs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from tokenmill.curate.dedup.work import parquet_files, write_partitions
from tokenmill.errors import TokenmillError

MAX_ITERATIONS = 64


def _min_label(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.groupby("node", sort=False)["label"].min().reset_index()


def connected_components(client, edge_files: list[str], directory: Path, *, npartitions: int, progress: bool = True) -> dict:
    """Write (node, label) for every node of the edge list under `directory/final/`; the label
    of a component is its smallest node. Returns {"iterations", "nodes", "components"}."""
    import dask.dataframe as dd
    from tqdm.auto import tqdm

    final = directory / "final"
    state_file = directory / "state.json"
    if not edge_files:
        final.mkdir(parents=True, exist_ok=True)
        return {"iterations": 0, "nodes": 0, "components": 0}
    edges = dd.read_parquet(edge_files, columns=["u", "v"])
    # Resume from the last finished iteration, if any.
    state = json.loads(state_file.read_text()) if state_file.exists() else {"iteration": -1}
    iteration = state["iteration"]
    if iteration < 0:
        # Initial labels: min over the node and its neighbours (edges have u < v).
        both = dd.concat([
            edges.rename(columns={"v": "node", "u": "label"})[["node", "label"]],
            edges.assign(label=edges["u"]).rename(columns={"u": "node"})[["node", "label"]],
        ])
        labels = both.shuffle(on="node", npartitions=npartitions).map_partitions(_min_label)
        iteration = 0
        out = directory / f"iter-{iteration:03d}"
        write_partitions(client, labels, out, "dedup components init", progress=False)
        state_file.write_text(json.dumps({"iteration": iteration}))
    bar = tqdm(desc="dedup components", unit="iter", disable=not progress)
    changed = None
    while True:
        current = dd.read_parquet(parquet_files(directory / f"iter-{iteration:03d}"), columns=["node", "label"])
        # (1) propagate along edges in both directions.
        to_v = edges.merge(current, left_on="u", right_on="node", how="inner", npartitions=npartitions)[["v", "label"]]
        to_u = edges.merge(current, left_on="v", right_on="node", how="inner", npartitions=npartitions)[["u", "label"]]
        candidates = dd.concat([
            current[["node", "label"]],
            to_v.rename(columns={"v": "node"}),
            to_u.rename(columns={"u": "node"}),
        ])
        propagated = candidates.shuffle(on="node", npartitions=npartitions).map_partitions(_min_label)
        # (2) pointer jumping: label <- min(label, label of label).
        parents = propagated.rename(columns={"node": "label", "label": "grand"})
        jumped = propagated.merge(parents, on="label", how="left", npartitions=npartitions)
        jumped = jumped.assign(label=jumped["label"].where(jumped["grand"].isna() | (jumped["label"] <= jumped["grand"]), jumped["grand"]).astype("int64"))[["node", "label"]]
        out = directory / f"iter-{iteration + 1:03d}"
        if out.exists():
            shutil.rmtree(out)
        write_partitions(client, jumped, out, f"dedup components iteration {iteration + 1}", progress=False)
        new = dd.read_parquet(parquet_files(out), columns=["node", "label"])
        diff = new.merge(current, on="node", suffixes=("", "_old"), npartitions=npartitions)
        changed = int(client.compute((diff["label"] != diff["label_old"]).sum()).result())
        shutil.rmtree(directory / f"iter-{iteration:03d}", ignore_errors=True)
        iteration += 1
        state_file.write_text(json.dumps({"iteration": iteration}))
        bar.update(1)
        bar.set_postfix(changed=changed)
        if changed == 0:
            break
        if iteration >= MAX_ITERATIONS:
            raise TokenmillError(f"connected components did not converge in {MAX_ITERATIONS} iterations")
    bar.close()
    last = directory / f"iter-{iteration:03d}"
    if final.exists():
        shutil.rmtree(final)
    last.rename(final)
    result = dd.read_parquet(parquet_files(final), columns=["node", "label"])
    nodes = int(client.compute(result["node"].count()).result())
    components = int(client.compute((result["node"] == result["label"]).sum()).result())
    return {"iterations": iteration, "nodes": nodes, "components": components}
