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

The load is checked first; the cp = 1, 2 and 4 launches run interleaved, --rounds times each,
and each step time is the median of its rounds with their spread (speedups are ratios of
medians). The activation bytes are the same in every round (checked), so they need no
repetition.

    python bench/context_parallel.py [--rounds 3] [--seqs 4096 8192 16384]
                                           # launches torchrun itself; about 15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from measure import Timing, check_load, emit_report, interleaved, main_or_worker, torchrun_rows

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
    before = _reset_peak(engine.device)
    start = time.perf_counter()
    engine.train_step(tokens, 1)
    seconds = time.perf_counter() - start
    peak = _peak(engine.device) - before
    engine.optimizer_step(1e-4)
    return {"activations": float(sum(saved.values())), "peak": float(peak), "seconds": seconds}


def _resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak(device) -> int:  # noqa: ANN001 - a torch.device
    """Start a new peak: the device's allocator peak on CUDA; on the CPU the process's resident
    high-water mark, reset to the current resident size (Linux's clear_refs 5). Returns the
    bytes in use now, which the step's growth is measured from."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return _resident_kib("VmRSS") * 1024


def _peak(device) -> int:  # noqa: ANN001 - a torch.device
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _resident_kib("VmHWM") * 1024


def worker(out: Path, *seqs: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rows = []
    for seq in map(int, seqs):
        mine = measure(seq)
        every: list[dict[str, float]] = [{}] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        rows.append((seq, {k: max(r[k] for r in every) for k in mine}))
    if dist.get_rank() == 0:
        out.write_text(repr(rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved launches per cp; the median counts")
    parser.add_argument("--seqs", type=int, nargs="+", default=list(SEQS), help="sequence lengths")
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args()
    machine_load = check_load()
    # The ranks' large blocks come from mmap and go back on free (a fixed threshold, which turns
    # off glibc's rising one), so the resident high-water mark follows the live tensors instead
    # of the free lists an earlier step left mapped.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    launches: dict[int, list[dict]] = {cp: [] for cp in CPS}

    def launch(cp: int) -> None:
        launches[cp].append(dict(torchrun_rows(__file__, cp, *map(str, args.seqs))))

    interleaved({str(cp): (lambda cp=cp: launch(cp)) for cp in CPS}, args.rounds)
    activations = {cp: launches[cp][0] for cp in CPS}
    for cp in CPS:
        for seq in args.seqs:
            assert {r[seq]["activations"] for r in launches[cp]} == {activations[cp][seq]["activations"]}, (cp, seq)
    steps = {(cp, seq): Timing([r[seq]["seconds"] for r in launches[cp]]) for cp in CPS for seq in args.seqs}
    peaks = {(cp, seq): Timing([r[seq]["peak"] for r in launches[cp]]) for cp in CPS for seq in args.seqs}
    lines = [
        machine_load,
        "Context parallelism (ring attention, load-balanced causal split), CPU gloo: activation memory per",
        "rank (bytes autograd saves for backward in one step's forward, parameters excluded; the most loaded",
        "rank) and step time (forward + backward, slowest rank; the median of the rounds), tiny llama: 2 layers,",
        "hidden 64, 4 heads (2 key/value heads), vocab 512, batch 1. MB = 1e6 bytes. ratio = measured /",
        f"(cp=1 measured / cp). {args.rounds} rounds, the cp launches interleaved. peak MB: the memory the",
        "step itself adds at its peak, measured (the most loaded rank, the median of the rounds): the",
        "device allocator's peak on CUDA; on the CPU the growth of the process's resident high-water",
        "mark over the step (reset to the resident size before it; blocks over 128 KiB are mapped",
        "and unmapped as tensors come and go), so transient buffers, gradients and the ring's blocks",
        "in flight count too.",
        "",
        f"{'seq':>6} {'cp':>3} {'act MB':>9} {'ideal MB':>9} {'ratio':>6} "
        f"{'peak MB':>9} {'ratio':>6} {'step s':>8} {'spread':>7} {'speedup':>7}",
    ]
    for seq in args.seqs:
        base, base_peak = activations[1][seq]["activations"], peaks[(1, seq)].median
        for cp in CPS:
            measured, ideal, step = activations[cp][seq]["activations"], base / cp, steps[(cp, seq)]
            peak = peaks[(cp, seq)].median
            lines.append(
                f"{seq:>6} {cp:>3} {measured / 1e6:9.2f} {ideal / 1e6:9.2f} {measured / ideal:6.3f} "
                f"{peak / 1e6:9.2f} {peak / (base_peak / cp):6.3f} "
                f"{step.median:8.2f} {step.spread:7.0%} {steps[(1, seq)].median / step.median:7.2f}"
            )
    lines += [
        "",
        f"Machine: {os.cpu_count()} CPU cores. Step times are indicative only: one thread per rank, cp ranks",
        "beyond the core count time-share them, and other jobs on a loaded machine add noise. speedup = the",
        "cp=1 median step time / this row's; spread = (slowest - fastest) / median of the row's rounds.",
        check_load("after the run"),
    ]
    emit_report(lines, args.out)


if __name__ == "__main__":
    main_or_worker(main, worker)
