"""Evaluation during training: the scores logged at a step equal `tokenmill eval` of the
checkpoint saved at that step, under one process and the 2-rank layouts (tp, pp, cp, dp with
ZeRO-3; CPU, gloo), a run stopped on request is scored at the step it stops on, and a bad eval
section is one line before training starts."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml
from shard_files import text_documents, write_shard

from tokenmill.cli import main
from tokenmill.train import evaluation
from tokenmill.train.checkpoint_files import list_checkpoints, read_meta
from tokenmill.train.fault_injection import FAULT_ENV
from tokenmill.train.metrics import read_metrics
from tokenmill.train.stop import STOPPED_EXIT

TASKS = ["copa", "winograd", "bigbench_operators"]  # multiple choice, schema, language modeling
LIMIT = 4
EOD_TOKEN = "<|endoftext|>"


@pytest.fixture(scope="module")
def bpe_shard(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """Shakespeare in a 300-token byte-level BPE (trained here), with its tokenizer named in PREFIX.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("bpe")
    docs = [d.decode() for d in text_documents(shared_data / "corpus" / "tinyshakespeare.txt", 60_000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOD_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(str(root / "tokenizer.json"))
    ids = [np.array(e.ids, dtype=np.uint16) for e in tok.encode_batch(docs)]
    eod = tok.token_to_id(EOD_TOKEN)
    return write_shard(
        root / "shard", ids, eod=eod, vocab_size=tok.get_vocab_size(), tokenizer=str(root / "tokenizer.json")
    )


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    text = (shared_data / "corpus" / "wikitext2_valid.txt").read_text()[:3000]
    docs = [d.strip() for d in text.split("\n\n") if d.strip()][:3]
    path = tmp_path_factory.mktemp("held_out") / "held_out.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def train_config(directory: Path, shard: Path, icl_dir: Path, bpb: Path, parallel: dict, steps: int = 3) -> Path:
    config = {
        # vocab 384 (the data's 300, padded) splits over tp 2; 64 positions split into 2 x cp chunks.
        "model": {"preset": "tiny", "max_seq_len": 64, "vocab_size": 384},
        "dataset": {"path": str(shard), "seq_len": 32},
        "schedule": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "warmup_steps": 1},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "parallel": {"device": "cpu", **parallel},
        "logging": {"interval": 1, "tensorboard": False, "progress": False},
        "checkpoint": {"interval": 2},
        "eval": {
            "every": 2,
            "suite": "core",
            "tasks": TASKS,
            "data_dir": str(icl_dir),
            "limit": LIMIT,
            "bpb": str(bpb),
            "batch_size": 4,
        },
    }
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def core_subset(path: Path) -> Path:
    """A suite file of the chosen CORE tasks, with CORE's settings, for `tokenmill eval`."""
    core = yaml.safe_load(resources.files("tokenmill.eval").joinpath("suites/core.yaml").read_text())
    tasks = [t for t in core["tasks"] if t["label"] in TASKS]
    path.write_text(yaml.safe_dump({"name": "core", "aggregate": "CORE", "tasks": tasks}))
    return path


# The layout's parallel section, and whether a stop request ends the run after step 3 of 4
# (scored there though 3 is neither a multiple of `every` nor the last step) instead of at its
# last step 3 (the evaluation at a stop is the same code under every layout).
LAYOUTS = {
    "single_stopped": ({}, True),
    "tp2": ({"tp": 2}, False),
    "pp2": ({"pp": 2}, False),
    "cp2": ({"cp": 2}, False),
    "dp2_zero3": ({"dp": 2, "zero": 3}, False),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_logged_at_a_step_equal_tokenmill_eval_of_its_checkpoint(
    layout: str, bpe_shard: Path, held_out: Path, shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    parallel, stopped = LAYOUTS[layout]
    icl_dir = shared_data / "eval" / "icl"
    run = tmp_path / "run"
    config = train_config(tmp_path, bpe_shard, icl_dir, held_out, parallel, steps=4 if stopped else 3)
    published = []  # the steps of the checkpoints published when each evaluation starts
    if stopped:
        # SIGUSR1 right after step 2's stop check: the run stops after step 3.
        monkeypatch.setenv(FAULT_ENV, "SIGUSR1@step=2")
        scores = evaluation.evaluation_scores

        def recording_scores(*args):
            published.append([read_meta(c)["step"] for c in list_checkpoints(run)])
            return scores(*args)

        monkeypatch.setattr(evaluation, "evaluation_scores", recording_scores)
    assert main(["train", str(config), "--out", str(run)]) == (STOPPED_EXIT if stopped else 0)
    if stopped:
        # Step 2 is scored before its checkpoint is written; the stop's step once its checkpoint is published.
        assert published == [[], [2, 3]]
    rows = {r["step"]: r for r in read_metrics(run)}
    assert sorted(rows) == [1, 2, 3]
    assert [s for s, r in rows.items() if "eval/core" in r] == [2, 3]  # every 2 steps and the last (or stopped)
    # The stopped run's scores are those of its last checkpoint, written before they were.
    checked = 3 if stopped else 2
    checkpoint = next(c for c in list_checkpoints(run) if read_meta(c)["step"] == checked)
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(checkpoint), "--suite", str(core_subset(tmp_path / "suite.yaml"))]
    argv += ["--data-dir", str(icl_dir), "--limit", str(LIMIT), "--bpb", str(held_out), "--output", str(out)]
    assert main(argv) == 0
    results = {(r["task"], r["metric"]): r["value"] for r in json.loads(out.read_text())["results"]}
    logged = rows[checked]
    for task in TASKS:
        assert logged[f"eval/{task}/acc"] == results[(task, "acc")]
        assert logged[f"eval/{task}/centered_acc"] == pytest.approx(results[(task, "centered_acc")], abs=1e-12)
    assert logged["eval/core"] == pytest.approx(results[("CORE", "centered_acc")], abs=1e-12)
    assert logged["eval/bpb"] == pytest.approx(results[(f"bpb:{held_out.name}", "bits_per_byte")], rel=1e-5)
    assert rows[2]["eval/bpb"] != rows[3]["eval/bpb"]  # the weights scored are the step's


@pytest.mark.parametrize(
    ("eval_section", "message"),
    [
        ({"suite": "cor", "data_dir": "ICL"}, "eval: suite 'cor' is neither a bundled suite (core) nor a file"),
        (
            {"suite": "core", "data_dir": "ICL", "tasks": ["copa", "winogrand"]},
            "eval: unknown task 'winogrand' of suite core; did you mean 'winogrande'?",
        ),
        ({"suite": "core", "data_dir": "/nonexistent"}, "eval: data directory /nonexistent does not exist"),
        ({"suite": "core"}, "eval.data_dir: suite core: set eval.data_dir, the folder its task files are under"),
        ({"bpb": "/nonexistent.jsonl"}, "eval.bpb: /nonexistent.jsonl does not exist"),
    ],
)
def test_a_bad_eval_section_is_one_line_before_training(
    eval_section: dict, message: str, bpe_shard: Path, shared_data: Path, tmp_path: Path, capsys
) -> None:
    section = {k: str(shared_data / "eval" / "icl") if v == "ICL" else v for k, v in eval_section.items()}
    config = {"model": {"preset": "tiny", "max_seq_len": 64}, "dataset": {"path": str(bpe_shard)}, "eval": section}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"{message}\n") and err.count("\n") == 1, err
    assert err.startswith("tokenmill: error: ")
    assert not (tmp_path / "run").exists()  # nothing started
