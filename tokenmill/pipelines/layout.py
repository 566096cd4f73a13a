"""The training part of `--dry-run`: the layout the recipe asks for, its model size, and the
planner's memory estimate per GPU (tokenmill.train.plan)."""

from __future__ import annotations

from tokenmill.pipelines.recipe import Recipe


def describe_layout(recipe: Recipe) -> list[str]:
    spec = recipe.train
    assert spec is not None
    layout = recipe.train_layout()
    tp, pp, zero = layout["tp"], layout["pp"], layout["zero"]
    world_size = recipe.train_world_size()
    lines = [
        f"training layout: tp={tp} x pp={pp} x dp={layout['dp']} = {world_size} process(es), ZeRO {zero}"
        + (f", {spec.nnodes} nodes" if spec.nnodes > 1 else "")
    ]
    from tokenmill.train.config import model_config_from, padded_vocab_size

    raw = recipe.train_config_dict()
    dataset, schedule = raw.get("dataset") or {}, raw.get("schedule") or {}
    from tokenmill.train.plan import (
        Hardware,
        Layout,
        Shape,
        bubble_fraction,
        estimate,
        parse_bytes,
    )

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
    gpus = spec.gpus or world_size
    memory = parse_bytes(spec.gpu_memory) if spec.gpu_memory else 80 * 2**30
    hw = Hardware(gpus=gpus, gpu_memory=memory)
    shape = Shape(params, model.n_layers, model.hidden, model.n_heads, model.vocab_size, seq)
    dp = gpus // (tp * pp) if spec.gpus else layout["dp"]
    if global_batch % max(1, dp * micro):
        lines.append(
            f"(no memory estimate: global batch {global_batch} is not a multiple of dp {dp} x micro-batch {micro})"
        )
        return lines
    est = estimate(shape, hw, Layout(tp, pp, dp, zero, micro), global_batch)
    gib = 2**30
    lines.append(
        f"planner estimate on {gpus} GPU(s) of {memory / gib:.0f} GiB (dp={dp}): per GPU weights {est.weights / gib:.2f} GiB,"
        f" gradients {est.grads / gib:.2f} GiB, optimizer {est.optim / gib:.2f} GiB, activations {est.act_full / gib:.2f} GiB"
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
