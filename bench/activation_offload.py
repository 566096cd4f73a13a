"""Device memory and step time of training with and without activation offload
(`parallel.activation_offload`: what each transformer block saves for the backward pass waits in
host memory), at a long sequence where the activations dominate.

    python bench/activation_offload.py [--shape 1b] [--seq-len 8192] [--batch 1] [--steps 3]
        [--repeat 2] [--out FILE]
    python bench/activation_offload.py --smoke     # the same code path on the CPU, tiny shape

Both rows are tokenmill's engine as `tokenmill train` builds it (bf16, eager), stepped as the loop
steps it, on random tokens; `--repeat` rounds, off and on alternating, each round a fresh engine:
one warm-up step, then `--steps` timed steps. On CUDA each row reports the device's peak
allocated memory over its steps (`torch.cuda.max_memory_allocated`, reset after the engine is
built, so the weights and optimizer state count and the build's transients do not); on the CPU
there is no device memory to measure, and the rows show the step time and how many saved
tensors went through host memory.

Sizing on an H100 (1B, 8192 tokens, batch 1), estimated, not yet measured: building a 1B engine
takes ~10 s (as in bench/train_mfu.py); a step well under a second without offload; with it,
the activations (of the order of 10 GB a step at this shape) cross PCIe each way. Two rounds of
both rows: about a minute.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import Timing, check_load, emit_report  # noqa: E402
from bench.train_mfu import CLIP, LR, SHAPES, smoke_model, train_config  # noqa: E402
from tokenmill.train.loop import build_engine, seed_everything  # noqa: E402
from tokenmill.train.model_config import ModelConfig, preset  # noqa: E402


def one_round(model: ModelConfig, offload: bool, args: argparse.Namespace, device: torch.device) -> dict:
    """A fresh engine's timed steps: their seconds, the device's peak memory, the offloaded count."""
    cfg = train_config(model, "bf16", args.batch, args.seq_len, device.type, args.steps + 1, activation_offload=offload)
    seed_everything(cfg.schedule.seed)
    engine = build_engine(cfg)
    tokens = torch.randint(0, model.vocab_size, (args.batch, args.seq_len + 1), device=device)

    def step() -> float:
        loss = engine.train_step(tokens, args.batch)
        engine.clip_grad_norm(CLIP)
        engine.optimizer_step(LR)
        return loss

    loss = step()  # warm-up: kernels chosen, optimizer state allocated
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        seconds.append(time.perf_counter() - start)  # step() reads the loss back: synchronized
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    moved = sum(getattr(block, "offloaded_tensors", 0) for part in engine.model_parts for block in part.layers.values())
    return {"seconds": seconds, "peak_gib": peak, "offloaded": moved, "loss": loss}


def free_device_memory(device: torch.device) -> None:
    """The last round's engine gone before the next is built: peaks of one row only."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[s for s in SHAPES if s != "tiny"], default="1b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round, after one warm-up step")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of both rows, alternating")
    parser.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU, 64 tokens")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.smoke:
        model, device, args.seq_len = smoke_model(), torch.device("cpu"), 64
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = preset(SHAPES[args.shape], max_seq_len=args.seq_len)
    lines = [
        check_load(),
        f"activation offload: {'smoke' if args.smoke else args.shape}, {args.batch} x {args.seq_len} tokens, bf16 eager, device {device}",
    ]
    rows: dict[bool, list[dict]] = {False: [], True: []}
    for round_index in range(args.repeat):
        for offload in (False, True) if round_index % 2 == 0 else (True, False):
            rows[offload].append(one_round(model, offload, args, device))
            free_device_memory(device)
    lines.append(
        f"{'offload':<8} {'peak GiB':>9} {'step ms':>9} {'spread':>6} {'tokens/s':>10} {'offloaded':>9} {'loss':>7}"
    )
    for offload, rounds in rows.items():
        timing = Timing([s for r in rounds for s in r["seconds"]])
        peaks = [r["peak_gib"] for r in rounds if r["peak_gib"] is not None]
        peak = f"{max(peaks):9.2f}" if peaks else f"{'-':>9}"
        lines.append(
            f"{'on' if offload else 'off':<8} {peak} {1000 * timing.median:9.1f} {timing.spread:6.0%}"
            f" {args.batch * args.seq_len / timing.median:10,.0f} {rounds[-1]['offloaded']:9d} {rounds[-1]['loss']:7.3f}"
        )
    if device.type != "cuda":
        lines.append("(no CUDA device: peak device memory not measured)")
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
