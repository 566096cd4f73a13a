"""Context parallelism on the CPU (gloo): activation memory per rank and step time of a tiny
llama (RoPE, grouped-query attention) at sequence 4k, 8k and 16k for cp = 1, 2 and 4, against
the 1/cp ideal.

Activation memory is measured, not estimated: during one training step's forward pass a
`torch.autograd.graph.saved_tensors_hooks` pack hook sees every tensor autograd keeps for the
backward pass (ring attention's q, k, v, output and log-sum-exp included); the bench sums the
bytes of their distinct storages, leaving out the parameters. With one micro-batch per step
that sum is the peak of saved activations on the rank (backward only frees them). Transient
buffers (a block's scores inside the flash kernel, the K/V blocks in flight) are not in it.

cp = 1 is the plain model (one process, `scaled_dot_product_attention`); cp = 2 and 4 are
the engine's ring attention over cp processes. Step time is the second step's
forward + backward, the slowest rank. torch's own `context_parallel` dispatches CUDA SDPA
kernels only, so there is no peer to run beside ours on the CPU.

    python bench/context_parallel.py       # launches torchrun itself; about 5 minutes on 2 cores
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from measure import check_load, emit_report, main_or_worker, torchrun_rows

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "context_parallel.txt"
SEQS = (4096, 8192, 16384)
CPS = (1, 2, 4)


def measure(seq: int) -> dict[str, float]:
    import torch

    from tokenmill.train.config import TrainConfig
    from tokenmill.train.engine import Engine
    from tokenmill.train.model_config import ModelConfig

    model = ModelConfig("llama", 512, 2, 64, 4, n_kv_heads=2, ffn_hidden=160, max_seq_len=seq)
    cp = int(os.environ["WORLD_SIZE"])
    cfg = TrainConfig(
        model=model,
        dataset={"seq_len": seq},
        schedule={"global_batch_size": 1, "micro_batch_size": 1},
        parallel={"cp": cp},
        logging={"progress": False, "tensorboard": False},
    ).validate()
    torch.manual_seed(0)
    engine = Engine(cfg)
    params = {p.untyped_storage().data_ptr() for p in engine.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, model.vocab_size, (1, seq + 1), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine.train_step(tokens, 1)
    engine.optimizer_step(1e-4)
    start = time.perf_counter()
    engine.train_step(tokens, 1)
    seconds = time.perf_counter() - start
    engine.optimizer_step(1e-4)
    return {"activations": float(sum(saved.values())), "seconds": seconds}


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rows = []
    for seq in SEQS:
        mine = measure(seq)
        every: list[dict[str, float]] = [{}] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        rows.append((seq, {k: max(r[k] for r in every) for k in mine}))
    if dist.get_rank() == 0:
        out.write_text(repr(rows))
    dist.destroy_process_group()


def main() -> None:
    machine_load = check_load()
    results = {cp: dict(torchrun_rows(__file__, cp)) for cp in CPS}
    load = os.getloadavg()[0]
    lines = [
        machine_load,
        "Context parallelism (ring attention, load-balanced causal split), CPU gloo: activation memory per",
        "rank (bytes autograd saves for backward in one step's forward, parameters excluded; the most loaded",
        "rank) and step time (forward + backward, slowest rank), tiny llama: 2 layers, hidden 64, 4 heads",
        "(2 key/value heads), vocab 512, batch 1. MB = 1e6 bytes. ratio = measured / (cp=1 measured / cp).",
        "",
        f"{'seq':>6} {'cp':>3} {'act MB':>9} {'ideal MB':>9} {'ratio':>6} {'step s':>8} {'speedup':>7}",
    ]
    for seq in SEQS:
        base = results[1][seq]
        for cp in CPS:
            row = results[cp][seq]
            ideal = base["activations"] / cp
            lines.append(
                f"{seq:>6} {cp:>3} {row['activations'] / 1e6:9.2f} {ideal / 1e6:9.2f} "
                f"{row['activations'] / ideal:6.3f} {row['seconds']:8.2f} {base['seconds'] / row['seconds']:7.2f}"
            )
    lines += [
        "",
        f"Machine: {os.cpu_count()} CPU cores, load average {load:.1f} at the end of the run. Step times are",
        "indicative only: one thread per rank, cp ranks beyond the core count time-share them, and other",
        "jobs on a loaded machine add noise. speedup = cp=1 step time / this row's.",
    ]
    emit_report(lines, str(RESULT))


if __name__ == "__main__":
    main_or_worker(main, worker)
