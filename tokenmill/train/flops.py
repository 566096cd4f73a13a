"""Training FLOPs per token of the decoder-only transformer: the one count that the model
config (MFU), the pipeline split (stage balance) and the planner (throughput) all use.

Forward + backward costs 6 FLOPs per weight of every matmul (2 forward, 4 backward); the
attention scores and their weighted sum add 2 matmuls of T x T x h per layer, i.e.
12 * hidden * seq_len per token (the full square, as Megatron and PaLM count). With a 4h MLP
and no grouped-query attention a layer is 72*h^2 + 12*h*s, which is Narayanan et al.'s
72*B*s*L*h^2*(1 + s/(6h) + V/(12*h*L)) per token once the head's 6*h*V is added.
"""

from __future__ import annotations


def layer_flops(hidden: int, ffn_hidden: int, kv_dim: int | None = None, gated: bool = False, seq_len: int = 0) -> int:
    """Training FLOPs per token of one transformer layer: its matmuls (query, key, value and
    output projections, the MLP: three matrices when `gated`, as SwiGLU) plus the attention
    over `seq_len` tokens (0: the matmuls only)."""
    kv = hidden if kv_dim is None else kv_dim
    weights = 2 * hidden * hidden + 2 * hidden * kv + (3 if gated else 2) * hidden * ffn_hidden
    return 6 * weights + 12 * hidden * seq_len


def head_flops(hidden: int, vocab_size: int) -> int:
    """Training FLOPs per token of the output head (the embedding is a lookup: free)."""
    return 6 * hidden * vocab_size


def flops_per_token(
    n_layers: int,
    hidden: int,
    ffn_hidden: int,
    vocab_size: int,
    seq_len: int,
    kv_dim: int | None = None,
    gated: bool = False,
    head: bool = True,
) -> float:
    """Training FLOPs per token of the whole model (forward + backward, no recomputation).
    `head` False leaves the output head's matmul out: torchtitan's convention for a head tied
    to the embedding (`get_num_flop_per_token`: 6 x the parameters but the embedding's, which
    a tied head shares, plus the attention's 12 x layers x hidden x seq_len)."""
    layer = layer_flops(hidden, ffn_hidden, kv_dim, gated, seq_len)
    return float(n_layers * layer + (head_flops(hidden, vocab_size) if head else 0))
