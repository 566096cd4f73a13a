"""Megatron tensor parallelism (and sequence parallelism) applied to the plain GPT with DTensor.

- Embedding: vocabulary-parallel (rows split, the partial lookups all-reduced).
- Attention: q/k/v column-parallel (each rank its own heads), out row-parallel.
- MLP: up/gate column-parallel, down row-parallel.
- Head: column-parallel over the vocabulary, left sharded (``Shard(-1)``) so the loss runs
  under ``loss_parallel()`` and the full logits are never gathered. Tied embeddings stay tied:
  the embedding and the head split the same weight the same way (rows = vocabulary).
- Sequence parallel: the residual stream between blocks is split along the sequence, so the
  norms and dropout run on T/tp positions; each block all-gathers before attention / MLP and
  reduce-scatters after. The embedding output is replicated and split at the first block
  (layer "0"), which keeps gpt2's learned positions a plain addition.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from tokenmill.train.model import GPT


def apply_tensor_parallel(part: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Parallelize one pipeline part in place (the parts it does not own are None / absent)."""
    sp = sequence_parallel
    if getattr(part, "tok_embeddings", None) is not None:
        parallelize_module(
            part,
            tp_mesh,
            {
                "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            },
        )
    for name, block in part.layers.items():
        plan: dict[str, object] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            plan.update(
                {
                    "attention_norm": SequenceParallel(),
                    "ffn_norm": SequenceParallel(),
                    # (x, rope, documents): gather the sequence before the column-parallel projections.
                    "attention": PrepareModuleInput(
                        input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
                    ),
                    "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                }
            )
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]
        if sp and name == "0":
            # The replicated embedding output enters the sequence-split residual stream.
            parallelize_module(
                block,
                tp_mesh,
                PrepareModuleInput(
                    input_layouts=(Replicate(), None, None),
                    desired_input_layouts=(Shard(1), None, None),
                    use_local_output=True,
                ),
            )
    head_plan: dict[str, object] = {}
    if getattr(part, "norm", None) is not None and sp:
        head_plan["norm"] = SequenceParallel()
    if getattr(part, "output", None) is not None:
        head_plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False
        )
    if head_plan:
        parallelize_module(part, tp_mesh, head_plan)  # type: ignore[arg-type]
    # Each plan distributed its own copy of a tied weight; both are Shard(0) over the
    # vocabulary, so the head can take the embedding's again.
    part.tie_embedding_weights()
