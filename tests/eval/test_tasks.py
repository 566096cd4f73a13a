"""Tasks read original-format files and render the harness's prompts, choices and golds."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tokenmill.errors import TokenmillError
from tokenmill.eval.evaluator import load_task_data
from tokenmill.eval.tasks import TASKS, MissingDataError, get_task, resolve_task_names


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def original_files(tmp_path: Path) -> Path:
    """One or two rows of every benchmark in its original public layout."""
    write_jsonl(
        tmp_path / "hellaswag_val.jsonl",
        [
            {
                "ind": 24,
                "activity_label": "Roof shingle removal",
                "ctx_a": "A man is sitting on a roof.",
                "ctx_b": "he",
                "endings": [
                    "is using wrap to wrap a pair of skis.",
                    "is ripping level tiles off.",
                    "is holding a rubik's cube.",
                    "starts pulling up roofing on a roof.",
                ],
                "label": 3,
                "split": "val",
                "split_type": "indomain",
                "source_id": "activitynet~v_-JhWjGDPHMY",
            },
            {
                "ind": 92,
                "activity_label": "Clean and jerk",
                "ctx_a": "A lady walks to a barbell. She bends down and grabs the pole.",
                "ctx_b": "the lady",
                "endings": [
                    "swings and lands in her arms.",
                    "pulls the barbell forward.",
                    "pulls a rope attached to the barbell.",
                    "stands and lifts the weight over her head. [title] Do it.",
                ],
                "label": 3,
                "split": "val",
                "split_type": "zeroshot",
                "source_id": "activitynet~v_-lJS58hyo1c",
            },
        ],
    )
    race_dir = tmp_path / "RACE" / "test" / "high"
    race_dir.mkdir(parents=True)
    (race_dir / "10.txt").write_text(
        json.dumps(
            {
                "answers": ["B", "C"],
                "options": [["a", "b", "c", "d"], ["e", "f", "g", "h"]],
                "questions": ["The writer thinks  _  .", "What is the best title?"],
                "article": "Second article.",
                "id": "high10.txt",
            }
        )
    )
    (race_dir / "2.txt").write_text(
        json.dumps(
            {
                "answers": ["A"],
                "options": [["w", "x", "y", "z"]],
                "questions": ["Why?"],
                "article": "First article.",
                "id": "high2.txt",
            }
        )
    )
    write_jsonl(
        tmp_path / "anli_v1.0" / "R2" / "test.jsonl",
        [
            {"uid": "u1", "premise": "A cat sat.", "hypothesis": "An animal sat.", "label": "e", "reason": ""},
            {"uid": "u2", "premise": "A cat sat.", "hypothesis": "A dog sat.", "label": "c", "reason": ""},
        ],
    )
    write_jsonl(
        tmp_path / "anli_v1.0" / "R2" / "train.jsonl",
        [
            {"uid": "t1", "premise": "It rained.", "hypothesis": "It was wet.", "label": "n", "reason": ""},
        ],
    )
    write_jsonl(
        tmp_path / "WiC" / "val.jsonl",
        [
            {
                "word": "place",
                "sentence1": "Do you want to come over to my place later?",
                "sentence2": "A political system with no place for the less prominent groups.",
                "idx": 0,
                "label": False,
                "start1": 31,
                "start2": 27,
                "end1": 36,
                "end2": 32,
                "version": 1.1,
            },
        ],
    )
    return tmp_path


def test_names_resolve_and_bad_names_list_valid_ones() -> None:
    assert resolve_task_names("piqa, lambada,anli") == ["piqa", "lambada_openai", "anli_r1", "anli_r2", "anli_r3"]
    with pytest.raises(TokenmillError) as info:
        resolve_task_names("piqa,hellaswagg")
    message = str(info.value)
    assert "hellaswagg" in message
    assert all(name in message for name in TASKS)


def test_missing_file_names_the_file_and_where(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError) as info:
        load_task_data(get_task("piqa"), tmp_path)
    assert str(tmp_path / "piqa_valid.jsonl") in str(info.value)
    assert "validation" in str(info.value)


def test_piqa_labels_from_lst(eval_dir: Path) -> None:
    task = get_task("piqa")
    data = load_task_data(task, eval_dir, limit=3)
    labels = (eval_dir / "piqa_valid-labels.lst").read_text().split()[:3]
    assert [task.gold(d) for d in data.docs] == [int(x) for x in labels]
    assert task.doc_to_text(data.docs[1]) == "Question: dresser\nAnswer:"
    assert task.doc_to_choice(data.docs[1]) == ["replace drawer with bobby pin ", "finish, woodgrain with  bobby pin "]


def test_piqa_label_count_mismatch_is_reported(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "piqa_valid.jsonl", [{"goal": "g", "sol1": "a", "sol2": "b"}] * 2)
    (tmp_path / "piqa_valid-labels.lst").write_text("0\n")
    with pytest.raises(TokenmillError, match="2 rows .* but 1 labels"):
        load_task_data(get_task("piqa"), tmp_path)


def test_boolq_winogrande_lambada_real_rows(eval_dir: Path) -> None:
    boolq = get_task("boolq")
    docs = load_task_data(boolq, eval_dir, limit=2).docs
    assert [boolq.gold(d) for d in docs] == [0, 1]  # answers false, true
    assert boolq.doc_to_text(docs[0]).endswith("\nQuestion: does ethanol take more energy make that produces?\nAnswer:")

    wino = get_task("winogrande")
    data = load_task_data(wino, eval_dir, limit=1, need_pool=True)
    doc = data.docs[0]
    assert wino.doc_to_choice(doc) == [
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    ]
    assert wino.doc_to_target(doc) == "always got the easier cases."
    assert wino.gold(doc) == 1
    assert data.pool_split == "train" and len(data.pool or []) == 160

    lam = get_task("lambada_openai")
    doc = load_task_data(lam, eval_dir, limit=1).docs[0]
    assert lam.doc_to_target(doc) == " signs"
    assert lam.doc_to_text(doc) + lam.doc_to_target(doc) == doc["text"]


def test_hellaswag_race_anli_wic_from_original_layouts(original_files: Path) -> None:
    hs = get_task("hellaswag")
    docs = load_task_data(hs, original_files).docs
    assert hs.doc_to_text(docs[0]) == "Roof shingle removal: A man is sitting on a roof. He"
    assert hs.doc_to_choice(docs[1])[3] == "stands and lifts the weight over her head.. Do it."
    assert hs.gold(docs[0]) == 3

    race = get_task("race")
    docs = load_task_data(race, original_files).docs
    assert [d["article"] for d in docs] == ["First article.", "Second article."]  # extracted: numeric file order
    assert race.doc_to_text(docs[1]) == "Article: Second article.\n\nThe writer thinks b\nWhat is the best title?"
    assert race.doc_to_choice(docs[1]) == ["e", "f", "g", "h"] and race.gold(docs[1]) == 2

    anli = get_task("anli_r2")
    data = load_task_data(anli, original_files, need_pool=True)
    assert anli.doc_to_text(data.docs[0]) == "A cat sat.\nQuestion: An animal sat. True, False, or Neither?\nAnswer:"
    assert [anli.gold(d) for d in data.docs] == [0, 2]
    assert data.eval_split == "test_r2" and data.pool_split == "train_r2"
    assert anli.fewshot_answer(data.pool[0]) == (anli.doc_to_text(data.pool[0]), "Neither")

    wic = get_task("wic")
    doc = load_task_data(wic, original_files).docs[0]
    assert "Is the word 'place' used in the same way" in wic.doc_to_text(doc)
    assert wic.gold(doc) == 0


def test_prompts_equal_harness_functions(original_files: Path, eval_dir: Path) -> None:
    """Where the harness defines a task in Python or Jinja, render the same doc with its code."""
    lm_eval = pytest.importorskip("lm_eval")
    import yaml
    from lm_eval.tasks.hellaswag import utils as hs_utils
    from lm_eval.tasks.race import preprocess_race
    from lm_eval.utils import apply_template

    hs = get_task("hellaswag")
    raw = [json.loads(line) for line in (original_files / "hellaswag_val.jsonl").read_text().splitlines()]
    for doc, ours in zip(raw, load_task_data(hs, original_files).docs):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        assert hs.doc_to_text(ours) == hs_utils.preprocess(doc["activity_label"] + ": " + ctx)
        assert hs.doc_to_choice(ours) == [hs_utils.preprocess(e) for e in doc["endings"]]

    race = get_task("race")
    for doc in load_task_data(race, original_files).docs:
        assert race.doc_to_text(doc) == preprocess_race.doc_to_text(doc)
        assert race.doc_to_choice(doc) == preprocess_race.doc_to_choice(doc)
        assert race.doc_to_target(doc) == preprocess_race.doc_to_target(doc)

    root = Path(lm_eval.__file__).parent / "tasks"
    cases = {
        "piqa": ("piqa/piqa.yaml", eval_dir),
        "boolq": ("super_glue/boolq/default.yaml", eval_dir),
        "wic": ("super_glue/wic/default.yaml", original_files),
        "anli_r2": ("anli/anli_r1.yaml", original_files),
    }
    for name, (yaml_rel, data_dir) in cases.items():
        config = yaml.safe_load((root / yaml_rel).read_text())
        task = get_task(name)
        for doc in load_task_data(task, data_dir, limit=3).docs:
            assert task.doc_to_text(doc) == apply_template(config["doc_to_text"], doc)


def _race_article(article: str, answers: list[str], ident: str) -> bytes:
    options = [[f"{article[:5]} {q}{c}" for c in "abcd"] for q in range(len(answers))]
    questions = [f"Question {q} about {article[:5]}?" for q in range(len(answers))]
    return json.dumps(
        {"answers": answers, "options": options, "questions": questions, "article": article, "id": ident}
    ).encode()


def test_race_archive_is_read_in_the_harness_order(tmp_path: Path, caplog) -> None:
    """RACE.tar.gz in archive order, articles grouped by text, other splits and levels left out."""
    import io
    import tarfile

    members = [  # (name, article text, answers), in the order the archive stores them
        ("RACE/train/high/1.txt", "Train article.", ["A"]),
        ("RACE/test/high/7.txt", "Seventh article.", ["B", "C"]),
        ("RACE/test/middle/3.txt", "Middle school article.", ["A"]),
        ("RACE/test/high/10.txt", "Tenth article.", ["D"]),
        ("RACE/test/high/2.txt", "Second article.", ["A", "A", "B"]),
        ("RACE/test/high/11.txt", "Seventh article.", ["D"]),  # same text as 7.txt: one document
    ]
    with tarfile.open(tmp_path / "RACE.tar.gz", "w:gz") as archive:
        for name, article, answers in members:
            data = _race_article(article, answers, name.rsplit("/", 1)[1])
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    race = get_task("race")
    docs = load_task_data(race, tmp_path).docs
    assert [d["article"] for d in docs] == ["Seventh article.", "Tenth article.", "Second article."]
    assert [len(ast.literal_eval(d["problems"])) for d in docs] == [3, 1, 3]
    assert [race.gold(d) for d in docs] == [3, 3, 1]
    assert race.doc_to_text(docs[0]) == (
        "Article: Seventh article.\n\nQuestion: Question 0 about Seven?\nAnswer: Seven 0b\n"
        "Question: Question 1 about Seven?\nAnswer: Seven 1c\nQuestion 0 about Seven?"
    )
    assert load_task_data(race, tmp_path, limit=2).docs == docs[:2]

    # Extracted, the same articles lose the archive order: numeric file order, with a warning.
    extracted = tmp_path / "extracted"
    with tarfile.open(tmp_path / "RACE.tar.gz") as archive:
        archive.extractall(extracted, filter="data")
    with caplog.at_level("WARNING"):
        docs_dir = load_task_data(race, extracted).docs
    assert [d["article"] for d in docs_dir] == ["Second article.", "Seventh article.", "Tenth article."]
    assert "not the harness's" in caplog.text
    assert sorted(map(repr, docs_dir)) == sorted(map(repr, docs))

    # The hub's per-question rows (ehovy/race's layout) saved in place of EleutherAI/race: same documents.
    rows = []
    for name, article, answers in members:
        if name.startswith("RACE/test/high/"):
            raw = json.loads(_race_article(article, answers, name.rsplit("/", 1)[1]))
            rows += [
                {"example_id": raw["id"], "article": article, "answer": a, "question": q, "options": o}
                for q, a, o in zip(raw["questions"], raw["answers"], raw["options"])
            ]
    hub = tmp_path / "hub" / "EleutherAI" / "race" / "high"
    write_jsonl(hub / "test.jsonl", rows)
    hub_docs = load_task_data(race, tmp_path / "hub").docs
    assert [(d["article"], d["problems"]) for d in hub_docs] == [(d["article"], d["problems"]) for d in docs]


def test_race_bad_answer_letter_names_the_member(tmp_path: Path) -> None:
    import io
    import tarfile

    data = _race_article("Article.", ["E"], "5.txt")
    with tarfile.open(tmp_path / "RACE.tar.gz", "w:gz") as archive:
        info = tarfile.TarInfo("RACE/test/high/5.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(TokenmillError, match=r"task race: .*RACE.tar.gz:RACE/test/high/5.txt: label 'E' is not 'A'"):
        load_task_data(get_task("race"), tmp_path)


# (task, its file in the data directory and the fixture that has it, a field its prompts read)
ROW_FIELDS = [
    ("piqa", "piqa_valid.jsonl", "eval_dir", "sol1"),
    ("winogrande", "winogrande_dev.jsonl", "eval_dir", "option1"),
    ("boolq", "boolq_dev.jsonl", "eval_dir", "passage"),
    ("lambada_openai", "lambada_openai_test.jsonl", "eval_dir", "text"),
    ("hellaswag", "hellaswag_val.jsonl", "original_files", "ctx_b"),
    ("anli_r2", "anli_v1.0/R2/test.jsonl", "original_files", "hypothesis"),
    ("wic", "WiC/val.jsonl", "original_files", "sentence2"),
]


@pytest.mark.parametrize(("name", "file", "source", "field"), ROW_FIELDS, ids=[row[0] for row in ROW_FIELDS])
def test_a_row_without_a_field_names_the_file_line_and_field(
    request: pytest.FixtureRequest, tmp_path: Path, capsys, name: str, file: str, source: str, field: str
) -> None:
    from tokenmill.cli import main

    source_dir: Path = request.getfixturevalue(source)
    data = tmp_path / "data"
    rows = [json.loads(line) for line in (source_dir / file).read_text().splitlines()[:2]]
    rows[-1].pop(field)
    path = write_jsonl(data / file, rows)
    labels = source_dir / "piqa_valid-labels.lst"
    if name == "piqa":
        (data / labels.name).write_text("".join(labels.read_text().splitlines(keepends=True)[:2]))
    # The data is read before the model is looked for: the error comes first.
    assert main(["eval", "--model", str(tmp_path / "no-model"), "--tasks", name, "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    line = f"tokenmill: error: task {name}: {path}:{len(rows)}: no field '{field}' (the row has "
    assert err.startswith(line) and err.count("\n") == 1, err


def test_a_race_hub_row_without_an_article_and_a_winogrande_row_without_a_blank_are_one_line(
    tmp_path: Path, capsys, eval_dir: Path
) -> None:
    from tokenmill.cli import main

    def error_of(data: Path, task: str) -> str:
        assert main(["eval", "--model", str(tmp_path / "no-model"), "--tasks", task, "--data-dir", str(data)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err

    # The hub's per-question rows (ehovy/race's layout): `datasets` gives the row lacking its
    # article the column anyway, as None.
    raw = json.loads(_race_article("An article.", ["A", "B"], "1.txt"))
    rows = [
        {"example_id": raw["id"], "article": raw["article"], "answer": a, "question": q, "options": o}
        for q, a, o in zip(raw["questions"], raw["answers"], raw["options"])
    ]
    del rows[1]["article"]
    hub = write_jsonl(tmp_path / "hub" / "EleutherAI" / "race" / "high" / "test.jsonl", rows)
    assert error_of(tmp_path / "hub", "race") == (
        f"tokenmill: error: task race: {hub} row 1: no field 'article' (the row has answer, example_id, options,"
        " question)\n"
    )

    wino = [json.loads(line) for line in (eval_dir / "winogrande_dev.jsonl").read_text().splitlines()[:2]]
    wino[-1]["sentence"] = wino[-1]["sentence"].replace("_", wino[-1]["option1"])
    path = write_jsonl(tmp_path / "wino" / "winogrande_dev.jsonl", wino)
    assert error_of(tmp_path / "wino", "winogrande") == (
        f"tokenmill: error: task winogrande: {path}:2: the sentence has no blank '_' for the options to fill\n"
    )
