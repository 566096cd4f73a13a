"""Checkpoint resharding: a DCP checkpoint saved under one (tp, pp, dp, cp, zero) layout loads
under another and training continues with the same losses.

Each launch runs `test_parallel_checkpoint.py OUT MODE LAYOUT [SOURCE]` in torchrun's ranks (ranks.py):
`save` trains 2 steps, saves `OUT/LAYOUT/checkpoints/step_2`, trains 2 more and records all 4
losses; `load` builds LAYOUT, loads SOURCE's step_2, saves it again as `OUT/LAYOUT/...` (for the
reverse direction) and trains steps 3 and 4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# Also run as a rank's script (ranks.py), which finds its helpers here and in tests/.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from ranks import launch  # noqa: E402
from test_parallel import CLIP, GLOBAL_BATCH, LR, MICRO_BATCH, SEQ, tiny_config  # noqa: E402

STEPS = 4
SAVE_AT = 2
LAYOUTS = {
    "one": {},
    "tp2": {"tp": 2},
    "tp2_pp2_dp2": {"tp": 2, "pp": 2, "dp": 2, "zero": 3, "sequence_parallel": True},
    "cp2": {"cp": 2, "zero": 3},  # ZeRO-3 shards over dp x cp
}


def make_config(layout: str):
    # Tied embeddings, as the gpt2 presets have them: under pp the head's copy is saved and
    # loaded under the embedding's name, the harder case for resharding.
    return tiny_config({"tie_embeddings": True}, LAYOUTS[layout], seed=11)


def worker(out: Path, mode: str, layout: str, source: str | None) -> None:
    import torch.distributed as dist

    from tokenmill.train.checkpoint import load_checkpoint, save_checkpoint
    from tokenmill.train.engine import Engine

    torch.set_num_threads(1)
    cfg = make_config(layout)
    torch.manual_seed(cfg.schedule.seed)
    engine = Engine(cfg)
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, 128, (GLOBAL_BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]
    local = GLOBAL_BATCH // engine.dp_size
    first = 0
    if mode == "load":
        assert source is not None
        state = engine.state_dict_for_checkpoint()
        load_checkpoint(out / source / "checkpoints" / f"step_{SAVE_AT}", state)
        engine.load_state_dict_from_checkpoint(state)
        # Written again under this layout: the reverse direction loads it.
        save_checkpoint(out / layout, SAVE_AT, engine.state_dict_for_checkpoint(), {"step": SAVE_AT})
        first = SAVE_AT
    losses = []
    for step in range(first, STEPS):
        if mode == "save" and step == SAVE_AT:
            save_checkpoint(out / layout, step, engine.state_dict_for_checkpoint(), {"step": step})
        tokens = data[step][engine.dp_rank * local : (engine.dp_rank + 1) * local]
        losses.append(engine.train_step(tokens, MICRO_BATCH))
        engine.clip_grad_norm(CLIP)
        engine.optimizer_step(LR)
    if engine.is_logging_rank:
        name = f"{mode}_{layout}" + (f"_from_{source}" if source else "")
        (out / f"{name}.json").write_text(json.dumps(losses))
    if engine.mesh is not None:  # one process alone makes no process group
        dist.barrier()
        dist.destroy_process_group()


def _world(layout: str) -> int:
    d = LAYOUTS[layout]
    return d.get("tp", 1) * d.get("pp", 1) * d.get("dp", 1) * d.get("cp", 1)


@pytest.mark.distributed
def test_checkpoint_reshards_between_layouts(tmp_path: Path) -> None:
    def run(mode: str, layout: str, source: str | None = None) -> list[float]:
        launch(tmp_path, _world(layout), [mode, layout] + ([source] if source else []), script=__file__)
        name = f"{mode}_{layout}" + (f"_from_{source}" if source else "")
        return json.loads((tmp_path / f"{name}.json").read_text())

    want = run("save", "tp2_pp2_dp2")[SAVE_AT:]  # the uninterrupted run's last steps
    assert run("load", "tp2", "tp2_pp2_dp2") == pytest.approx(want, rel=1e-5)  # also re-saves under tp2
    assert run("load", "one", "tp2_pp2_dp2") == pytest.approx(want, rel=1e-5)
    assert run("load", "tp2_pp2_dp2", "tp2") == pytest.approx(want, rel=1e-5)


@pytest.mark.distributed
def test_checkpoint_reshards_across_context_parallel(tmp_path: Path) -> None:
    """One process -> cp=2 (ZeRO-3 over the cp ranks) -> one process. The one-process legs run
    in this process (no process group), so the test costs a single launch."""
    worker(tmp_path, "save", "one", None)
    want = json.loads((tmp_path / "save_one.json").read_text())[SAVE_AT:]
    launch(tmp_path, 2, ["load", "cp2", "one"], script=__file__)  # also re-saves under cp=2
    assert json.loads((tmp_path / "load_cp2_from_one.json").read_text()) == pytest.approx(want, rel=1e-5)
    worker(tmp_path, "load", "one", "cp2")
    assert json.loads((tmp_path / "load_one_from_cp2.json").read_text()) == pytest.approx(want, rel=1e-5)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
