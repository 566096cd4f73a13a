"""Tokens/s per rank of each parallel layout on the CPU (gloo), and the pipeline bubble
measured against the schedule's theoretical (p-1)/(m+p-1) ((p-1)/(v*m+p-1) interleaved).

Measured bubble = 1 - busy / step time, where busy is the time this rank spends inside its
stages' forward and backward computations during the step (the rest is waiting for other
stages and point-to-point transfers); averaged over the ranks.

    python bench/parallel_throughput.py [--steps 4] [--rounds 3] [--layouts tp2 ...] [--device cpu|cuda]

On the CPU two processes share the machine's cores: tokens/s per rank compares layouts with
each other, not with a GPU. With --device cuda (one GPU) only the single-device layout runs.
The load is checked first; each round runs the single-device layout, then every layout in one
torchrun launch (each layout's step time: the median of its --steps steps), --rounds rounds;
each row is the median of its rounds with their spread, the bubble the median of its rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from measure import Timing, check_load, interleaved, torchrun_rows

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "parallel_throughput.txt"

GLOBAL_BATCH, MICRO_BATCH, SEQ = 16, 2, 128
LAYOUTS: dict[str, dict] = {
    "tp2": {"tp": 2},
    "tp2_sp": {"tp": 2, "sequence_parallel": True},
    "pp2_gpipe": {"pp": 2, "pp_schedule": "gpipe"},
    "pp2_1f1b": {"pp": 2, "pp_schedule": "1f1b"},
    "pp2_interleaved_v2": {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2},
    "dp2_zero0": {"dp": 2, "zero": 0},
    "dp2_zero1": {"dp": 2, "zero": 1},
    "dp2_zero2": {"dp": 2, "zero": 2},
    "dp2_zero3": {"dp": 2, "zero": 3},
}


def config(layout: dict, device: str = "cpu"):
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.model_config import ModelConfig

    model = ModelConfig("gpt2", 1024, 8, 256, 8, max_seq_len=SEQ)  # a small head: balanced stages
    return TrainConfig(
        model=model,
        dataset={"seq_len": SEQ},
        schedule={"global_batch_size": GLOBAL_BATCH, "micro_batch_size": MICRO_BATCH},
        parallel={"device": device, **layout},
        logging={"progress": False, "tensorboard": False},
    ).validate()


def time_stage_compute(engine) -> list[float]:
    """Wrap the pipeline stages' forward/backward chunk methods to add up the seconds this rank
    computes (the schedule receives and waits outside them): returns the running total."""
    busy = [0.0]
    for schedule in engine._schedules.values():
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        for stage in stages:
            for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                original = getattr(stage, method, None)
                if original is None:
                    continue

                def timed(*args, _original=original, **kwargs):
                    t0 = time.perf_counter()
                    try:
                        return _original(*args, **kwargs)
                    finally:
                        busy[0] += time.perf_counter() - t0

                setattr(stage, method, timed)
    return busy


def worker(out: Path, names: list[str], steps: int) -> None:
    import torch
    import torch.distributed as dist

    from tokenmill.train.engine import Engine

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {}
    for name in names:
        cfg = config(LAYOUTS[name] if name in LAYOUTS else {})
        torch.manual_seed(0)
        engine = Engine(cfg)
        local = GLOBAL_BATCH // engine.dp_size
        tokens = torch.randint(0, cfg.model.vocab_size, (local, SEQ + 1))
        times, bubbles = [], []
        busy = [0.0]
        for i in range(steps + 1):  # the first step warms up (shape inference, allocations)
            dist.barrier()
            t0 = time.perf_counter()
            busy[0] = 0.0
            # The pipeline part of the step: from the first send to the last backward.
            engine.train_step(tokens, MICRO_BATCH)
            t_pipe = time.perf_counter() - t0
            engine.clip_grad_norm(1.0)
            engine.optimizer_step(1e-4)
            times.append(time.perf_counter() - t0)
            if i == 0 and cfg.parallel.pp > 1:
                busy = time_stage_compute(engine)
            elif cfg.parallel.pp > 1:
                bubbles.append(1 - busy[0] / t_pipe)
        step = sorted(times[1:])[len(times[1:]) // 2]
        row = {"step_s": step}
        if cfg.parallel.pp > 1:
            n_micro = local // MICRO_BATCH
            row["bubble"] = sorted(bubbles)[len(bubbles) // 2]
            v = cfg.parallel.virtual_stages if cfg.parallel.pp_schedule == "interleaved" else 1
            row["bubble_theory"] = (cfg.parallel.pp - 1) / (v * n_micro + cfg.parallel.pp - 1)
            row["m"] = n_micro
        every: list[dict] = [{}] * dist.get_world_size()
        dist.all_gather_object(every, row)
        merged = dict(every[0])
        if "bubble" in merged:
            merged["bubble"] = sum(r["bubble"] for r in every) / len(every)
        results[name] = merged
    if dist.get_rank() == 0:
        out.write_text(repr(results))
    dist.destroy_process_group()


def single_device(steps: int, device: str) -> dict:
    import torch

    from tokenmill.train.engine import Engine
    from tokenmill.train.model import GPT

    torch.set_num_threads(1 if device == "cpu" else torch.get_num_threads())
    cfg = config({}, device)
    torch.manual_seed(0)
    engine = Engine(cfg, GPT(cfg.model), torch.device(device))
    tokens = torch.randint(0, cfg.model.vocab_size, (GLOBAL_BATCH, SEQ + 1))
    times = []
    for _ in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.train_step(tokens, MICRO_BATCH)
        engine.clip_grad_norm(1.0)
        engine.optimizer_step(1e-4)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step = sorted(times[1:])[len(times[1:]) // 2]
    return {"step_s": step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of every layout; the median counts")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    machine_load = check_load()
    single = "one (1 process, 1 thread)"
    rounds: dict[str, list[dict]] = {single: [], **{name: [] for name in args.layouts}}

    def parallel() -> None:
        for name, row in torchrun_rows(__file__, 2, str(args.steps), *args.layouts).items():
            rounds[name].append(row)

    contenders = {single: lambda: rounds[single].append(single_device(args.steps, args.device))}
    if args.device == "cpu":
        contenders["parallel layouts"] = parallel
    interleaved(contenders, args.rounds)
    lines = [
        machine_load,
        f"Parallel throughput on {args.device} (gpt2, 8 layers, hidden 256, vocab 1024, seq {SEQ}, global batch "
        f"{GLOBAL_BATCH}, micro-batch {MICRO_BATCH}; 1 thread per rank; a round's step time is the median of"
        f" {args.steps} steps; each row the median of {args.rounds} interleaved rounds)",
        "",
        f"{'layout':<28} {'step s':>8} {'spread':>7} {'tokens/s/rank':>14} {'m':>3} {'bubble':>8} {'theory':>8}",
    ]
    for name, done in rounds.items():
        if not done:
            continue
        step = Timing([r["step_s"] for r in done])
        world_size = 1 if name == single else 2
        r = done[0]
        if "bubble" in r:
            bubble = f"{statistics.median(x['bubble'] for x in done):8.1%} {r['bubble_theory']:8.1%}"
        else:
            bubble = f"{'':>8} {'':>8}"
        m = f"{r['m']:>3}" if "m" in r else "   "
        tokens = GLOBAL_BATCH * SEQ / step.median / world_size
        lines.append(f"{name:<28} {step.median:8.3f} {step.spread:7.0%} {tokens:14.0f} {m} {bubble}")
    lines += [
        "",
        "bubble = 1 - (time in the stages' forward/backward) / (pipeline step time), mean over ranks: it",
        "counts gloo point-to-point transfers and any stage imbalance as well as the schedule's idle slots,",
        "so it sits above the theory on a CPU; `theory` is (p-1)/(m+p-1), (p-1)/(v*m+p-1) interleaved.",
        "spread = (slowest - fastest) / median of the row's rounds.",
        check_load("after the run"),
    ]
    text = "\n".join(lines)
    print(text)
    target = RESULT if args.device == "cpu" else RESULT.with_name(f"parallel_throughput_{args.device}.txt")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), sys.argv[4:], int(sys.argv[3]))
    else:
        main()
