"""Tasks load the harness's own Hugging Face datasets: ids, configs and splits as its YAMLs name them,
from the hub through `datasets` or from a data directory holding them in the hub's layout.

No test here reaches the network: the hub-layout directories are built from the shared files, and
the hub call itself is checked against a stand-in for `datasets.load_dataset`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenmill.eval.evaluator import evaluate, evaluate_task, load_task_data
from tokenmill.eval.tasks import TASKS, MissingDataError, get_task

from .conftest import run_tokenmill
from .harness_ref import HARNESS_YAMLS, harness_yaml


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_dataset_ids_configs_and_splits_are_the_harness_yamls() -> None:
    lm_eval = pytest.importorskip("lm_eval")
    root = Path(lm_eval.__file__).parent / "tasks"
    assert set(HARNESS_YAMLS) == set(TASKS)
    for name, rel in HARNESS_YAMLS.items():
        config = harness_yaml(root / rel)
        task = get_task(name)
        assert task.hf_dataset == (config["dataset_path"], config.get("dataset_name")), name
        splits = {
            "train": config.get("training_split"),
            "validation": config.get("validation_split"),
            "test": config.get("test_split"),
        }
        assert task.harness_splits == splits, name


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """The shared benchmark files in the hub datasets' schemas and layouts, three storage forms."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = shared_data / "eval"
    out = tmp_path_factory.mktemp("hub")
    # baber/piqa: a DatasetDict written by save_to_disk; labels live in the rows.
    labels = (src / "piqa_valid-labels.lst").read_text().split()
    piqa = [
        {"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": int(label)}
        for d, label in zip(read_jsonl(src / "piqa_valid.jsonl"), labels, strict=True)
    ]
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(piqa)}).save_to_disk(str(out / "baber" / "piqa"))
    # aps/super_glue, config boolq: the hub repository's parquet file; `label` 0/1 instead of `answer`.
    boolq = [
        {"question": d["question"], "passage": d["passage"], "idx": i, "label": int(d["answer"])}
        for i, d in enumerate(read_jsonl(src / "boolq_dev.jsonl"))
    ]
    (out / "aps" / "super_glue" / "boolq").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(boolq), out / "aps/super_glue/boolq/validation-00000-of-00001.parquet")
    # allenai/winogrande, config winogrande_xl: JSON lines per split (train from the xs file here).
    wino = out / "allenai" / "winogrande" / "winogrande_xl"
    wino.mkdir(parents=True)
    for split, name in (("train", "winogrande_train_xs.jsonl"), ("validation", "winogrande_dev.jsonl")):
        rows = [{k: d[k] for k in ("sentence", "option1", "option2", "answer")} for d in read_jsonl(src / name)]
        (wino / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # EleutherAI/lambada_openai, config default: the hub's parquet export layout (<config>/<split>/).
    lam = out / "EleutherAI" / "lambada_openai" / "default" / "test"
    lam.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(read_jsonl(src / "lambada_openai_test.jsonl")), lam / "0000.parquet")
    return out


def test_hub_layout_gives_the_native_documents_and_scores(tiny_model, eval_dir: Path, hub_dir: Path) -> None:
    for name in ("piqa", "boolq", "winogrande", "lambada_openai"):
        task = get_task(name)
        for shots in (0, 2):
            native = load_task_data(task, eval_dir, limit=12, need_pool=shots > 0)
            hub = load_task_data(task, hub_dir, limit=12, need_pool=shots > 0)
            assert hub.files[0].startswith(str(hub_dir / task.hf_dataset[0])), hub.files
            assert (hub.eval_split, hub.pool_split) == (native.eval_split, native.pool_split)
            assert len(hub.pool or []) == len(native.pool or [])
            a = evaluate_task(tiny_model, task, shots, native, batch_size=8, progress=False, bootstrap_iters=500)
            b = evaluate_task(tiny_model, task, shots, hub, batch_size=8, progress=False, bootstrap_iters=500)
            assert [s.requests for s in a.samples] == [s.requests for s in b.samples], (name, shots)
            assert [s.loglikelihoods for s in a.samples] == [s.loglikelihoods for s in b.samples]
            assert [s.scores for s in a.samples] == [s.scores for s in b.samples]
            strip = ("data_hash", "data_files", "seconds")
            assert [{k: v for k, v in r.items() if k not in strip} for r in a.rows] == [
                {k: v for k, v in r.items() if k not in strip} for r in b.rows
            ]


def test_hub_layout_from_the_command(tiny_model_dir: Path, eval_dir: Path, hub_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hub.json"
    done = run_tokenmill(
        "eval",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        "boolq,piqa",
        "--data-dir",
        str(hub_dir),
        "--limit",
        "10",
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["results"]
    assert rows[0]["data_files"] == [str(hub_dir / "aps/super_glue/boolq/validation-00000-of-00001.parquet")]
    native = evaluate(tiny_model_dir, "boolq,piqa", 0, eval_dir, limit=10, progress=False)
    keys = ("task", "shots", "n", "metric", "value", "stderr")
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in native]


def test_without_data_dir_the_harness_call_is_made(monkeypatch, hub_dir: Path) -> None:
    """The hub path runs `datasets.load_dataset(path, name, split=...)`; its rows become documents."""
    import datasets

    saved = datasets.load_from_disk(str(hub_dir / "baber" / "piqa"))
    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs))
        if split == "train":  # stands in for the hub's train split
            return saved["validation"].select(range(100, 200))
        return saved[split]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    task = get_task("piqa")
    data = load_task_data(task, None, limit=5, need_pool=True)
    assert calls == [("baber/piqa", None, "validation", {}), ("baber/piqa", None, "train", {})]
    assert data.files == ["baber/piqa [validation]", "baber/piqa [train]"] and data.pool_split == "train"
    first = saved["validation"].select(range(5))
    assert [task.doc_to_text(d) for d in data.docs] == [f"Question: {r['goal']}\nAnswer:" for r in first]
    assert [task.gold(d) for d in data.docs] == saved["validation"]["label"][:5]
    assert len(data.pool or []) == 100


def test_offline_without_data_dir_says_which_file_to_put_where(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    done = run_tokenmill("eval", "--model", str(tiny_model_dir), "--tasks", "piqa", env=env)
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(
        "tokenmill: error: task piqa: `datasets` cannot load baber/piqa [validation] "
        "(HF_HUB_OFFLINE is set and it is not in the local cache)"
    )
    assert "put piqa_valid.jsonl (with piqa_valid-labels.lst next to it)" in line
    assert "pass --data-dir FOLDER (or save that dataset there as FOLDER/baber/piqa/)" in line


def test_missing_data_names_both_layouts(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError) as info:
        load_task_data(get_task("boolq"), tmp_path)
    message = str(info.value)
    assert str(tmp_path / "boolq_dev.jsonl") in message
    assert f"the validation split of aps/super_glue saved in {tmp_path / 'aps/super_glue/boolq'}/" in message
    # Another config's rows never stand in for boolq's.
    (tmp_path / "aps" / "super_glue" / "wic").mkdir(parents=True)
    (tmp_path / "aps" / "super_glue" / "validation.jsonl").write_text('{"label": 0}\n')
    with pytest.raises(MissingDataError):
        load_task_data(get_task("boolq"), tmp_path)
