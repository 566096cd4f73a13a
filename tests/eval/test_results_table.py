"""One results table for `tokenmill eval`, a recipe's eval step and the run report."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tokenmill.eval.results import markdown_table
from tokenmill.pipelines.evaluate import heldout_perplexity
from tokenmill.pipelines.report import Section, _evaluation


def test_heldout_and_task_rows_share_one_table(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "\n".join(json.dumps(m) for m in ({"step": 4, "loss": 3.1}, {"step": 8, "loss": 2.9, "val_loss": 2.5})) + "\n"
    )
    heldout = heldout_perplexity(run)
    assert heldout is not None and heldout["value"] == math.exp(2.5)
    piqa = {"task": "piqa", "shots": 1, "n": 40, "metric": "acc", "value": 0.575, "stderr": 0.0791}
    table = markdown_table([heldout, piqa])
    assert table.splitlines() == [
        "| task | shots | n | metric | value | ± stderr |",
        "|---|---:|---:|---|---:|---:|",
        "| heldout | 0 | - | perplexity | 12.18 | - |",
        "| piqa | 1 | 40 | acc | 0.5750 | 0.0791 |",
    ]
    # the run report renders the same cells in Markdown and HTML
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.json").write_text(json.dumps({"results": [heldout, piqa], "skipped": []}))
    section = Section("evaluation", "Evaluation")
    _evaluation(tmp_path, section)
    assert section.md[0].splitlines()[0] == table.splitlines()[0]
    assert section.md[0].splitlines()[2:] == table.splitlines()[2:]
    assert "<td>heldout</td><td>0</td><td>-</td><td>perplexity</td><td>12.18</td><td>-</td>" in section.html[0]
