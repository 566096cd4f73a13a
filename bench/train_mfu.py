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
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import Timing, check_load, interleaved  # noqa: E402
from tokenmill.train.config import TrainConfig  # noqa: E402
from tokenmill.train.loop import build_engine, seed_everything  # noqa: E402
from tokenmill.train.metrics import peak_flops  # noqa: E402
from tokenmill.train.model_config import ModelConfig, preset  # noqa: E402

MODES = ("bf16-compile", "float8-compile", "bf16", "float8")
SHAPES = {"1b": "llama-1b", "3b": "llama-3b", "tiny": ""}  # tiny: the smoke shape
DEFAULT_BATCH = {"1b": 4, "3b": 2, "tiny": 2}
LR, BETAS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 0.1, 1.0
EOD_ID = 0  # --document-masking: the end-of-document token, planted in the random rows (drawn from 1..V-1)


def smoke_model() -> ModelConfig:
    """A tiny llama whose every block Linear is a multiple of 16 (so float8 converts them)."""
    return preset("tiny-llama", vocab_size=512, n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=192)


@dataclass
class Row:
    """One (shape, mode, impl): the step seconds of each of its rounds (the median counts)."""

    shape: str
    mode: str
    impl: str  # "ours" | "torchtitan"
    tokens_per_step: int = 0
    seconds: list[float] = field(default_factory=list)
    flops_per_token: float = 0.0  # the head's matmul counted
    flops_per_token_titan: float = 0.0  # torchtitan's convention: a tied head's left out
    peak: float | None = None  # the device's peak FLOP/s for this mode
    peak_mem_gib: float | None = None
    loss: float | None = None
    error: str | None = None
    profile: list[str] | None = None

    @property
    def timing(self) -> Timing | None:
        return Timing(self.seconds) if self.seconds else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens_per_step / self.timing.median if self.timing else None

    def mfu(self, titan_convention: bool = False) -> float | None:
        if self.tokens_per_s is None or self.peak is None:
            return None
        return (
            self.tokens_per_s * (self.flops_per_token_titan if titan_convention else self.flops_per_token) / self.peak
        )

    def line(self) -> str:
        head = f"{self.shape:>5} {self.mode:<15} {self.impl:<10}"
        if self.timing is None:
            return f"{head} FAILED: {self.error}"
        mfus = [self.mfu(), self.mfu(titan_convention=True)]
        mfu = " ".join(f"{100 * m:6.1f}%" if m is not None else "      -" for m in mfus)
        mem = f"{self.peak_mem_gib:7.1f}" if self.peak_mem_gib is not None else "      -"
        timing = self.timing
        line = f"{head} {self.tokens_per_s:12,.0f} {mfu} {mem} {1000 * timing.median:9.1f} {timing.spread:6.0%}"
        line += f" {len(timing.seconds):>4} {self.loss:8.3f}"
        return line + (f" (a later round FAILED: {self.error})" if self.error else "")


HEADER = (
    f"{'shape':>5} {'mode':<15} {'impl':<10} {'tokens/s/GPU':>12} {'MFU':>7} {'MFU-tt':>7} {'mem GiB':>7}"
    f" {'step ms':>9} {'spread':>6} {'runs':>4} {'loss':>8}"
)


def train_config(
    model: ModelConfig,
    mode: str,
    batch: int,
    seq_len: int,
    device: str,
    steps: int,
    documents: bool = False,
    activation_offload: bool = False,
) -> TrainConfig:
    """The TrainConfig `tokenmill train` would build for this run (dataset unused: tokens are random)."""
    masking = {"document_masking": True, "eod_id": EOD_ID} if documents else {}
    return TrainConfig(
        model=model,
        out="unused",
        dataset={"path": "synthetic", "seq_len": seq_len, **masking},
        schedule={"steps": steps, "global_batch_size": batch, "micro_batch_size": batch, "warmup_steps": 1},
        optimizer={"lr": LR, "min_lr": LR / 10, "weight_decay": WEIGHT_DECAY, "clip_grad": CLIP},
        parallel={
            "device": device,
            "precision": "bf16",
            "compile": mode.endswith("-compile"),
            "float8": mode.startswith("float8"),
            "activation_offload": activation_offload,
        },
        logging={"tensorboard": False, "progress": False},
    ).validate()


def ours_step(
    model: ModelConfig, mode: str, batch: int, seq_len: int, device: torch.device, steps: int, documents: bool
) -> Callable:
    """tokenmill's engine, built as the trainer builds it, and one step as the loop runs it."""
    cfg = train_config(model, mode, batch, seq_len, device.type, steps, documents)
    seed_everything(cfg.schedule.seed)
    engine = build_engine(cfg)

    def step(tokens: torch.Tensor) -> float:
        loss = engine.train_step(tokens, batch)
        engine.clip_grad_norm(CLIP)
        engine.optimizer_step(LR)
        return loss

    return step


def torchtitan_step(
    model: ModelConfig, mode: str, batch: int, seq_len: int, device: torch.device, steps: int, documents: bool
) -> Callable:
    """torchtitan's llama3 of the same shape, through its own converter, parallelize and loss;
    `documents`: its flex attention with a block-causal mask at EOD_ID."""
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
        **({"use_flex_attn": True, "attn_mask_type": "block_causal"} if documents else {}),
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
            logits = net(inputs, **torchtitan_masks(net, inputs)) if documents else net(inputs)
            loss = loss_fn(logits, labels) / labels.numel()  # its loss is a sum over tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def torchtitan_masks(net: torch.nn.Module, inputs: torch.Tensor) -> dict:
    """The block-causal masks of torchtitan's flex attention for rows ending documents at
    EOD_ID, as its trainer builds them (from its tokenizer's eos_id): `get_attention_masks`
    (0.2) or the older `init_attention_mask`, which keeps them in its attention modules."""

    class EodTokenizer:
        eos_id = EOD_ID

    if hasattr(net, "get_attention_masks"):
        return {"attention_masks": net.get_attention_masks(inputs, EodTokenizer())}
    from torchtitan.models.attention import init_attention_mask

    init_attention_mask(inputs, EOD_ID)
    return {}


def sample_rows(vocab: int, batch: int, seq_len: int, generator: torch.Generator, documents: bool) -> torch.Tensor:
    """Random rows [batch, seq_len + 1]; `documents`: EOD_ID after documents of seq_len/8 to
    seq_len/2 tokens (EOD_ID nowhere else)."""
    rows = torch.randint(1, vocab, (batch, seq_len + 1), generator=generator)
    if documents:
        low, high = max(1, seq_len // 8), max(2, seq_len // 2)
        for row in rows:
            end = int(torch.randint(low, high, (), generator=generator))
            while end <= seq_len:
                row[end] = EOD_ID
                end += 1 + int(torch.randint(low, high, (), generator=generator))
    return rows


BUILDERS = {"ours": ours_step, "torchtitan": torchtitan_step}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(row: Row, model: ModelConfig, args: argparse.Namespace, device: torch.device, batch: int) -> None:
    """One round: build one trainer, warm it up, time `args.steps` steps; add the seconds of a
    step to `row` (the profile on its last round)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    generator = torch.Generator().manual_seed(1234)
    tokens = [sample_rows(model.vocab_size, batch, args.seq_len, generator, args.document_masking) for _ in range(2)]
    step = BUILDERS[row.impl](
        model, row.mode, batch, args.seq_len, device, args.warmup + args.steps, args.document_masking
    )
    for i in range(args.warmup):
        step(tokens[i % 2])
    sync(device)
    start = time.perf_counter()
    for i in range(args.steps):
        row.loss = step(tokens[i % 2])
    sync(device)
    row.seconds.append((time.perf_counter() - start) / args.steps)
    row.tokens_per_step = batch * args.seq_len
    float8 = row.mode.startswith("float8")
    # --peak-tflops is the bf16 peak (doubled for float8 rows); else the trainer's table of devices.
    row.peak = args.peak_tflops * 1e12 * (2 if float8 else 1) if args.peak_tflops else peak_flops(device, None, float8)
    row.flops_per_token = model.flops_per_token(args.seq_len)
    row.flops_per_token_titan = model.flops_per_token(args.seq_len, tied_head=False)
    if device.type == "cuda":
        row.peak_mem_gib = max(row.peak_mem_gib or 0.0, torch.cuda.max_memory_allocated(device) / 2**30)
    if args.profile and len(row.seconds) == args.repeat:
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
    """Each (shape, mode) `args.repeat` rounds, ours and torchtitan in alternating order (ours,
    torchtitan, torchtitan, ours, ...), each round a fresh trainer; the rows once all rounds ran."""
    impls = ["ours"] if args.no_torchtitan else ["ours", "torchtitan"]
    rows: list[Row] = []
    start = time.perf_counter()
    todo = plan(args)

    def spent() -> float:
        elapsed = time.perf_counter() - start
        return elapsed if args.time_budget and elapsed > args.time_budget else 0.0

    for index, (shape, mode) in enumerate(todo):
        if spent():
            left = ", ".join(f"{s} {m}" for s, m in todo[index:])
            emit(f"time budget of {args.time_budget:.0f} s spent ({spent():.0f} s): skipped {left}")
            break
        model = smoke_model() if shape == "tiny" else preset(SHAPES[shape], max_seq_len=args.seq_len)
        batch = args.batch or DEFAULT_BATCH[shape]
        pair = {impl: Row(shape, mode, impl) for impl in impls}

        def round_of(row: Row, model: ModelConfig = model, batch: int = batch) -> Callable[[], None]:
            def run() -> None:
                # A failed trainer is not built again; past the budget, the rounds left are skipped.
                if row.error or (row.seconds and spent()):
                    return
                try:
                    measure(row, model, args, device, batch)
                except Exception as error:  # one failing row (OOM, float8 unsupported) must not end the run
                    row.error = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
                release(device)

            return run

        interleaved({impl: round_of(row) for impl, row in pair.items()}, args.repeat, alternate=True)
        for row in pair.values():
            rows.append(row)
            emit(row.line())
            for line in row.profile or []:
                emit(line)
        ours, titan = pair["ours"], pair.get("torchtitan")
        if titan and ours.tokens_per_s and titan.tokens_per_s:
            emit(f"{shape:>5} {mode:<15} ours/torchtitan = {ours.tokens_per_s / titan.tokens_per_s:.3f} (medians)")
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
        mfu = r.mfu()
        return f"{r.tokens_per_s:11,.0f} {100 * mfu:5.1f}%" if mfu is not None else f"{r.tokens_per_s:11,.0f} {'-':>6}"

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
    p.add_argument("--repeat", type=int, default=3, help="rounds per row, ours and torchtitan alternating (default 3)")
    p.add_argument(
        "--document-masking",
        action="store_true",
        help="rows of packed documents (EOD at random places), attention within each: ours with "
        "dataset.document_masking, torchtitan with its flex attention's block-causal mask",
    )
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
        f"# seq_len {args.seq_len}, warm-up {args.warmup} + {args.steps} timed steps per round, {args.repeat} rounds"
        f" per row (ours and torchtitan alternating), the median's tokens/s{'; document masking' if args.document_masking else ''}",
        "# MFU counts the output head's matmul; MFU-tt leaves a tied head's out, as torchtitan's"
        " get_num_flop_per_token does",
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
