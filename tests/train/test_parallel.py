"""4D parallelism (tp x pp x dp x cp) equals single-process training (CPU, gloo).

One launch per world size (tests/train/ranks.py: ranks as torchrun starts them, forked from a
process with torch imported) runs every layout of that size in turn (process start-up dominates
on a small CPU); each rank writes its losses, gradient norms and its share of the
final parameters (gathered to full tensors), and the tests compare them with the
engine on one process with the same model, data and steps.

Run as a script, this file is the worker: `torchrun ... test_parallel.py OUT LAYOUT...`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Also run as a rank's script (ranks.py), which finds its helpers here and in tests/.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from local_ports import free_port  # noqa: E402
from ranks import launch  # noqa: E402

STEPS = 3
GLOBAL_BATCH = 8
MICRO_BATCH = 2
SEQ = 16
LR = 1e-3
CLIP = 1.0

LLAMA = {"flavour": "llama", "n_kv_heads": 2}  # RoPE and grouped-query attention
EOD_ID = 3  # the end-of-document token of the layouts named *_docs (document masking)

# name -> (model overrides, parallel section)
LAYOUTS_2 = {
    "tp2": ({}, {"tp": 2}),
    "tp2_sp_llama": (LLAMA, {"tp": 2, "sequence_parallel": True}),
    "pp2_1f1b": ({}, {"pp": 2, "pp_schedule": "1f1b"}),
    "pp2_gpipe": ({}, {"pp": 2, "pp_schedule": "gpipe"}),
    "pp2_interleaved": ({"n_layers": 4}, {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2}),
    "dp2_zero0": ({}, {"dp": 2, "zero": 0}),
    "dp2_zero1": ({}, {"dp": 2, "zero": 1}),
    "dp2_zero2": ({}, {"dp": 2, "zero": 2}),
    "dp2_zero3": ({}, {"dp": 2, "zero": 3}),
    # Tied input/output embeddings: one weight under tp, two copies kept equal under pp.
    "tp2_tied": ({"tie_embeddings": True}, {"tp": 2}),
    "dp2_zero3_tied": ({"tie_embeddings": True}, {"dp": 2, "zero": 3}),
    "pp2_1f1b_tied": ({"tie_embeddings": True}, {"pp": 2, "pp_schedule": "1f1b"}),
    "pp2_interleaved_tied": (
        {"n_layers": 4, "tie_embeddings": True},
        {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2},
    ),
    # Context parallel: ring attention over the load-balanced split, learned positions / RoPE + GQA.
    "cp2": ({}, {"cp": 2}),
    "cp2_llama_zero1": (LLAMA, {"cp": 2, "zero": 1}),
    # Document masking: packed documents attend only within themselves, positions restart.
    "tp2_sp_llama_docs": (LLAMA, {"tp": 2, "sequence_parallel": True}),
    "pp2_1f1b_docs": ({}, {"pp": 2, "pp_schedule": "1f1b"}),
    "dp2_zero1_docs": ({}, {"dp": 2, "zero": 1}),
    "cp2_llama_docs": (LLAMA, {"cp": 2}),
    # bf16 through the ring's block kernels, against one process in bf16.
    "cp2_llama_bf16": (LLAMA, {"cp": 2, "precision": "bf16"}),
    # The chunked head + loss (its last stage's under pp) against the plain one of one process.
    "pp2_1f1b_tied_chunked": ({"tie_embeddings": True}, {"pp": 2, "pp_schedule": "1f1b", "loss_chunk_tokens": 5}),
    "dp2_zero1_chunked": ({}, {"dp": 2, "zero": 1, "loss_chunk_tokens": 5}),
}
LAYOUTS_4 = {
    "cp4": ({}, {"cp": 4}),
    "cp4_llama": (LLAMA, {"cp": 4}),
    "cp2_tp2_llama_sp": (LLAMA, {"cp": 2, "tp": 2, "sequence_parallel": True}),
    "cp2_tp2": ({}, {"cp": 2, "tp": 2}),
    "cp2_pp2_llama": (LLAMA, {"cp": 2, "pp": 2}),
    "cp2_pp2_tied": ({"tie_embeddings": True}, {"cp": 2, "pp": 2}),
    "cp2_dp2_zero3": ({}, {"cp": 2, "dp": 2, "zero": 3}),
    "cp2_dp2_zero3_llama": (LLAMA, {"cp": 2, "dp": 2, "zero": 3}),
    "cp4_docs": ({}, {"cp": 4}),
    "cp2_pp2_llama_docs": (LLAMA, {"cp": 2, "pp": 2}),
}
LAYOUTS_8 = {
    "tp2_pp2_dp2_zero3_sp": ({}, {"tp": 2, "pp": 2, "dp": 2, "zero": 3, "sequence_parallel": True}),
    "tp2_pp2_dp2_zero1_tied": ({"tie_embeddings": True}, {"tp": 2, "pp": 2, "dp": 2, "zero": 1}),
}
ALL = {**LAYOUTS_2, **LAYOUTS_4, **LAYOUTS_8}
WORLD = {**dict.fromkeys(LAYOUTS_2, 2), **dict.fromkeys(LAYOUTS_4, 4), **dict.fromkeys(LAYOUTS_8, 8)}


def tiny_config(model_over: dict | None = None, parallel: dict | None = None, seed: int = 7, documents: bool = False):
    """The small GPT (vocab 128, 2 layers, hidden 64, 4 heads) and training settings every
    parallel test shares, with overrides for the model and the layout (`parallel`);
    `documents`: document masking with EOD_ID."""
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.model_config import ModelConfig

    model = ModelConfig(
        **{
            "flavour": "gpt2",
            "vocab_size": 128,
            "n_layers": 2,
            "hidden": 64,
            "n_heads": 4,
            "max_seq_len": SEQ,
            **(model_over or {}),
        }
    )
    return TrainConfig(
        model=model,
        dataset={"seq_len": SEQ, **({"document_masking": True, "eod_id": EOD_ID} if documents else {})},
        schedule={"global_batch_size": GLOBAL_BATCH, "micro_batch_size": MICRO_BATCH, "seed": seed},
        optimizer={"lr": LR, "min_lr": LR, "clip_grad": CLIP},
        parallel=parallel or {},
        logging={"progress": False, "tensorboard": False},
    ).validate()


def make_config(name: str):
    return tiny_config(*ALL.get(name, ({}, {})), documents=name.endswith("_docs"))


def batches() -> list[torch.Tensor]:
    """Random rows, with EOD_ID at two places that differ from row to row (documents of 1 to 10
    tokens that cross the cp chunks' boundaries)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS):
        rows = torch.randint(0, 128, (GLOBAL_BATCH, SEQ + 1), generator=g)
        for r in range(GLOBAL_BATCH):
            rows[r, [2 + r % 3, 9 + r % 5]] = EOD_ID
        out.append(rows)
    return out


def single_process(name: str) -> dict:
    from tokenmill.train.engine import Engine
    from tokenmill.train.model import GPT

    # The layout's model, data and precision on one process, with the default parallel
    # section otherwise: the *_chunked layouts equal the plain head and loss.
    precision = {"precision": ALL[name][1].get("precision", "fp32")}
    cfg = tiny_config(ALL[name][0], precision, documents=name.endswith("_docs"))
    torch.manual_seed(cfg.schedule.seed)
    engine = Engine(cfg, GPT(cfg.model), torch.device("cpu"))
    losses, norms = [], []
    for tokens in batches():
        losses.append(engine.train_step(tokens, MICRO_BATCH))
        norms.append(engine.clip_grad_norm(CLIP))
        engine.optimizer_step(LR)
    params = {k: v.detach().clone() for k, v in engine.model_parts[0].state_dict().items()}
    return {"losses": losses, "norms": norms, "params": params, "eval": engine.eval_loss(batches()[0])}


def worker(out: Path, names: list[str]) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from tokenmill.train.engine import Engine

    torch.set_num_threads(1)
    for name in names:
        cfg = make_config(name)
        torch.manual_seed(cfg.schedule.seed)
        engine = Engine(cfg)
        local = GLOBAL_BATCH // engine.dp_size
        losses, norms = [], []
        for tokens in batches():
            mine = tokens[engine.dp_rank * local : (engine.dp_rank + 1) * local]
            losses.append(engine.train_step(mine, MICRO_BATCH))
            norms.append(engine.clip_grad_norm(CLIP))
            engine.optimizer_step(LR)
        val = engine.eval_loss(batches()[0][engine.dp_rank * local : (engine.dp_rank + 1) * local])
        params: dict[str, torch.Tensor] = {}
        for part in engine.model_parts:
            params.update(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))
        rank = dist.get_rank()
        torch.save({"losses": losses, "norms": norms, "params": params, "eval": val}, out / f"{name}.rank{rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


def merged(out: Path, name: str, world: int) -> dict:
    parts = [torch.load(out / f"{name}.rank{r}.pt", weights_only=False) for r in range(world)]
    params: dict[str, torch.Tensor] = {}
    for p in parts:
        params.update(p["params"])
    # Every rank reports the same loss and norm.
    for p in parts[1:]:
        assert p["losses"] == parts[0]["losses"]
    return {"losses": parts[0]["losses"], "norms": parts[0]["norms"], "params": params, "eval": parts[0]["eval"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parallel")
    launch(out, 2, list(LAYOUTS_2), script=__file__)
    launch(out, 4, list(LAYOUTS_4), script=__file__)
    launch(out, 8, list(LAYOUTS_8), script=__file__)
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(ALL))
def test_layout_equals_single_process(runs: Path, name: str) -> None:
    got, want = merged(runs, name, WORLD[name]), single_process(name)
    # bf16: the ring merges bf16 blocks in fp32 where one process's SDPA rounds once (losses
    # 2e-5 off here, gradient norms 1e-4).
    bf16 = ALL[name][1].get("precision") == "bf16"
    loss_rel, norm_rel = (1e-4, 1e-3) if bf16 else (1e-5, 1e-5)
    for a, b in zip(got["losses"], want["losses"]):
        assert a == pytest.approx(b, rel=loss_rel), (got["losses"], want["losses"])
    # The gradient norm that clipping uses and metrics.jsonl logs, to float32 rounding: a norm
    # weight's gradient under sequence parallelism is a partial sum over the tp group, and its
    # parts' squares are not the square of their sum (3.7e-5 off here, up to 0.4% on larger runs).
    for a, b in zip(got["norms"], want["norms"]):
        assert a == pytest.approx(b, rel=norm_rel), (got["norms"], want["norms"])
    assert got["eval"] == pytest.approx(want["eval"], rel=loss_rel)
    assert set(got["params"]) == set(want["params"])
    # Adam's step divides by the gradient's running norm, so a weight whose gradient is near
    # zero moves by its rounding noise: packed documents' short attention rows leave more of
    # those (2.5e-5 off here, with losses equal to 2e-7); under bf16 such a weight may step
    # the other way (3.8e-3 off here, of at most 6e-3 in 3 steps at lr 1e-3).
    atol = 5e-3 if bf16 else 5e-5 if name.endswith("_docs") else 2e-5
    for key, value in want["params"].items():
        torch.testing.assert_close(got["params"][key], value, rtol=1e-4, atol=atol, msg=key)


@pytest.mark.distributed
def test_two_launchers_train_together(tmp_path: Path) -> None:
    """The multi-node path: two `torchrun --nnodes 2` launchers meet at a c10d rendezvous on
    127.0.0.1 and train dp=2 (ZeRO-3) across them, equal to one process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    port = free_port()
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=tokenmill-test",
                __file__,
                str(tmp_path),
                "dp2_zero3",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in launchers:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-6000:]
    got, want = merged(tmp_path, "dp2_zero3", 2), single_process("dp2_zero3")
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
    for key, value in want["params"].items():
        torch.testing.assert_close(got["params"][key], value, rtol=1e-4, atol=2e-5, msg=key)


def test_impossible_layouts_are_clear_errors() -> None:
    from tokenmill.errors import ConfigError
    from tokenmill.train.config import ParallelConfig, TrainConfig, check_layout
    from tokenmill.train.model_config import ModelConfig

    model = ModelConfig("gpt2", 128, 2, 64, 4, max_seq_len=32)
    cases = [
        (ParallelConfig(tp=2, pp=2, dp=1), 8, "tp x pp x dp = 2 x 2 x 1 = 4 but 8 processes"),
        (ParallelConfig(tp=8, pp=1, dp=1), 8, "tp: 8 does not divide model.n_heads = 4"),
        (ParallelConfig(tp=1, pp=4, dp=1), 4, "4 pipeline stages"),
        (ParallelConfig(tp=1, pp=2, dp=1, pp_schedule="interleaved", virtual_stages=2), 2, "4 pipeline stages"),
    ]
    for dims, world, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            check_layout(dims, model, SEQ, world)
    with pytest.raises(ConfigError, match="seq_len 15 is not divisible by tp = 2"):
        check_layout(ParallelConfig(tp=2, pp=1, dp=1, sequence_parallel=True), model, 15, 2)
    # Context parallel: the load-balanced split needs 2 x cp equal chunks; in the config
    # itself, so `tokenmill train` reports it before any worker starts.
    with pytest.raises(ConfigError, match=r"^parallel.cp: seq_len 12 does not split into 2 x cp = 8 equal chunks"):
        check_layout(ParallelConfig(cp=4), model, 12, 4)
    with pytest.raises(ConfigError, match=r"tp x pp x dp x cp = 1 x 1 x 1 x 2 = 2 but 4 processes"):
        check_layout(ParallelConfig(cp=2), model, SEQ, 4)
    with pytest.raises(ConfigError, match=r"parallel.cp: seq_len 18 does not split into 2 x cp = 4") as error:
        TrainConfig(model=model, dataset={"seq_len": 18}, parallel={"cp": 2}).validate()
    assert "\n" not in str(error.value)


def test_pipeline_split_balances_the_head() -> None:
    from tokenmill.train.model_config import ModelConfig
    from tokenmill.train.parallel.pipeline import split_layers

    model = ModelConfig("gpt2", 50304, 8, 256, 4, max_seq_len=SEQ)  # the head costs ~16 layers here
    bounds = split_layers(model, 4)
    assert bounds[-1] == [7]  # the head's stage takes one layer
    assert sorted(len(b) for b in bounds[:-1]) == [2, 2, 3]
    assert sum(bounds, []) == list(range(8))
    assert [len(b) for b in split_layers(ModelConfig("gpt2", 128, 4, 64, 4), 4)] == [1, 1, 1, 1]


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2:])
