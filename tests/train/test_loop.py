"""The loop end to end on real text: exact resume, checkpoints, corruption, metrics, errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.train.checkpoint import load_for_inference
from tokenmill.train.checkpoint_files import CheckpointError, list_checkpoints
from tokenmill.train.config import TrainConfig
from tokenmill.train.loop import train
from tokenmill.train.metrics import read_metrics
from tokenmill.train.model_config import preset


def tiny_config(shard: Path, out: Path, **sections) -> TrainConfig:
    """A few CPU steps of the tiny model; each keyword is a section (its keys merged over these)
    or a top-level key."""
    base = {
        "model": preset("tiny", max_seq_len=32),
        "out": str(out),
        "dataset": {"path": str(shard), "seq_len": 32},
        "schedule": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 4, "warmup_steps": 2},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "parallel": {"device": "cpu"},
        "logging": {"interval": 1, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        below = base.get(key)
        base[key] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
    return TrainConfig(**base).validate()


def test_exact_resume_bitwise(shakespeare_shard: Path, tmp_path: Path) -> None:
    """Stop at step 3 and resume to 7: the same losses, bit for bit, as one run to 7 (with a
    batch ramp-up, gradient accumulation and dropout, so every piece of state matters)."""
    kw = dict(schedule={"steps": 7, "rampup_batch_size": [4, 4, 12]}, model=preset("tiny", max_seq_len=32, dropout=0.1))
    full = train(tiny_config(shakespeare_shard, tmp_path / "full", **kw))
    part = train(
        tiny_config(
            shakespeare_shard, tmp_path / "part", **dict(kw, schedule={"steps": 3, "rampup_batch_size": [4, 4, 12]})
        )
    )
    assert part.step == 3
    resumed = train(tiny_config(shakespeare_shard, tmp_path / "part", **kw), resume=True)
    assert resumed.step == 7 and resumed.consumed_samples == full.consumed_samples
    assert [full.losses[s] for s in range(4, 8)] == [resumed.losses[s] for s in range(4, 8)]
    logged = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part")}
    assert logged == full.losses  # metrics.jsonl continues across the resume
    assert [r["batch_size"] for r in read_metrics(tmp_path / "full")] == [4, 4, 4, 8, 8, 8, 8]
    a, _, _ = load_for_inference(tmp_path / "full")
    b, _, _ = load_for_inference(tmp_path / "part")
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_checkpoints_keep_last_and_latest(shakespeare_shard: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = train(
        tiny_config(
            shakespeare_shard,
            run,
            checkpoint={"interval": 2, "keep_last": 2},
            logging={"eval_interval": 3, "eval_iters": 1},
        )
    )
    names = [p.name for p in list_checkpoints(run)]
    assert names == ["step_4", "step_6"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_6"
    meta = json.loads((run / "checkpoints" / "step_6" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["consumed_samples"] == 48 and meta["model"]["n_layers"] == 2
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert {"loss", "lr", "grad_norm", "batch_size", "tokens_per_s", "memory_gib"} <= set(records[0])
    assert "val_loss" in records[2] and "val_loss" in records[5]
    assert result.losses[6] < result.losses[1]
    # The loaded model reproduces the saved validation loss.
    model, cfg, meta = load_for_inference(run)
    assert cfg == preset("tiny", max_seq_len=32)


def test_corrupted_checkpoint_is_reported_and_previous_still_loads(shakespeare_shard: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(shakespeare_shard, run, schedule={"steps": 4}, checkpoint={"interval": 2}))
    data_file = next((run / "checkpoints" / "step_4").glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])  # truncate
    with pytest.raises(CheckpointError) as info:
        train(tiny_config(shakespeare_shard, run, schedule={"steps": 6}), resume=True)
    message = str(info.value)
    assert "step_4 is truncated or corrupted" in message and "previous checkpoint" in message and "step_2" in message
    with pytest.raises(CheckpointError, match="truncated"):
        load_for_inference(run)
    model, _, meta = load_for_inference(run / "checkpoints" / "step_2")
    assert meta["step"] == 2
    resumed = train(tiny_config(shakespeare_shard, run, schedule={"steps": 6}), resume=run / "checkpoints" / "step_2")
    assert resumed.step == 6

    # A flipped byte with the right size is caught by the checksum.
    step6 = next((run / "checkpoints" / "step_6").glob("*.distcp"))
    raw = bytearray(step6.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    step6.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="sha256"):
        load_for_inference(run)


def test_interrupted_save_leaves_previous_checkpoint(shakespeare_shard: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(shakespeare_shard, run, schedule={"steps": 2}))
    # A crash mid-save leaves only a temporary directory, which is never picked up.
    (run / "checkpoints" / ".step_4.tmp").mkdir()
    (run / "checkpoints" / ".step_4.tmp" / "__0_0.distcp").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(run)] == ["step_2"]
    _, _, meta = load_for_inference(run)
    assert meta["step"] == 2


def test_data_and_vocab_errors(shakespeare_shard: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenmillError, match="not found"):
        train(tiny_config(tmp_path / "missing", tmp_path / "run"))
    with pytest.raises(ConfigError, match="no training data"):
        train(tiny_config(shakespeare_shard, tmp_path / "run", dataset={"path": None}))
    with pytest.raises(ConfigError, match="model.vocab_size: 100 is smaller than the data's vocabulary"):
        train(tiny_config(shakespeare_shard, tmp_path / "run", model=preset("tiny", vocab_size=100, max_seq_len=32)))
    train(tiny_config(shakespeare_shard, tmp_path / "run", schedule={"steps": 1}))
    with pytest.raises(ConfigError, match="differs from the checkpoint"):
        train(
            tiny_config(
                shakespeare_shard,
                tmp_path / "run",
                schedule={"steps": 2},
                model=preset("tiny", max_seq_len=32, n_layers=3),
            ),
            resume=True,
        )


def test_trains_on_a_blend_file(shakespeare_shard: Path, shared_data: Path, tmp_path: Path) -> None:
    from shard_files import write_shard

    lines = (shared_data / "corpus" / "wikitext2_valid.txt").read_bytes()[:200_000].split(b"\n")
    wiki = write_shard(tmp_path / "wiki", [line for line in lines if len(line.strip()) > 20])  # paragraphs
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"- {{prefix: {shakespeare_shard}, weight: 0.7}}\n- {{prefix: {wiki.name}, weight: 0.3}}\n")
    result = train(tiny_config(blend, tmp_path / "run", schedule={"steps": 3}, logging={"eval_interval": 3}))
    assert result.step == 3 and 3 in result.val_losses
    with pytest.raises(TokenmillError, match="not found"):
        blend.write_text(f"- {{prefix: {tmp_path / 'gone'}, weight: 1.0}}\n")
        train(tiny_config(blend, tmp_path / "run2", schedule={"steps": 1}))


def test_resume_keeps_one_metrics_row_per_step(shakespeare_shard: Path, tmp_path: Path) -> None:
    """A run logged steps 21..30 past its step-20 checkpoint (then died, leaving half a line);
    resumed from step 20 to 40, metrics.jsonl has each step once, with the re-run values."""
    run = tmp_path / "run"
    first = train(
        tiny_config(shakespeare_shard, run, schedule={"steps": 30}, checkpoint={"interval": 20, "keep_last": 3})
    )
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 31, "lo')  # a write cut short by SIGKILL
    resumed = train(
        tiny_config(shakespeare_shard, run, schedule={"steps": 40}, checkpoint={"interval": 20, "keep_last": 3}),
        resume=run / "checkpoints" / "step_20",
    )
    records = read_metrics(run)
    assert [r["step"] for r in records] == list(range(1, 41))
    assert {r["step"]: r["loss"] for r in records if r["step"] <= 20} == {s: first.losses[s] for s in range(1, 21)}
    assert {r["step"]: r["loss"] for r in records if r["step"] > 20} == resumed.losses
    assert not list(run.glob(".metrics.jsonl.tmp-*"))


def test_a_run_directory_with_checkpoints_is_continued_only_with_resume(
    shakespeare_shard: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(tiny_config(shakespeare_shard, run, schedule={"steps": 4}))
    before = read_metrics(run)
    with pytest.raises(TokenmillError, match=r"already holds a run's checkpoints .*step_4\); rerun with --resume"):
        train(tiny_config(shakespeare_shard, run, schedule={"steps": 3}))  # no --resume
    assert read_metrics(run) == before and [p.name for p in list_checkpoints(run)] == ["step_4"]
    # The refused run let go of the directory; resumed past its end, there is nothing to do.
    done = train(tiny_config(shakespeare_shard, run, schedule={"steps": 3}), resume=True)
    assert (done.step, done.losses, done.checkpoint) == (4, {}, run / "checkpoints" / "step_4")
    assert read_metrics(run) == before


def test_the_run_directory_admits_one_writer(shakespeare_shard: Path, tmp_path: Path) -> None:
    from tokenmill.train.lifecycle import RunInUseError, RunLock

    run = tmp_path / "run"
    with RunLock(run):  # held by another open file, as another process would hold it
        with pytest.raises(
            RunInUseError, match=rf"run is being written by another `tokenmill train` \(pid {os.getpid()}\)"
        ):
            train(tiny_config(shakespeare_shard, run, schedule={"steps": 1}))
        assert not (run / "metrics.jsonl").exists()
    assert train(tiny_config(shakespeare_shard, run, schedule={"steps": 1})).step == 1  # released: free again


def test_two_documents_train_without_validation(tmp_path: Path, shared_data: Path) -> None:
    """Two documents give the default split (969,30,1) no valid document: the run trains, says
    once that it does not validate, and logs no val_loss."""
    import subprocess
    import sys

    from shard_files import text_documents, write_shard

    docs = text_documents(shared_data / "corpus" / "tinyshakespeare.txt")
    # The first (training) document fills a 128-token sample: a shorter one is refused.
    write_shard(tmp_path / "two", [b"\n\n".join(docs[:4]), docs[4]])
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("tokenmill")),
            "train",
            "tiny",
            "--data",
            "two",
            "--out",
            "run",
            "--steps",
            "4",
            "--no-progress",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("the valid split of two has no documents (2 documents, split '969,30,1')") == 1
    records = read_metrics(tmp_path / "run")
    assert records[-1]["step"] == 4 and not any("val_loss" in r for r in records)


def test_vocabulary_from_the_data_padded_as_megatron(shakespeare_shard: Path, tmp_path: Path) -> None:
    from tokenmill.train.config import config_from_dict, padded_vocab_size

    assert [padded_vocab_size(v, 128, tp) for v, tp in ((257, 1), (257, 2), (50257, 1), (384, 1), (32000, 8))] == [
        384,
        512,
        50304,
        384,
        32768,
    ]
    base = {
        "dataset": {"path": str(shakespeare_shard), "seq_len": 32},
        "schedule": {"steps": 1, "global_batch_size": 8},
        "parallel": {"device": "cpu"},
        "logging": {"tensorboard": False, "progress": False},
    }
    result = train(
        config_from_dict(
            {**base, "model": {"preset": "tiny", "max_seq_len": 32}, "out": str(tmp_path / "a")}
        ).validate()
    )
    _, model_cfg, _ = load_for_inference(result.run_dir)
    assert model_cfg.vocab_size == 384  # 257 in PREFIX.json, padded to 128
    dataset = {**base["dataset"], "make_vocab_size_divisible_by": 64}
    cfg = config_from_dict({**base, "dataset": dataset, "model": "tiny", "out": str(tmp_path / "b")})
    assert train(cfg.validate()).step == 1 and cfg.model.vocab_size == 320
    explicit = config_from_dict({**base, "model": {"preset": "tiny", "vocab_size": 300}, "out": str(tmp_path / "c")})
    assert train(explicit.validate()).step == 1 and explicit.model.vocab_size == 300  # as given, unpadded
    small = config_from_dict({**base, "model": {"preset": "tiny", "vocab_size": 200}, "out": str(tmp_path / "d")})
    with pytest.raises(
        ConfigError,
        match=r"model.vocab_size: 200 is smaller than the data's vocabulary \(257 in "
        r".*shakespeare.json\); set model.vocab_size >= 257, or leave it out",
    ):
        train(small.validate())


HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


def test_steps_between_logs_never_wait_for_the_device(shakespeare_shard: Path, tmp_path: Path, monkeypatch) -> None:
    """Loss and gradient norm stay on the device: a step that logs nothing reads no tensor on
    the host (each of the reads that wait for a GPU is counted, by step); the logging steps
    read theirs and those of the steps before, and the losses are all there at the end."""
    from tokenmill.train.engine import Engine

    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            # Not torch.optim reading its step count: a host tensor under the foreach AdamW
            # (on the GPU too), which fused AdamW keeps on the device and never reads.
            if "torch/optim/" not in sys._getframe(1).f_code.co_filename:
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    per_step: list[int] = []  # host reads from the start of each step to the start of the next
    forward_backward = Engine.forward_backward

    def step_start(self, tokens, micro_batch_size):
        per_step.append(len(reads))
        return forward_backward(self, tokens, micro_batch_size)

    monkeypatch.setattr(Engine, "forward_backward", step_start)
    result = train(tiny_config(shakespeare_shard, tmp_path / "run", logging={"interval": 3}))
    per_step.append(len(reads))
    during = [b - a for a, b in zip(per_step, per_step[1:])]
    assert [during[i] for i in (0, 1, 3, 4)] == [0, 0, 0, 0], during
    assert during[2] > 0  # step 3 logs
    assert sorted(result.losses) == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [3, 6]


def test_a_non_finite_loss_ends_the_run_before_a_checkpoint_keeps_it(
    shakespeare_shard: Path, tmp_path: Path, monkeypatch
) -> None:
    """A NaN loss at step 2, read at step 3 (the checkpoint's step, no metrics row before it):
    the run ends naming step 2 and no checkpoint holds the weights it stepped."""
    from tokenmill.train.engine import Engine

    forward_backward, calls = Engine.forward_backward, []

    def nan_at_step_2(self, tokens, micro_batch_size):
        calls.append(1)
        loss = forward_backward(self, tokens, micro_batch_size)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(Engine, "forward_backward", nan_at_step_2)
    cfg = tiny_config(shakespeare_shard, tmp_path / "run", logging={"interval": 5}, checkpoint={"interval": 3})
    with pytest.raises(TokenmillError, match="loss is nan at step 2; lower lr or enable clip_grad"):
        train(cfg)
    assert list_checkpoints(tmp_path / "run") == []
