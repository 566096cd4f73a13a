"""Tokens/s of tokenmill's training loop against a plain nanoGPT-style loop, same model and batch.

    python bench/train_step.py [--steps 30] [--repeats 3] [--device cpu] [--preset NAME]

"Ours" is the full `tokenmill.train.loop.train` (Megatron sample index over a real-text shard,
ramp-up/LR schedule, gradient accumulation, clipping, metrics.jsonl); its tokens/s is
measured between logged steps after a warm-up, so dataset building and the final checkpoint
are not counted. "Plain" is the loop as nanoGPT writes it: the same GPT module and AdamW
groups, batches pre-built as tensors, `loss / accum; backward; clip; step; zero_grad`.
Each run is its own subprocess (so peak memory is per loop); runs alternate and the median
is reported. Prints the ratio ours / plain (aim: >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import check_load

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
WARMUP = 5


def make_shard(prefix: Path) -> None:
    """Byte-level tokens of real text (tinyshakespeare) in Megatron .bin/.idx form."""
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from conftest import text_documents, write_shard  # the test suite's shard writer

    write_shard(prefix, text_documents(SHARED / "corpus" / "tinyshakespeare.txt", max_bytes=1_100_000))


def bench_config(args, shard: Path, out: Path):
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.model_config import PRESETS, preset

    if args.layers:  # a small model of the preset's flavour
        model = preset(
            args.preset,
            vocab_size=512,
            max_seq_len=args.seq_len,
            n_layers=args.layers,
            hidden=args.hidden,
            n_heads=args.hidden // 64,
        )
    else:  # the preset's own shape (e.g. --preset llama-1b --layers 0 on a GPU)
        model = preset(args.preset, max_seq_len=max(args.seq_len, PRESETS[args.preset].max_seq_len))
    return TrainConfig(
        model=model,
        out=str(out),
        dataset={"path": str(shard), "seq_len": args.seq_len},
        schedule={
            "steps": WARMUP + args.steps,
            "global_batch_size": args.batch,
            "micro_batch_size": args.micro_batch,
            "warmup_steps": 2,
        },
        optimizer={"lr": 1e-3, "min_lr": 1e-4},
        parallel={"device": args.device, "precision": args.precision, "compile": args.compile},
        logging={"tensorboard": False, "progress": False, "interval": WARMUP},
        checkpoint={"keep_last": 1},
    ).validate()


def clocks() -> tuple[float, float]:
    """(wall, this process's CPU time): on a shared machine the CPU time is the stable one."""
    return time.perf_counter(), time.process_time()


def run_ours(args, shard: Path) -> dict:
    import torch

    from tokenmill.train.engine import Engine
    from tokenmill.train.loop import train
    from tokenmill.train.metrics import peak_memory_bytes
    from tokenmill.train.model import GPT

    marks: list[tuple[float, float]] = []

    class Timed(Engine):
        """Marks the clocks at each step's start and after the last optimizer step, so the
        window holds everything the loop does between steps (data, schedule, logging)."""

        def forward_backward(self, tokens, micro_batch_size):
            marks.append(clocks())
            return super().forward_backward(tokens, micro_batch_size)

        def optimizer_step(self, lr):
            super().optimizer_step(lr)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.last = clocks()

    with tempfile.TemporaryDirectory() as out:
        cfg = bench_config(args, shard, Path(out))
        cfg.logging.interval = 1  # every step logged: the logging cost is counted
        torch.manual_seed(cfg.schedule.seed)
        engine = Timed(cfg, GPT(cfg.model))
        result = train(cfg, engine=engine)
    start, end = marks[WARMUP], engine.last
    tokens = args.steps * cfg.schedule.global_batch_size * cfg.sequence_length
    return {
        "tokens_per_s": tokens / (end[0] - start[0]),
        "cpu_tokens_per_s": tokens / (end[1] - start[1]),
        "peak_bytes": peak_memory_bytes(engine.device),
        "final_loss": result.losses[cfg.schedule.steps],
    }


def run_plain(args, shard: Path) -> dict:
    import torch
    import torch.nn.functional as F

    from tokenmill.tokenize.loader import SampleStream, build_dataset
    from tokenmill.train.metrics import peak_memory_bytes
    from tokenmill.train.model import GPT

    with tempfile.TemporaryDirectory() as out:
        cfg = bench_config(args, shard, Path(out))
    device = torch.device(
        cfg.parallel.device if cfg.parallel.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    torch.manual_seed(cfg.schedule.seed)
    model = GPT(cfg.model).to(device)
    forward = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        fused=device.type == "cuda" or None,
    )
    dataset = build_dataset(
        str(shard),
        seq_len=cfg.sequence_length,
        num_samples=cfg.schedule.steps * cfg.schedule.global_batch_size,
        seed=cfg.schedule.seed,
    )
    stream = SampleStream(dataset, dp_rank=0, dp_size=1)
    batches = [stream.next_global_batch(cfg.schedule.global_batch_size).to(device) for _ in range(cfg.schedule.steps)]
    accum = cfg.schedule.global_batch_size // cfg.local_micro_batch_size
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.parallel.precision == "bf16")
    start = clocks()
    for step, batch in enumerate(batches):
        if step == WARMUP:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = clocks()
        total = 0.0
        for micro in batch.split(cfg.local_micro_batch_size):
            x, y = micro[:, :-1], micro[:, 1:]
            with autocast:
                logits = forward(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)) / accum
            loss.backward()
            total += loss.item()  # nanoGPT reads the loss every step too
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    end = clocks()
    tokens = (len(batches) - WARMUP) * cfg.schedule.global_batch_size * cfg.sequence_length
    return {
        "tokens_per_s": tokens / (end[0] - start[0]),
        "cpu_tokens_per_s": tokens / (end[1] - start[1]),
        "peak_bytes": peak_memory_bytes(device),
        "final_loss": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after 5 warm-up steps)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=4, help="0: the preset's own shape")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (both loops)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (the machine is shared)")
    parser.add_argument("--which", choices=["ours", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--shard", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.which:  # a child run
        import torch

        torch.set_num_threads(args.threads)
        result = (run_ours if args.which == "ours" else run_plain)(args, Path(args.shard))
        print(json.dumps(result))
        return
    check_load()

    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shakespeare"
        make_shard(shard)
        results: dict[str, list[dict]] = {"ours": [], "plain": []}
        child = [a for a in sys.argv[1:]]
        for repeat in range(args.repeats):
            # Alternate the order too, so a load change on a shared machine hits both alike.
            for which in ("plain", "ours") if repeat % 2 == 0 else ("ours", "plain"):
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
                done = subprocess.run(
                    [sys.executable, __file__, *child, "--which", which, "--shard", str(shard)],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if done.returncode:
                    sys.exit(done.stderr)
                results[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"model: {args.preset} layers={args.layers} hidden={args.hidden} seq={args.seq_len} "
        f"batch={args.batch} micro={args.micro_batch} {args.precision} on {args.device}, {args.threads} thread(s), "
        f"{args.steps} timed steps x {args.repeats} alternating runs"
    )
    ratios = {}
    for metric, label in (("tokens_per_s", "wall-clock"), ("cpu_tokens_per_s", "process CPU time")):
        print(f"-- {label} tokens/s (median of runs)")
        medians = {}
        for key, name in (("plain", "plain (nanoGPT-style)"), ("ours", "tokenmill loop")):
            medians[key] = statistics.median(r[metric] for r in results[key])
            runs = ", ".join(f"{r[metric]:.0f}" for r in results[key])
            peak = max(r["peak_bytes"] for r in results[key]) / 2**20
            print(f"{name:22s} {medians[key]:9.0f}  (runs: {runs})  peak memory {peak:.0f} MiB")
        ratios[label] = medians["ours"] / medians["plain"]
    for label, ratio in ratios.items():
        print(f"ratio ours / plain ({label}): {ratio:.3f}  (aim >= 0.95)")


if __name__ == "__main__":
    main()
