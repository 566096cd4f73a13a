"""The training part of `--dry-run`: the layout the recipe asks for, its model size, and the
planner's memory estimate (tokenmill.train.layout_planner): per GPU for a run on GPUs, per process in
host memory for a run on the CPU (`parallel.device: cpu`, or `auto` without CUDA)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenmill.pipelines.schema import Recipe, TrainSpec

if TYPE_CHECKING:
    from tokenmill.train.layout_planner import Shape


def describe_layout(recipe: Recipe) -> list[str]:
    spec = recipe.train
    assert spec is not None
    layout = recipe.train_layout()
    tp, pp, zero = layout["tp"], layout["pp"], layout["zero"]
    world_size = recipe.train_world_size()
    lines = [
        f"training layout: tp={tp} x pp={pp} x dp={layout['dp']}"
        + (f" x cp={layout['cp']}" if layout["cp"] > 1 else "")
        + f" = {world_size} process(es), ZeRO {zero}"
        + (f", {spec.nnodes} nodes" if spec.nnodes > 1 else "")
    ]
    from tokenmill.train.config import model_config_from, padded_vocab_size

    raw = recipe.train_config_dict()
    dataset, schedule = raw.get("dataset") or {}, raw.get("schedule") or {}
    from tokenmill.train.layout_planner import Hardware, Layout, Shape, bubble_fraction, estimate

    model_spec = raw.get("model", {"preset": "tiny"})
    if isinstance(model_spec, str):
        model_spec = {"preset": model_spec}
    if isinstance(model_spec, dict) and "vocab_size" not in model_spec and recipe.tokenize is not None:
        # What the run will use: the tokenizer's vocabulary padded as the trainer pads it.
        divisible_by = int(dataset.get("make_vocab_size_divisible_by", 128))
        model_spec = {**model_spec, "vocab_size": padded_vocab_size(recipe.tokenize.vocab_size, divisible_by, tp)}
    model = model_config_from(model_spec)
    seq = int(dataset.get("seq_len") or model.max_seq_len)
    global_batch = int(schedule.get("global_batch_size", 8))
    micro = int(schedule.get("micro_batch_size") or max(1, global_batch // layout["dp"]))
    params = model.num_params()
    lines.append(
        f"model: {model.flavour}, {model.n_layers} layers x hidden {model.hidden} x {model.n_heads} heads,"
        f" {params / 1e9:.3g}B parameters, seq {seq}, global batch {global_batch}, micro-batch {micro}"
    )
    shape = Shape(params, model.n_layers, model.hidden, model.n_heads, model.vocab_size, seq)
    device = str((raw.get("parallel") or {}).get("device", "auto"))
    if _trains_on_cpu(device, spec):
        precision = str((raw.get("parallel") or {}).get("precision", "fp32"))
        return lines + _cpu_estimate(recipe, shape, global_batch, micro, precision)
    gpus = spec.gpus or world_size
    memory, memory_origin = _gpu_memory(spec.gpu_memory)
    hw = Hardware(gpus=gpus, gpu_memory=memory)
    cp = layout["cp"]
    dp = gpus // (tp * pp * cp) if spec.gpus else layout["dp"]
    if global_batch % max(1, dp * micro):
        lines.append(
            f"(no memory estimate: global batch {global_batch} is not a multiple of dp {dp} x micro-batch {micro})"
        )
        return lines
    est = estimate(shape, hw, Layout(tp, pp, dp, zero, micro, cp), global_batch)
    gib = 2**30
    lines.append(
        f"planner estimate on {gpus} GPU(s) of {memory / gib:.0f} GiB{memory_origin} (dp={dp}): per GPU weights"
        f" {est.weights / gib:.2f} GiB, gradients {est.grads / gib:.2f} GiB, optimizer {est.optim / gib:.2f} GiB,"
        f" activations {est.act_full / gib:.2f} GiB"
        f" ({est.act_recompute / gib:.2f} GiB with recomputation{', needed' if est.recompute else ''}),"
        f" total {est.total / gib:.2f} GiB"
    )
    lines.append(
        f"pipeline: {est.n_micro} micro-batches, bubble {bubble_fraction(pp, est.n_micro):.1%};"
        f" estimated {est.tflops_per_gpu:.0f} TFLOP/s per GPU, {est.iter_time:.1f} s per iteration"
    )
    if est.total > memory * hw.usable_memory:
        lines.append(
            f"WARNING: the estimate ({est.total / gib:.1f} GiB) exceeds the usable GPU memory; see `tokenmill plan`"
        )
    return lines


def _trains_on_cpu(device: str, spec: TrainSpec) -> bool:
    """Whether the run will train on the CPU: `parallel.device: cpu`, or `auto` (the default)
    on a machine without CUDA, unless the recipe sizes a GPU cluster (`train.gpus`/`gpu_memory`)."""
    if device == "cpu":
        return True
    if device != "auto" or spec.gpus or spec.gpu_memory:
        return False
    import torch

    return not torch.cuda.is_available()


def _gpu_memory(given: str | None) -> tuple[int, str]:
    """The memory per GPU the estimate is for, and how it was chosen (said in the plan)."""
    from tokenmill.train.layout_planner import parse_bytes

    if given:
        return parse_bytes(given), ""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory), " (this machine's)"
    return 80 * 2**30, " (assumed; set train.gpu_memory)"


def _size(n: float) -> str:
    """Bytes in the unit that shows them: a toy model's MiB, not 0.00 GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _cpu_estimate(recipe: Recipe, shape: Shape, global_batch: int, micro: int, precision: str) -> list[str]:
    """Memory per process in host memory for a run on the CPU: no GPU, and no accelerator peak
    FLOP/s to time an iteration against.

    The planner's closed forms assume 16-bit weights and gradients with 12 bytes of optimizer
    state per parameter; the trainer keeps fp32 parameters and gradients (4 + 4 bytes) and
    AdamW's two fp32 moments (8 bytes), with fp32 activations unless it runs under bf16
    autocast, so the forms are rescaled to that.
    """
    layout, world_size = recipe.train_layout(), recipe.train_world_size()
    tp, pp, dp, zero = layout["tp"], layout["pp"], layout["dp"], layout["zero"]
    from tokenmill.train.layout_planner import Hardware, Layout, bubble_fraction, estimate

    if global_batch % max(1, dp * micro):
        return [f"(no memory estimate: global batch {global_batch} is not a multiple of dp {dp} x micro-batch {micro})"]
    # The memory budget only decides whether recomputation is needed; a CPU run does not recompute.
    hw = Hardware(gpus=world_size, gpu_memory=2**62)
    est = estimate(shape, hw, Layout(tp, pp, dp, zero, micro, layout["cp"]), global_batch)
    weights, grads, optim = est.weights * 2, est.grads * 2, est.optim * 8 / 12
    activations = est.act_full * (1 if precision == "bf16" else 2)
    total = weights + grads + optim + activations
    return [
        f"memory estimate on the CPU, per process ({world_size} process(es), dp={dp}, {precision}):"
        f" weights {_size(weights)}, gradients {_size(grads)}, optimizer {_size(optim)}, activations"
        f" {_size(activations)}, total {_size(total)}; {_size(total * world_size)} in all",
        f"pipeline: {est.n_micro} micro-batches, bubble {bubble_fraction(pp, est.n_micro):.1%}",
    ]
