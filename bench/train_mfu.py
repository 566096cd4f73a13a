"""Training throughput on one GPU: tokens/s/GPU, MFU and peak memory of tokenmill's own training
step, side by side with torchtitan training the same shape, batch, sequence length and precision.

    python bench/train_mfu.py [--shapes 1b,3b] [--modes bf16-compile,float8-compile,bf16]
        [--steps 10] [--warmup 3] [--batch N] [--seq-len 2048] [--time-budget 240]
        [--no-torchtitan] [--peak-tflops T] [--out FILE]
    python bench/train_mfu.py --smoke          # the whole script on the CPU, tiny shape

`--smoke` runs every code path but compilation (eager bf16 and float8, ours and torchtitan) in
seconds on the CPU; `--smoke --modes bf16-compile,float8-compile` adds it (minutes on 2 cores).

Shapes: `1b` is Llama 3.2 1B (tokenmill's `llama-1b` preset), `3b` Llama 3.2 3B (`llama-3b`),
both with tied embeddings and the 128256-token vocabulary. Modes: `bf16` (autocast, fp32 master
weights), `bf16-compile` (+ torch.compile), `float8-compile` (+ torchao Float8Linear with
tensorwise scaling on the block Linear layers, the head and embeddings left in bf16); `float8`
(eager) is accepted too.

Ours is the engine `tokenmill train` builds (`tokenmill.train.loop.build_engine` on a TrainConfig
as the trainer makes it) stepped as the loop steps it: `train_step`, `clip_grad_norm(1.0)`,
`optimizer_step`. torchtitan (0.2.2: 0.3.0 needs a newer torch than 2.11) is its own llama3
`Transformer` built from `TransformerModelArgs` of the same shape, converted by its own float8
converter (output head filtered, as its float8 recipes do), parallelized by its own
`parallelize_llama` (per-block compile; no FSDP on one GPU: its single-device path then uses
autocast, as ours), its compiled loss, fused AdamW with the same hyperparameters and the same
clip; its head is tied to the embedding as Llama 3.2's is. Both are timed by the same loop on
random tokens: `--warmup` steps (compilation) then `--steps` steps between
`torch.cuda.synchronize()` calls; each step reads the loss back (`.item()`), as both trainers do.
MFU uses tokenmill's FLOP count (`tokenmill.train.flops`) for both, so ours/torchtitan is the
ratio of tokens/s, and the dense bf16 peak of the device (989 TFLOP/s on H100 and H200), doubled
for float8 rows.

Sizing of the default GPU run (about 4 minutes on an H100): a row costs building and
initializing the model (1B: ~10 s, 3B: ~25 s), compiling 16-28 blocks (~30-60 s) during the
3 warm-up steps, and 10 timed steps (1B at batch 4 x 2048 tokens: ~6e13 FLOPs a step, ~0.15 s at
40% MFU; 3B at batch 2: ~0.2 s): about a minute for a 1B row, two for a 3B one (our model is
initialized on the CPU). Rows run in order of importance, ours then torchtitan for each: 1B
bf16+compile, 1B float8+compile, 3B bf16+compile, 3B float8+compile, then eager bf16. Batches
(1B: 4, 3B: 2) keep fp32 weights + AdamW (16 bytes a parameter: 20 GB / 51 GB) and activations
without checkpointing inside 80 GB. Each row is printed, flushed, as soon as it is done; once
`--time-budget` seconds (default 240) have passed the remaining rows are skipped (and listed);
the budget is checked before each row, so the run ends at most one row (1-2 minutes) after it. A row that fails (out of memory, float8 unsupported)
prints its error in one line and the next row runs.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import check_load  # noqa: E402
from tokenmill.train.config import TrainConfig  # noqa: E402
from tokenmill.train.loop import build_engine, seed_everything  # noqa: E402
from tokenmill.train.metrics import peak_flops  # noqa: E402
from tokenmill.train.model_config import ModelConfig, preset  # noqa: E402

MODES = ("bf16-compile", "float8-compile", "bf16", "float8")
SHAPES = {"1b": "llama-1b", "3b": "llama-3b", "tiny": ""}  # tiny: the smoke shape
DEFAULT_BATCH = {"1b": 4, "3b": 2, "tiny": 2}
LR, BETAS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 0.1, 1.0


def smoke_model() -> ModelConfig:
    """A tiny llama whose every block Linear is a multiple of 16 (so float8 converts them)."""
    return preset("tiny-llama", vocab_size=512, n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=192)


@dataclass
class Row:
    shape: str
    mode: str
    impl: str  # "ours" | "torchtitan"
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    step_ms: float | None = None
    loss: float | None = None
    error: str | None = None
    profile: list[str] | None = None

    def line(self) -> str:
        head = f"{self.shape:>5} {self.mode:<15} {self.impl:<10}"
        if self.error:
            return f"{head} FAILED: {self.error}"
        mfu = f"{100 * self.mfu:6.1f}%" if self.mfu is not None else "      -"
        mem = f"{self.peak_mem_gib:7.1f}" if self.peak_mem_gib is not None else "      -"
        return f"{head} {self.tokens_per_s:12,.0f} {mfu} {mem} {self.step_ms:9.1f} {self.loss:8.3f}"


HEADER = (
    f"{'shape':>5} {'mode':<15} {'impl':<10} {'tokens/s/GPU':>12} {'MFU':>7} {'mem GiB':>7} {'step ms':>9} {'loss':>8}"
)


def train_config(model: ModelConfig, mode: str, batch: int, seq_len: int, device: str, steps: int) -> TrainConfig:
    """The TrainConfig `tokenmill train` would build for this run (dataset unused: tokens are random)."""
    return TrainConfig(
        model=model,
        out="unused",
        dataset={"path": "synthetic", "seq_len": seq_len},
        schedule={"steps": steps, "global_batch_size": batch, "micro_batch_size": batch, "warmup_steps": 1},
        optimizer={"lr": LR, "min_lr": LR / 10, "weight_decay": WEIGHT_DECAY, "clip_grad": CLIP},
        parallel={
            "device": device,
            "precision": "bf16",
            "compile": mode.endswith("-compile"),
            "float8": mode.startswith("float8"),
        },
        logging={"tensorboard": False, "progress": False},
    ).validate()


def ours_step(model: ModelConfig, mode: str, batch: int, seq_len: int, device: torch.device, steps: int) -> Callable:
    """tokenmill's engine, built as the trainer builds it, and one step as the loop runs it."""
    cfg = train_config(model, mode, batch, seq_len, device.type, steps)
    seed_everything(cfg.schedule.seed)
    engine = build_engine(cfg)

    def step(tokens: torch.Tensor) -> float:
        loss = engine.train_step(tokens, batch)
        engine.clip_grad_norm(CLIP)
        engine.optimizer_step(LR)
        return loss

    return step


def torchtitan_step(
    model: ModelConfig, mode: str, batch: int, seq_len: int, device: torch.device, steps: int
) -> Callable:
    """torchtitan's llama3 of the same shape, through its own converter, parallelize and loss."""
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import maybe_enable_amp
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs, parallelize_llama

    job = JobConfig()
    job.training.seq_len = seq_len
    job.training.local_batch_size = batch
    job.training.mixed_precision_param = "bfloat16"
    job.compile.enable = mode.endswith("-compile")
    job.compile.components = ["model", "loss"]
    job.activation_checkpoint.mode = "none"
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    # Its SwiGLU width is multiple_of * ceil(multiplier * int(8 * dim / 3) / multiple_of): pick
    # the two so that it is exactly ours.
    base = int(2 * 4 * model.hidden / 3)
    args = TransformerModelArgs(
        dim=model.hidden,
        n_layers=model.n_layers,
        n_heads=model.n_heads,
        n_kv_heads=model.n_kv_heads,
        vocab_size=model.vocab_size,
        multiple_of=model.ffn_hidden,
        ffn_dim_multiplier=model.ffn_hidden / base,
        norm_eps=model.norm_eps,
        rope_theta=model.rope_theta,
        max_seq_len=seq_len,
    )
    args.update_from_config(job)
    with torch.device("meta"):
        net = Transformer(args)
    assert net.layers["0"].feed_forward.w1.out_features == model.ffn_hidden
    if mode.startswith("float8"):
        from torchtitan.components.quantization.float8 import Float8LinearConverter

        job.model.converters = ["float8"]
        job.quantize.linear.float8.filter_fqns = ["output"]
        # Off an H100-class GPU its converter refuses float8 unless emulated (eager only).
        job.quantize.linear.float8.emulate = device.type != "cuda" and not job.compile.enable
        Float8LinearConverter(job, dims).convert(net)
    parallelize_llama(net, dims, job)
    net.to_empty(device=device)
    with torch.no_grad():
        net.init_weights(buffer_device=device)
    if model.tie_embeddings:
        # Its embedding is drawn with std 1 (an untied head has its own small init): a tied head
        # would give logits ~sqrt(dim) and a loss in the hundreds, so draw the shared weight as
        # ours is drawn.
        net.output.weight = net.tok_embeddings.weight
        with torch.no_grad():
            torch.nn.init.normal_(net.tok_embeddings.weight, std=model.init_std)
    net.train()
    params = [p for p in net.parameters()]
    optimizer = torch.optim.AdamW(
        params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True if device.type == "cuda" else None
    )
    loss_fn = build_cross_entropy_loss(job)

    def step(tokens: torch.Tensor) -> float:
        tokens = tokens.to(device, non_blocking=True)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        with maybe_enable_amp(dims, job.training.mixed_precision_param, device.type):
            logits = net(inputs)
            loss = loss_fn(logits, labels) / labels.numel()  # its loss is a sum over tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


BUILDERS = {"ours": ours_step, "torchtitan": torchtitan_step}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(row: Row, model: ModelConfig, args: argparse.Namespace, device: torch.device, batch: int) -> None:
    """Build one trainer, warm it up, time `args.steps` steps; fill `row` (or its error)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    generator = torch.Generator().manual_seed(1234)
    tokens = [torch.randint(0, model.vocab_size, (batch, args.seq_len + 1), generator=generator) for _ in range(2)]
    step = BUILDERS[row.impl](model, row.mode, batch, args.seq_len, device, args.warmup + args.steps)
    for i in range(args.warmup):
        step(tokens[i % 2])
    sync(device)
    start = time.perf_counter()
    for i in range(args.steps):
        row.loss = step(tokens[i % 2])
    sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    row.step_ms = 1000 * seconds
    row.tokens_per_s = batch * args.seq_len / seconds
    float8 = row.mode.startswith("float8")
    # --peak-tflops is the bf16 peak (doubled for float8 rows); else the trainer's table of devices.
    peak = args.peak_tflops * 1e12 * (2 if float8 else 1) if args.peak_tflops else peak_flops(device, None, float8)
    if peak is not None:
        row.mfu = row.tokens_per_s * model.flops_per_token(args.seq_len) / peak
    if device.type == "cuda":
        row.peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
    if args.profile:
        row.profile = top_kernels(step, tokens[0], device, args.profile)


def top_kernels(step: Callable, tokens: torch.Tensor, device: torch.device, count: int) -> list[str]:
    """The `count` kernels (operators on the CPU) taking the most device time over two steps,
    with their share of it: what a shortfall against the peer is spent on."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(2):
            step(tokens)
        sync(device)
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attribute) > 0]
    total = sum(getattr(e, attribute) for e in events) or 1
    events.sort(key=lambda e: getattr(e, attribute), reverse=True)
    return [
        f"    {100 * getattr(e, attribute) / total:5.1f}%  {getattr(e, attribute) / 2e3:8.2f} ms/step  {e.count // 2:>5}x  {e.key[:110]}"
        for e in events[:count]
    ]


def release(device: torch.device) -> None:
    """Free one row's model, optimizer and compiled graphs before the next row."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(shape, mode) in order of importance: the compiled modes (the fast ones) shape by shape,
    then the eager ones; within each, in the order given."""
    compiled = [m for m in args.modes if m.endswith("-compile")]
    eager = [m for m in args.modes if m not in compiled]
    return [(shape, mode) for group in (compiled, eager) for shape in args.shapes for mode in group]


def run_rows(args: argparse.Namespace, device: torch.device, emit: Callable[[str], None]) -> list[Row]:
    impls = ["ours"] if args.no_torchtitan else ["ours", "torchtitan"]
    rows: list[Row] = []
    start = time.perf_counter()
    todo = [(shape, mode, impl) for shape, mode in plan(args) for impl in impls]
    for index, (shape, mode, impl) in enumerate(todo):
        elapsed = time.perf_counter() - start
        if args.time_budget and elapsed > args.time_budget:
            left = ", ".join(f"{s} {m} {i}" for s, m, i in todo[index:])
            emit(f"time budget of {args.time_budget:.0f} s spent ({elapsed:.0f} s): skipped {left}")
            break
        model = smoke_model() if shape == "tiny" else preset(SHAPES[shape], max_seq_len=args.seq_len)
        batch = args.batch or DEFAULT_BATCH[shape]
        row = Row(shape, mode, impl)
        try:
            measure(row, model, args, device, batch)
        except Exception as error:  # one failing row (OOM, float8 unsupported) must not end the run
            row.error = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        release(device)
        rows.append(row)
        emit(row.line())
        for line in row.profile or []:
            emit(line)
        ours = next((r for r in rows if (r.shape, r.mode, r.impl) == (shape, mode, "ours")), None)
        if impl == "torchtitan" and ours and ours.tokens_per_s and row.tokens_per_s:
            emit(f"{shape:>5} {mode:<15} ours/torchtitan = {ours.tokens_per_s / row.tokens_per_s:.3f}")
    return rows


def summary(rows: list[Row]) -> list[str]:
    """The closing table: one line per (shape, mode), ours beside torchtitan."""
    lines = [f"{'shape':>5} {'mode':<15} {'ours tok/s':>11} {'MFU':>6} {'titan tok/s':>11} {'MFU':>6} {'ratio':>6}"]
    seen: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        seen.setdefault((r.shape, r.mode), {})[r.impl] = r

    def cell(r: Row | None) -> str:
        if r is None or r.tokens_per_s is None:
            return f"{'failed' if r else '-':>11} {'-':>6}"
        return (
            f"{r.tokens_per_s:11,.0f} {100 * r.mfu:5.1f}%" if r.mfu is not None else f"{r.tokens_per_s:11,.0f} {'-':>6}"
        )

    for (shape, mode), pair in seen.items():
        ours, titan = pair.get("ours"), pair.get("torchtitan")
        ok = ours and titan and ours.tokens_per_s and titan.tokens_per_s
        ratio = f"{ours.tokens_per_s / titan.tokens_per_s:6.3f}" if ok else f"{'-':>6}"  # type: ignore[union-attr]
        lines.append(f"{shape:>5} {mode:<15} {cell(ours)} {cell(titan)} {ratio}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, few steps: checks the script runs")
    p.add_argument("--shapes", default=None, help="comma list of 1b, 3b, tiny (default 1b,3b; smoke: tiny)")
    p.add_argument(
        "--modes",
        default=None,
        help=f"comma list of {', '.join(MODES)} (default: the first three; smoke: bf16,float8)",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default 10; smoke 2)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first, compilation included (default 3; smoke 1)"
    )
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 1b: 4, 3b: 2; smoke 2)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; smoke 64)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=240.0,
        help="seconds; rows that would start after it are skipped (0: no limit)",
    )
    p.add_argument("--no-torchtitan", action="store_true", help="ours only")
    p.add_argument(
        "--profile", type=int, default=0, metavar="N", help="after each row, its N costliest kernels over two steps"
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak for MFU on an unknown device")
    p.add_argument("--device", default=None, help="default cuda (smoke: cpu)")
    p.add_argument("--out", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    args.shapes = (args.shapes or ("tiny" if args.smoke else "1b,3b")).split(",")
    # Compiling on the CPU takes minutes on a small machine: the smoke run's default is eager.
    args.modes = (args.modes or ("bf16,float8" if args.smoke else ",".join(MODES[:3]))).split(",")
    for name, values, known in (("--shapes", args.shapes, SHAPES), ("--modes", args.modes, MODES)):
        bad = [v for v in values if v not in known]
        if bad:
            p.error(f"{name}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    smoke = args.smoke
    args.steps = args.steps or (2 if smoke else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 3)
    args.seq_len = args.seq_len or (64 if smoke else 2048)
    args.device = args.device or ("cpu" if smoke else "cuda")
    return args


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("tokenmill: error: --device cuda but no GPU is visible (use --smoke on the CPU)")
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    command = sys.argv[1:] if argv is None else argv
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out: list[str] = [
        f"# bench/train_mfu.py on {name}, torch {torch.__version__}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        f"# command: {shlex.join([sys.executable, 'bench/train_mfu.py', *command])}",
        f"# seq_len {args.seq_len}, warm-up {args.warmup} + {args.steps} timed steps per row",
        f"# {check_load()}",
        HEADER,
    ]
    for line in out:
        print(line, flush=True)

    def emit(line: str) -> None:
        print(line, flush=True)
        out.append(line)

    rows = run_rows(args, device, emit)
    table = summary(rows)
    for line in ["", *table]:
        emit(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(out) + "\n")
    return rows


if __name__ == "__main__":
    main()
