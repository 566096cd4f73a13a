"""Per-rank bytes of parameters, gradients and optimizer state under ZeRO 0..3, measured on our
engine on dp processes (CPU, gloo), beside the ZeRO paper's formulas.

The paper's formulas for Psi parameters, data-parallel degree Nd and K bytes of optimizer
state per parameter: stage 0 (2+2+K)Psi, 1 (2+2+K/Nd)Psi, 2 (2+(2+K)/Nd)Psi, 3 ((2+2+K)/Nd)Psi,
for 16-bit weights and gradients. Our precision keeps fp32 weights and gradients (bf16 runs
use autocast) and AdamW's two fp32 moments, so the same formulas with 4+4+K, K=8.

Measured per rank (the most loaded rank is printed):
- weights: at rest, between steps (FSDP2 keeps only the shard), and at the end of forward
  (ZeRO-2 keeps the gathered weights through backward; ZeRO-3 has freed them);
- gradients: after backward, before the optimizer step;
- optimizer: the AdamW state tensors this rank holds after a step.

    python bench/zero_memory.py            # dp=2 and dp=4 (launches torchrun itself)

Run once, with no rounds: what it reports are the byte counts of the tensors each rank holds,
not sampled memory, and those are the same on every run (the load line is printed all the same).
"""

from __future__ import annotations

from pathlib import Path

from measure import check_load, emit_report, main_or_worker, torchrun_rows

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "zero_memory.txt"


def nbytes(t) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def measure(zero: int, dp: int) -> dict[str, int]:
    import torch

    from tokenmill.train.config import TrainConfig
    from tokenmill.train.engine import Engine
    from tokenmill.train.model_config import ModelConfig

    model = ModelConfig("gpt2", 4096, 4, 256, 8, max_seq_len=64)
    cfg = TrainConfig(
        model=model,
        dataset={"seq_len": 64},
        schedule={"global_batch_size": 2 * dp, "micro_batch_size": 2},
        parallel={"dp": dp, "zero": zero},
        logging={"progress": False, "tensorboard": False},
    ).validate()
    torch.manual_seed(0)
    engine = Engine(cfg)
    (part,) = engine.model_parts
    at_forward_end: list[int] = []
    # Parameters resident when forward ends: FSDP swaps in the gathered tensors while a unit
    # is unsharded, so this counts what ZeRO-2 keeps for the backward pass.
    hook = part.register_forward_hook(lambda m, i, o: at_forward_end.append(sum(nbytes(p) for p in m.parameters())))
    tokens = torch.randint(0, model.vocab_size, (2, 65))
    engine.train_step(tokens, 2)
    hook.remove()
    grads = sum(nbytes(p.grad) for p in engine.parameters() if p.grad is not None)
    engine.optimizer_step(1e-4)
    optim = sum(
        nbytes(v)
        for opt in engine.optimizers
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.ndim > 0
    )
    return {
        "psi": model.num_params(),
        "weights": sum(nbytes(p) for p in engine.parameters()),
        "weights_fwd": at_forward_end[0],
        "grads": grads,
        "optim": optim,
    }


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rows = []
    dist.init_process_group("gloo")
    dp = dist.get_world_size()
    for zero in range(4):
        mine = measure(zero, dp)
        every: list[dict[str, int]] = [{}] * dp
        dist.all_gather_object(every, mine)
        rows.append((zero, dp, {k: max(r[k] for r in every) for k in mine}))
    if dist.get_rank() == 0:
        out.write_text(repr(rows))
    dist.destroy_process_group()


def formula(zero: int, dp: int, psi: int, w: float = 4, g: float = 4, k: float = 8) -> tuple[float, float, float]:
    return (w * psi / (dp if zero >= 3 else 1), g * psi / (dp if zero >= 2 else 1), k * psi / (dp if zero >= 1 else 1))


def main() -> None:
    lines = [
        check_load(),
        "ZeRO memory per rank: measured (our engine, CPU gloo) vs the ZeRO paper's formulas in our precision",
        "(fp32 weights 4 B + fp32 gradients 4 B + AdamW K=8 B per parameter). MB = 1e6 bytes; most loaded rank.",
        "",
        f"{'zero':>4} {'dp':>3} {'weights':>8} {'w@fwd':>8} {'grads':>8} {'optim':>8} {'total':>8} | "
        f"{'formula':>8} {'w':>7} {'g':>7} {'opt':>7} | {'meas/formula':>12}",
    ]
    for dp in (2, 4):
        rows = torchrun_rows(__file__, dp)
        for zero, dp_, m in rows:
            fw, fg, fo = formula(zero, dp_, m["psi"])
            # Weights at their peak (gathered through backward under ZeRO-2), as the formula counts them.
            total = max(m["weights"], m["weights_fwd"]) + m["grads"] + m["optim"]
            lines.append(
                f"{zero:>4} {dp_:>3} {m['weights'] / 1e6:8.2f} {m['weights_fwd'] / 1e6:8.2f} {m['grads'] / 1e6:8.2f} "
                f"{m['optim'] / 1e6:8.2f} {total / 1e6:8.2f} | {(fw + fg + fo) / 1e6:8.2f} {fw / 1e6:7.2f} "
                f"{fg / 1e6:7.2f} {fo / 1e6:7.2f} | {total / (fw + fg + fo):12.3f}"
            )
    psi = rows[0][2]["psi"]
    lines += [
        "",
        f"Psi = {psi:,} parameters (gpt2, 4 layers, hidden 256, vocab 4096).",
        "weights = stored between steps; w@fwd = resident at the end of forward (ZeRO-2 keeps the gathered",
        "weights for backward, ZeRO-3 frees them); total = the larger of the two + grads + optim. ZeRO-1 shards the optimizer by whole parameters, so its",
        "most loaded rank sits slightly above K*Psi/Nd.",
    ]
    emit_report(lines, str(RESULT))


if __name__ == "__main__":
    main_or_worker(main, worker)
