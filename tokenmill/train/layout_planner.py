"""`tokenmill plan`: rank 4D-parallel layouts (tp, pp, dp, cp, zero, micro-batch) for a model on
a cluster, by estimated throughput, with memory per GPU and pipeline bubble.

The estimates are the published closed forms, the same ones `bench/zero_memory.py` and
`bench/parallel_throughput.py` check against measurements:

- Model states per GPU (ZeRO paper, mixed precision with K bytes of optimizer state per
  parameter): weights 2 Psi, gradients 2 Psi, optimizer K Psi, each divided by the model-
  parallel size tp*pp and by dp where the ZeRO stage shards it (1: optimizer, 2: + gradients,
  3: + weights).
- Activations per layer per micro-batch (Korthikanti et al. 2022, bytes, 16-bit):
  s*b*h*(34 + 5*a*s/h) / tp with sequence parallel; full recomputation keeps only the layer
  input, 2*s*b*h / tp. Under 1F1B the first stage holds min(pp, m) micro-batches in flight.
- Time: FLOPs 72*B*s*L*h^2*(1 + s/(6h) + V/(12*h*L)) (Narayanan et al. 2021; x4/3 with
  recomputation) at an efficiency that falls for narrow matmuls, plus tensor-parallel
  all-reduces (slow when tp leaves the node), pipeline sends, the data-parallel gradient
  reduction (and ZeRO-3's parameter gathers), all over a pipeline of (m + pp - 1) slots,
  i.e. bubble fraction (pp-1)/(m+pp-1).
- Context parallel (cp ranks per sequence, ring attention): activations and compute per GPU
  divide by cp, the matmuls see s/cp rows (lower efficiency), ZeRO shards and gradients are
  reduced over dp x cp, and each layer passes key/value blocks (and in the backward pass their
  gradients) cp-1 times around the ring, overlapped with the layer's compute.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from tokenmill.errors import TokenmillError
from tokenmill.train.flops import flops_per_token, head_flops, layer_flops

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920; '80GB' -> 80e9; plain numbers are bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise TokenmillError(f"cannot read a memory size from {text!r} (try 80GiB or 40GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Hardware:
    gpus: int
    gpu_memory: int  # bytes
    gpus_per_node: int = 8
    peak_flops: float = 312e12  # A100 bf16 dense
    intra_node_bw: float = 250e9  # bytes/s per GPU, NVLink (achievable, one direction)
    inter_node_bw: float = 25e9  # bytes/s per GPU (8x HDR 200 Gb/s per DGX A100)
    max_efficiency: float = 0.7  # best matmul fraction of peak reached by a large GEMM
    usable_memory: float = 0.9  # leave room for fragmentation, buffers, CUDA context


@dataclass(frozen=True)
class Shape:
    params: float
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int = 51200
    seq_len: int = 2048

    @staticmethod
    def from_params(params: float, seq_len: int, vocab_size: int = 51200) -> Shape:
        """A GPT shape for a parameter count: a published one when it is within 3%, else
        12*L*h^2 = params at an aspect ratio h/L ~ 128 (GPT-3's family), h a multiple of 128."""
        published = [  # (params, layers, hidden, heads)
            (530e9, 105, 20480, 128),
            (175e9, 96, 12288, 96),
            (1e12, 128, 25600, 160),
            (145.6e9, 80, 12288, 96),
            (76.1e9, 60, 10240, 80),
            (39.1e9, 48, 8192, 64),
            (18.4e9, 40, 6144, 48),
            (13e9, 40, 5120, 40),
            (6.7e9, 32, 4096, 32),
            (1.3e9, 24, 2048, 16),
        ]
        for p, L, h, a in published:
            if abs(p - params) / params < 0.03:
                return Shape(params, L, h, a, vocab_size, seq_len)
        L = max(2, round((params / (12 * 128**2)) ** (1 / 3)))
        h = max(128, 128 * round(math.sqrt(params / (12 * L)) / 128))
        return Shape(params, L, h, max(1, h // 128), vocab_size, seq_len)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero: int
    micro_batch: int
    cp: int = 1


@dataclass
class Estimate:
    layout: Layout
    n_micro: int
    weights: float
    grads: float
    optim: float
    act_full: float
    act_recompute: float
    recompute: bool
    bubble: float
    iter_time: float
    tflops_per_gpu: float
    tokens_per_s: float

    @property
    def model_states(self) -> float:
        return self.weights + self.grads + self.optim

    @property
    def total(self) -> float:
        return self.model_states + (self.act_recompute if self.recompute else self.act_full)


def model_state_bytes(
    psi: float, dp: int, zero: int, k: float = 12.0, w: float = 2.0, g: float = 2.0
) -> tuple[float, float, float]:
    """Per-rank bytes of (weights, gradients, optimizer state) for psi parameters held by a
    data-parallel group of dp ranks under ZeRO stage `zero` (the paper's formulas)."""
    weights = w * psi / (dp if zero >= 3 else 1)
    grads = g * psi / (dp if zero >= 2 else 1)
    optim = k * psi / (dp if zero >= 1 else 1)
    return weights, grads, optim


def bubble_fraction(pp: int, n_micro: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a (interleaved) 1F1B pipeline: (p-1) / (v*m + p - 1)."""
    return (pp - 1) / (virtual_stages * n_micro + pp - 1)


def _ring(bytes_: float, n: int, bw: float) -> float:
    """Time of a ring all-reduce of `bytes_` over n ranks."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * bytes_ / bw


def estimate(shape: Shape, hw: Hardware, layout: Layout, global_batch: int, k: float = 12.0) -> Estimate:
    tp, pp, dp, zero, b = layout.tp, layout.pp, layout.dp, layout.zero, layout.micro_batch
    cp = layout.cp
    s, h, L, a, V = shape.seq_len, shape.hidden, shape.n_layers, shape.n_heads, shape.vocab_size
    m = global_batch // (dp * b)
    layers_per_stage = math.ceil(L / pp)  # the slowest stage sets the pace
    # The first stage holds the embedding as well as its layers (the largest stage).
    psi_stage = (12 * h * h + 13 * h) * layers_per_stage + V * h
    # Parameters are replicated over dp and cp alike: ZeRO shards over both.
    weights, grads, optim = model_state_bytes(psi_stage / tp, dp * cp, zero, k)
    per_layer = s * b * h * (34 + 5 * a * s / h) / tp / cp  # with sequence parallel, s/cp tokens
    in_flight = min(pp, m)
    act_full = per_layer * layers_per_stage * in_flight
    # Recomputation keeps layer inputs, plus one layer's full activations while it recomputes.
    act_recompute = 2 * s * b * h / tp / cp * layers_per_stage * in_flight + per_layer
    budget = hw.gpu_memory * hw.usable_memory
    recompute = weights + grads + optim + act_full > budget

    # Compute: per micro-batch per stage, forward + backward (+ forward again if recomputing).
    layer, head = layer_flops(h, 4 * h, seq_len=s), head_flops(h, V)
    # the head counted twice and spread over the stages: the calibration the rankings rest on
    flops_mb = b * s * (layers_per_stage * layer + 2 * head / pp) / cp
    flops_mb *= (4 / 3) if recompute else 1.0
    rows = b * s / cp
    eff = hw.max_efficiency * (rows / (rows + 512)) * ((h / tp) / (h / tp + 512))
    t_compute = flops_mb / tp / (hw.peak_flops * eff)
    # Tensor parallel: 4 all-reduce-equivalents of b*s*h 16-bit values per layer (6 when
    # recomputing), not overlapped; slow once tp leaves the node.
    tp_bw = hw.intra_node_bw if tp <= hw.gpus_per_node else hw.inter_node_bw
    n_ar = 6 if recompute else 4
    t_tp = n_ar * layers_per_stage * _ring(2 * b * s * h, tp, tp_bw)
    # Pipeline: activations and their gradients between nodes, split across the tp ranks.
    t_pp = 0.0 if pp == 1 else 2 * 2 * b * s * h / tp / hw.inter_node_bw
    # Context parallel: per layer, K and V (16-bit, s/cp tokens) go around the ring cp-1 times
    # forward and backward, the backward also their gradients (3 passes), overlapped with compute.
    cp_bw = hw.intra_node_bw if tp * cp <= hw.gpus_per_node else hw.inter_node_bw
    t_cp = layers_per_stage * 3 * (cp - 1) * 2 * 2 * b * (s / cp) * h / tp / cp_bw
    t_slot = max(t_compute, t_cp) + t_tp + t_pp
    # Data parallel: a gradient all-reduce (ZeRO 0/1) or reduce-scatter (2/3) once per step;
    # ZeRO 2 and 3 reduce every micro-batch, and ZeRO-3 also gathers the weights twice.
    dp_bw = hw.intra_node_bw if tp * dp * cp <= hw.gpus_per_node else hw.inter_node_bw
    grad_bytes = 2 * psi_stage / tp
    if zero <= 1:
        t_dp = _ring(grad_bytes, dp * cp, dp_bw)
    else:
        per_mb = _ring(grad_bytes, dp * cp, dp_bw) / 2 * (1.0 if zero == 2 else 3.0)
        t_dp = per_mb * m
    iter_time = (m + pp - 1) * t_slot + t_dp
    total_flops = global_batch * s * flops_per_token(L, h, 4 * h, V, s)
    return Estimate(
        layout=layout,
        n_micro=m,
        weights=weights,
        grads=grads,
        optim=optim,
        act_full=act_full,
        act_recompute=act_recompute,
        recompute=recompute,
        bubble=bubble_fraction(pp, m),
        iter_time=iter_time,
        tflops_per_gpu=total_flops / iter_time / hw.gpus / 1e12,
        tokens_per_s=global_batch * s / iter_time,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(
    shape: Shape,
    hw: Hardware,
    global_batch: int,
    micro_batches: tuple[int, ...] = (1, 2, 4, 8),
    k: float = 12.0,
    context_parallel: tuple[int, ...] = (1,),
) -> list[Estimate]:
    """Every feasible layout, best estimated throughput first; `context_parallel`: the cp
    sizes to consider (each must split the sequence into 2 x cp chunks)."""
    results = []
    for tp in _divisors(hw.gpus):
        # tp splits heads; beyond one node its all-reduces cross the network (allowed, slow).
        if shape.n_heads % tp or tp > 2 * hw.gpus_per_node:
            continue
        for pp, cp in ((pp, cp) for pp in _divisors(hw.gpus // tp) for cp in context_parallel):
            if pp > shape.n_layers or (hw.gpus // (tp * pp)) % cp or shape.seq_len % (2 * cp):
                continue
            dp = hw.gpus // (tp * pp * cp)
            for b in micro_batches:
                if global_batch % (dp * b):
                    continue
                for zero in (0, 1, 2, 3):
                    est = estimate(shape, hw, Layout(tp, pp, dp, zero, b, cp), global_batch, k)
                    if est.total <= hw.gpu_memory * hw.usable_memory:
                        results.append(est)
    results.sort(key=lambda e: (-e.tokens_per_s, e.total))
    return results


def _gib(x: float) -> str:
    return f"{x / 2**30:7.1f}"


def format_table(rows: list[tuple[int, Estimate]]) -> str:
    head = (
        f"{'rank':>5} {'tp':>3} {'pp':>4} {'dp':>5} {'cp':>3} {'zero':>4} {'mb':>3} {'m':>5} "
        f"{'weights':>7} {'grads':>7} {'optim':>7} {'act':>7} {'act+rc':>7} {'total':>7} "
        f"{'rc':>3} {'bubble':>6} {'iter s':>7} {'TFLOP/s':>7}"
    )
    lines = [head, " " * 36 + "(GiB per GPU)"]
    for rank, e in rows:
        lo = e.layout
        lines.append(
            f"{rank:>5} {lo.tp:>3} {lo.pp:>4} {lo.dp:>5} {lo.cp:>3} {lo.zero:>4} {lo.micro_batch:>3} {e.n_micro:>5} "
            f"{_gib(e.weights)} {_gib(e.grads)} {_gib(e.optim)} {_gib(e.act_full)} {_gib(e.act_recompute)} "
            f"{_gib(e.total)} {'yes' if e.recompute else 'no':>3} {e.bubble:6.1%} {e.iter_time:7.1f} "
            f"{e.tflops_per_gpu:7.1f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """`tokenmill plan` (its parser is in train/cli.py)."""
    if args.gpus < 1 or args.global_batch < 1:
        raise TokenmillError("--gpus and --global-batch must be positive")
    if args.layers or args.hidden or args.heads:
        if not (args.layers and args.hidden and args.heads):
            raise TokenmillError("--layers, --hidden and --heads go together")
        shape = Shape(args.params, args.layers, args.hidden, args.heads, args.vocab_size, args.seq_len)
    else:
        shape = Shape.from_params(args.params, args.seq_len, args.vocab_size)
    hw = Hardware(
        gpus=args.gpus,
        gpu_memory=parse_bytes(args.gpu_memory),
        gpus_per_node=args.gpus_per_node,
        peak_flops=args.peak_tflops * 1e12,
    )
    try:
        cps = tuple(sorted({int(x) for x in args.cp.split(",")}))
    except ValueError:
        cps = ()
    if not cps or min(cps) < 1:
        raise TokenmillError(f"--cp: expected positive sizes separated by commas, e.g. 1,2,4; got {args.cp!r}")
    results = plan(shape, hw, args.global_batch, k=args.optimizer_bytes, context_parallel=cps)
    print(
        f"model: {shape.params:.3g} parameters as {shape.n_layers} layers x hidden {shape.hidden} x "
        f"{shape.n_heads} heads, seq {shape.seq_len}; {hw.gpus} GPUs ({hw.gpus_per_node} per node, "
        f"{hw.gpu_memory / 2**30:.0f} GiB, {args.peak_tflops:g} TFLOP/s peak); global batch {args.global_batch}"
    )
    print(
        f"bytes per parameter: 2 weights + 2 gradients + {args.optimizer_bytes:g} optimizer (ZeRO paper's K); "
        "rc = activation recomputation needed to fit"
    )
    if not results:
        print("no layout fits in memory")
        return 1
    rows = list(enumerate(results[: args.top], start=1))
    if args.find:
        tp, pp = (int(x) for x in args.find.split(","))
        for rank, e in enumerate(results, start=1):
            if e.layout.tp == tp and e.layout.pp == pp:
                if rank > args.top:
                    rows.append((rank, e))
                break
        else:
            print(f"tp={tp}, pp={pp}: no feasible layout")
    print(f"{len(results)} feasible layouts, ranked by estimated throughput:")
    print(format_table(rows))
    return 0
