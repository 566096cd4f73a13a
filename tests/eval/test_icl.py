"""ICL suites (DCLM's CORE) and bits per byte: equal to an independent reference of the protocol
(tests/eval/icl_ref.py) on a tiny random GPT-2, the command line, and bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from tests.eval.conftest import close_ll
from tests.eval.icl_ref import centered_mean, reference_task
from tokenmill.cli import main
from tokenmill.eval.suites import load_suite, load_suite_data, score_suite

# One task of every type, zero- and few-shot, with the CORE settings (a schema task few-shot too,
# and a 10-shot multiple-choice task whose prompts are cut to the model's 256 tokens).
REFERENCE_SUITE = {
    "name": "mini",
    "aggregate": "MINI",
    "tasks": [
        {"label": "arc_easy", "file": "world_knowledge/arc_easy.jsonl", "icl_task_type": "multiple_choice",
         "num_fewshot": 10, "continuation_delimiter": "\nAnswer: ", "random_baseline": 25},
        {"label": "copa", "file": "commonsense_reasoning/copa.jsonl", "icl_task_type": "multiple_choice",
         "num_fewshot": 0, "random_baseline": 50},
        {"label": "winograd", "file": "language_understanding/winograd_wsc.jsonl", "icl_task_type": "schema",
         "num_fewshot": 0, "random_baseline": 50},
        {"label": "winogrande_3shot", "file": "language_understanding/winogrande.jsonl", "icl_task_type": "schema",
         "num_fewshot": 3, "random_baseline": 50},
        {"label": "jeopardy", "file": "world_knowledge/jeopardy_all.jsonl", "icl_task_type": "language_modeling",
         "num_fewshot": 10, "continuation_delimiter": "\nAnswer: ", "random_baseline": 0},
        {"label": "bigbench_operators", "file": "symbolic_problem_solving/bigbench_operators.jsonl",
         "icl_task_type": "language_modeling", "num_fewshot": 3, "random_baseline": 0},
    ],
}  # fmt: skip
LIMIT = 6


@pytest.fixture(scope="module")
def icl_dir(shared_data: Path) -> Path:
    return shared_data / "eval" / "icl"


def write_suite(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def test_suite_equals_the_reference_protocol(tiny_model, tiny_model_dir: Path, icl_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    suite = load_suite(write_suite(tmp_path / "mini.yaml", REFERENCE_SUITE))
    result = score_suite(tiny_model, load_suite_data(suite, icl_dir), limit=LIMIT, batch_size=4, progress=False)
    hf_model = GPT2LMHeadModel.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    accuracies, baselines = {}, {}
    truncated = 0
    for spec, got in zip(REFERENCE_SUITE["tasks"], result.tasks, strict=True):
        ref = reference_task(hf_model, tokenizer, spec, icl_dir / spec["file"], LIMIT, tiny_model.max_length)
        for prompt, (texts, conts, ctx_ids, cont_ids) in zip(got.prompts, ref["prompts"], strict=True):
            assert (prompt.contexts, prompt.continuations) == (texts, conts), spec["label"]
            assert (prompt.context_tokens, prompt.continuation_tokens) == (ctx_ids, cont_ids), spec["label"]
            truncated += any(len(c) + len(a) == tiny_model.max_length for c, a in zip(ctx_ids, cont_ids))
        assert got.correct == ref["correct"], spec["label"]
        accuracies[spec["label"]] = sum(ref["correct"]) / LIMIT
        baselines[spec["label"]] = spec["random_baseline"]
        assert got.accuracy == accuracies[spec["label"]]
    assert truncated > 0  # some 10-shot prompts were cut to the model's length
    assert result.complete and result.aggregate_label == "MINI"
    assert result.aggregate_value == pytest.approx(centered_mean(accuracies, baselines), abs=1e-12)


def test_core_suite_bundles_dclm_settings(shared_data: Path) -> None:
    import csv

    core = load_suite("core")
    icl = shared_data / "eval" / "icl"
    wanted = json.loads((icl / "additional_aggregation.json").read_text())["low_variance_datasets"]
    assert [t.label for t in core.tasks] == wanted and core.aggregate == "CORE"
    baselines = {
        r["Eval Task"]: float(r["Random baseline"]) for r in csv.DictReader((icl / "eval_meta_data.csv").open())
    }
    heavy = {t["label"]: t for t in yaml.safe_load((icl / "heavy.yaml").read_text())["icl_tasks"]}
    for task in core.tasks:
        spec = heavy[task.label]
        assert task.random_baseline == baselines[task.label]
        assert (task.task_type, [task.num_fewshot]) == (spec["icl_task_type"], spec["num_fewshot"])
        assert task.continuation_delimiter == spec.get("continuation_delimiter", " ")
        assert "local_data/" + task.file == spec["dataset_uri"]


def test_core_with_files_missing_runs_what_it_has(tiny_model_dir: Path, icl_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "core.json"
    argv = ["eval", "--model", str(tiny_model_dir), "--suite", "core", "--data-dir", str(icl_dir)]
    assert main([*argv, "--limit", "1", "--batch-size", "8", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    missing = ["hellaswag_zeroshot", "hellaswag", "squad", "coqa"]
    warnings = [line for line in captured.err.splitlines() if "not found" in line]
    assert len(warnings) == 4 and all(line.startswith("tokenmill: WARNING: suite core: task ") for line in warnings)
    assert str(icl_dir / "reading_comprehension" / "squad.jsonl") in captured.err
    rows = json.loads(out.read_text())["results"]
    aggregate = rows[-1]
    assert aggregate["task"] == "CORE (18/22)" and aggregate["complete"] is False
    assert aggregate["missing_tasks"] == missing and len(aggregate["tasks"]) == 18
    centered = [r["value"] for r in rows if r["metric"] == "centered_acc" and r["n"] == 1]
    assert len(centered) == 18 and aggregate["value"] == pytest.approx(sum(centered) / 18)
    table = out.with_suffix(".md").read_text()
    assert "| CORE (18/22) | - | - | centered_acc |" in table
    assert "CORE over 18 of 22 tasks" in table and "hellaswag_zeroshot, hellaswag, squad, coqa did not run" in table
    assert "| CORE |" not in table and table in captured.out


def bad_input_error(argv: list[str], capsys) -> str:
    assert main(argv) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenmill: error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"query": "q", "choices": ["a", "b"], "gold": 1}', "{not json"], "task.jsonl:2: not a JSON line"),
        (['{"query": "q", "choices": ["a", "b"], "gold": 2}'], "task.jsonl:1: gold 2 is not an index of its 2 choices"),
        (['{"query": "q", "choices": ["a", "b"]}'], "task.jsonl:1: no field gold"),
    ],
)
def test_bad_task_file_is_one_line(tiny_model_dir: Path, tmp_path: Path, capsys, lines, expected) -> None:
    (tmp_path / "task.jsonl").write_text("\n".join(lines) + "\n")
    suite = write_suite(
        tmp_path / "s.yaml", {"tasks": [{"label": "t", "file": "task.jsonl", "icl_task_type": "multiple_choice"}]}
    )
    argv = ["eval", "--model", str(tiny_model_dir), "--suite", str(suite), "--data-dir", str(tmp_path)]
    assert expected in bad_input_error(argv, capsys)


def test_bad_suite_is_one_line(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    argv = ["eval", "--model", str(tiny_model_dir), "--data-dir", str(tmp_path), "--suite"]
    suite = write_suite(tmp_path / "s.yaml", {"tasks": [{"label": "t", "file": "t.jsonl", "icl_task_type": "mc"}]})
    assert "task t: unknown icl_task_type 'mc'; one of: multiple_choice, schema" in bad_input_error(
        [*argv, str(suite)], capsys
    )
    suite = write_suite(tmp_path / "s.yaml", {"tasks": [{"label": "t", "file": "t.jsonl", "icl_task_type": "schema"}]})
    assert f"suite s: none of its 1 task files is under {tmp_path}" in bad_input_error([*argv, str(suite)], capsys)
    assert "'nope' is neither a bundled suite (core) nor a file" in bad_input_error([*argv, "nope"], capsys)
    assert "nothing to evaluate" in bad_input_error(["eval", "--model", str(tiny_model_dir)], capsys)


def direct_log_likelihood(model, ids: list[int], prefix: int, window: int) -> float:
    """log P(ids) read in consecutive windows of `window` predictions, each window reading the
    `window` tokens before its last prediction (the first reads the prefix token first)."""
    import torch

    full = [prefix, *ids]
    total = 0.0
    for start in range(0, len(ids), window):
        end = min(start + window, len(ids))
        offset = max(0, end - window)
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([full[offset:end]])).logits[0].double(), dim=-1)
        total += sum(float(logprobs[j - offset, full[j + 1]]) for j in range(start, end))
    return total


def test_bits_per_byte_equals_a_direct_computation(
    tiny_model_dir: Path, shared_data: Path, tmp_path: Path, capsys
) -> None:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from tokenmill.eval.bpb import bits_per_byte
    from tokenmill.eval.models import load_model

    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text(encoding="utf-8")
    documents = [text[:3000], text[5000:5200], "naïve café – ünïcödé"]
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    hf_model = GPT2LMHeadModel.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    n_bytes = sum(len(d.encode("utf-8")) for d in documents)
    for window in (32, 256):
        ids = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in documents]
        assert window == 256 or max(len(i) for i in ids) > 3 * window  # several windows, a partial last one
        ll = sum(direct_log_likelihood(hf_model, i, tokenizer.eos_token_id, window) for i in ids)
        got = bits_per_byte(load_model(tiny_model_dir, max_length=window), documents, batch_size=3, progress=False)
        assert got["bits_per_byte"] == close_ll(-ll / n_bytes / math.log(2))
        assert got["word_perplexity"] == pytest.approx(
            math.exp(-ll / sum(len(re.split(r"\s+", d)) for d in documents)), rel=1e-5
        )
    out = tmp_path / "bpb.json"
    assert main(["eval", "--model", str(tiny_model_dir), "--bpb", str(held_out), "--output", str(out)]) == 0
    rows = {r["metric"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["bits_per_byte"]["value"] == close_ll(-ll / n_bytes / math.log(2))
    assert rows["bits_per_byte"]["n"] == 3 and rows["bits_per_byte"]["bytes"] == n_bytes
    assert "| bpb:held_out.jsonl | 0 | 3 | bits_per_byte |" in capsys.readouterr().out
    held_out.write_text('{"text": "a"}\n{"txt": "b"}\n', encoding="utf-8")
    error = bad_input_error(["eval", "--model", str(tiny_model_dir), "--bpb", str(held_out)], capsys)
    assert f"{held_out}:2: no string field `text`" in error
