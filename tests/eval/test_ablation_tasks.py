"""ARC, OpenBookQA, Social IQa, COPA, CommonsenseQA and WSC273 read their Hugging Face schemas
and render the prompts of lm-evaluation-harness 0.4.13's own templates and functions."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from tokenmill.cli import main
from tokenmill.errors import TokenmillError
from tokenmill.eval.evaluator import load_task_data
from tokenmill.eval.tasks import get_task, resolve_task_names

from .harness_ref import HARNESS_YAMLS, harness_yaml
from .hub_exports import EXPORTS, write_hub_exports

ROWS = 8


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    out = tmp_path_factory.mktemp("exports")
    write_hub_exports(shared_data / "eval" / "icl", out, ROWS)
    return out


def harness_field(template: Any, doc: dict[str, Any]) -> Any:
    """A YAML doc_to_* field applied as the harness's ConfigurableTask applies it."""
    from lm_eval.utils import apply_template

    if not isinstance(template, str):
        return template
    if template in doc:
        return doc[template]
    text = apply_template(template, doc)
    if text.isdigit():
        return ast.literal_eval(text)
    return ast.literal_eval(text) if text.startswith("[") and text.endswith("]") else text


def harness_docs(name: str, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The harness's YAML config of a task and its documents (after its process_docs)."""
    import lm_eval

    config = harness_yaml(Path(lm_eval.__file__).parent / "tasks" / HARNESS_YAMLS[name])
    if name == "wsc273":
        import datasets
        from lm_eval.tasks.wsc273 import utils

        rows = utils.process_doc(datasets.Dataset.from_list(rows)).to_list()
    return config, rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", [n for n in EXPORTS if n != "copa"])
def test_prompts_equal_the_harness_templates(name: str, exports: Path) -> None:
    """Text, choices, target and gold of every exported row, ours against the YAML's templates."""
    pytest.importorskip("lm_eval")
    task = get_task(name)
    data = load_task_data(task, exports, need_pool=True)
    split = task.harness_splits[task.eval_role]
    config, theirs = harness_docs(name, read_rows(exports / f"{name}_{split}.jsonl"))
    assert len(data.docs) == len(theirs) == ROWS
    for ours, doc in zip(data.docs, theirs, strict=True):
        assert task.doc_to_text(ours) == harness_field(config["doc_to_text"], doc)
        assert task.doc_to_choice(ours) == harness_field(config["doc_to_choice"], doc)
        assert task.doc_to_target(ours) == harness_field(config["doc_to_target"], doc)
    assert task.target_delimiter == config.get("target_delimiter", " ")
    assert [m["metric"] for m in config["metric_list"]] == list(task.metrics)
    assert task.eval_role == ("test" if config.get("test_split") else "validation")


def test_copa_and_wsc273_equal_the_harness_functions() -> None:
    """COPA's utils.py on causes and effects; WSC273's option normalisation on possessive
    pronouns, a pronoun starting a sentence and a double space."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks.super_glue.copa import utils as copa_utils

    copa = get_task("copa")
    for question in ("cause", "effect"):
        for label in (0, 1):
            row = {
                "premise": "My body cast a shadow over the grass. ",
                "choice1": "The sun was rising.",
                "choice2": "The grass was cut.",
                "question": question,
                "idx": 0,
                "label": label,
            }
            doc = copa.to_docs([("row", row)])[0]
            assert copa.doc_to_text(doc) == copa_utils.doc_to_text(row)
            assert copa.doc_to_choice(doc) == copa_utils.doc_to_choice(row)
            assert copa.doc_to_target(doc) == copa_utils.doc_to_target(row)
            assert copa.gold(doc) == label

    rows = [
        {
            "text": "The man couldn't lift his son because he was so weak.",
            "pronoun": "he",
            "pronoun_loc": 41,
            "options": ["The man", "The son"],
        },
        {
            "text": "The host thanked the guest for all she had given. Her help was great.",
            "pronoun": "Her",
            "pronoun_loc": 50,
            "options": ["The host", "The guest"],
        },
        {
            "text": "Sam tried to paint a picture of golfers, but  they ended up looking more like his dogs.",
            "pronoun": "his",
            "pronoun_loc": 78,
            "options": ["The golfers", "Sam"],
        },
    ]
    rows = [{**row, "quote": "", "quote_loc": 0, "label": 1, "source": ""} for row in rows]
    wsc = get_task("wsc273")
    config, theirs = harness_docs("wsc273", rows)
    for ours, doc in zip(wsc.to_docs([("row", dict(row)) for row in rows]), theirs, strict=True):
        assert ours["options"] == doc["options"]
        assert wsc.doc_to_choice(ours) == harness_field(config["doc_to_choice"], doc)
        assert wsc.doc_to_target(ours) == harness_field(config["doc_to_target"], doc)
    assert [doc["options"] for doc in theirs] == [
        ["the man", "the son"],
        ["The host's", "The guest's"],
        ["the golfers's", "Sam's"],
    ]


def test_harness_names_resolve() -> None:
    assert resolve_task_names("arc,siqa,copa") == ["arc_easy", "arc_challenge", "social_iqa", "copa"]


# A field each task needs, and a row of its file without it ("choices.text": inside `choices`).
MISSING = [
    ("arc_easy", "question"),
    ("arc_challenge", "choices.text"),
    ("openbookqa", "question_stem"),
    ("openbookqa", "answerKey"),
    ("social_iqa", "answerC"),
    ("copa", "premise"),
    ("commonsense_qa", "choices.label"),
    ("wsc273", "pronoun_loc"),
]


def drop(row: dict[str, Any], path: str) -> dict[str, Any]:
    row = json.loads(json.dumps(row))
    *parents, last = path.split(".")
    inner = row
    for key in parents:
        inner = inner[key]
    del inner[last]
    return row


@pytest.mark.parametrize(("name", "field"), MISSING)
def test_a_row_missing_a_field_names_file_line_and_field(name: str, field: str, exports: Path, tmp_path: Path) -> None:
    task = get_task(name)
    split = task.harness_splits[task.eval_role]
    rows = read_rows(exports / f"{name}_{split}.jsonl")[:3]
    rows[1] = drop(rows[1], field)
    path = tmp_path / f"{name}_{split}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.raises(TokenmillError) as info:
        load_task_data(task, tmp_path)
    assert str(info.value) == f"task {name}: {path}:2: no field {field!r} (the row has {', '.join(sorted(rows[1]))})"


def test_bad_rows_are_one_line_from_the_command_before_the_model_loads(exports: Path, tmp_path: Path, capsys) -> None:
    """The model directory does not exist: the row's error comes first, as one line."""
    rows = read_rows(exports / "copa_validation.jsonl")[:2]
    path = tmp_path / "copa_validation.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "question": "reason"}) + "\n")
    code = main(["eval", "--model", str(tmp_path / "no-model"), "--tasks", "copa", "--data-dir", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert err == f"tokenmill: error: task copa: {path}:2: question 'reason' is not 'cause' or 'effect'\n"

    path = tmp_path / "commonsense_qa_validation.jsonl"
    row = read_rows(exports / "commonsense_qa_validation.jsonl")[0]
    path.write_text(json.dumps({**row, "answerKey": "F"}) + "\n")
    assert (
        main(["eval", "--model", str(tmp_path / "no-model"), "--tasks", "commonsense_qa", "--data-dir", str(tmp_path)])
        == 1
    )
    err = capsys.readouterr().err
    assert err == f"tokenmill: error: task commonsense_qa: {path}:1: label 'F' is not 'A', 'B', 'C', 'D', 'E'\n"


def test_arc_answer_keys_as_letters_digits_or_numbers() -> None:
    """ARC labels are "A"-"E" or "1"-"5"; a file written by other tools may store them as numbers."""
    arc = get_task("arc_challenge")
    choices = ["ice", "steam", "water", "fog"]
    rows = [
        {"id": "a", "question": "q", "choices": {"text": choices, "label": list("ABCD")}, "answerKey": "C"},
        {"id": "b", "question": "q", "choices": {"text": choices, "label": list("1234")}, "answerKey": "2"},
        {"id": "c", "question": "q", "choices": {"text": choices, "label": [1, 2, 3, 4]}, "answerKey": 4},
    ]
    assert [arc.gold(doc) for doc in arc.to_docs([("row", row) for row in rows])] == [2, 1, 3]


def test_eval_command_runs_the_ablation_tasks(exports: Path, tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    """`tokenmill eval --tasks arc,...` on the exported files: a row per task, shot count and metric."""
    out = tmp_path / "results.json"
    names = "arc,openbookqa,siqa,copa,commonsense_qa,wsc273"
    argv = ["eval", "--model", str(tiny_model_dir), "--tasks", names, "--shots", "0,1", "--limit", "4"]
    assert main([*argv, "--data-dir", str(exports), "--output", str(out), "--threads", "1"]) == 0
    rows = json.loads(out.read_text())["results"]
    got = {(row["task"], row["shots"], row["metric"]) for row in rows}
    expected = {
        (task, shots, metric)
        for task in resolve_task_names(names)
        for shots in (0, 1)
        for metric in get_task(task).metrics
    }
    assert got == expected
    assert all(row["n"] == 4 and 0 <= row["value"] <= 1 for row in rows)
    assert {row["fewshot_split"] for row in rows if row["task"] == "wsc273" and row["shots"] == 1} == {"test"}
    assert "| arc_challenge | 1 | 4 | acc_norm |" in capsys.readouterr().out
