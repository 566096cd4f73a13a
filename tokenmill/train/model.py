"""A decoder-only transformer in plain PyTorch, in two published flavours.

- ``gpt2``: learned positions, LayerNorm, GeLU MLP, biases (the Megatron / MT-NLG family).
- ``llama``: rotary positions, RMSNorm, SwiGLU MLP, no biases, optional grouped-query attention.

Parallelism is applied from outside (``tokenmill/train/parallel``), torchtitan-style, so the
layout of this file is part of the contract:

- ``GPT.layers`` is an ``nn.ModuleDict`` keyed "0".."n-1": a pipeline stage deletes the layers
  it does not own and every remaining parameter keeps its name (checkpoints reshard by name).
- ``tok_embeddings`` / ``norm`` / ``output`` may be set to ``None`` (middle pipeline stages);
  ``forward`` then takes / returns hidden states.
- Attention reshapes with ``.view(B, T, -1, head_dim)`` so a tensor-parallel shard holding a
  subset of the heads runs the same code.
- Context parallelism sets two hooks: ``Attention.core`` (causal attention of q on k, v in
  [B, heads, T, head_dim], given the rows' document ids or None; None: ``scaled_dot_product_attention``)
  and ``GPT.positions`` (the global positions of the tokens of this process's slice of each
  sequence; None: 0..T-1), which RoPE and the learned position embeddings use.
- Document masking (packed rows, block-causal): ``forward(tokens, document_ids, positions)``
  takes each token's document index in its whole row ([B, T_row]; under context parallelism
  the row is longer than this process's slice) and, optionally, each token's position
  ([B, T]: restarting at 0 in every document), so a token attends only within its document.
- ``GPT.head_in_loss``: ``forward`` stops before the head, whose weight the loss then applies
  chunk by chunk (``tokenmill/train/chunked_loss.py``).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.train.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as Llama does) so bf16 runs stay stable.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)


def rope_cache(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """[max_seq_len, head_dim] cos and sin stacked on dim 0 -> [2, T, head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(t, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # "rotate half" layout, as Hugging Face Llama
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, head_dim]; rope: [2, >=T, head_dim], or [2, B, T, head_dim] (each row
    its own positions)."""
    T = x.shape[1]
    if rope.dim() == 4:
        cos, sin = rope[0].to(x.dtype)[:, :, None, :], rope[1].to(x.dtype)[:, :, None, :]
    else:
        cos = rope[0, :T].to(x.dtype)[None, :, None, :]
        sin = rope[1, :T].to(x.dtype)[None, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def document_ids(tokens: torch.Tensor, eod_id: int) -> torch.Tensor:
    """[B, T] index of each token's document in its row of packed documents: a document ends
    with its EOD token, so the token after an EOD starts the next one."""
    eod = (tokens == eod_id).long()
    return eod.cumsum(1) - eod


def document_positions(ids: torch.Tensor) -> torch.Tensor:
    """[B, T] position of each token in its document (0 at each document's first token)."""
    index = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values


def block_causal_mask(ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] True where query t may attend to key s: s <= t, in the same document."""
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    return ((ids[:, :, None] == ids[:, None, :]) & causal)[:, None]


def flex_block_mask(ids: torch.Tensor) -> Any:
    """The block-causal mask of `ids` as flex attention's BlockMask (blocks wholly outside a
    document are skipped, not computed and masked)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b, h, q, k):
        return (ids[b, q] == ids[b, k]) & (q >= k)

    B, T = ids.shape
    return create_block_mask(same_document_causal, B, None, T, T, device=ids.device)


@functools.cache
def _flex_attention(device_type: str) -> Callable[..., torch.Tensor]:
    """Flex attention, compiled on the GPU (its fused kernels); eager elsewhere (an unfused
    reference, as exact, which the CPU tests use)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def attention_mask(ids: torch.Tensor, flex: bool) -> Any:
    """What `Attention` takes for rows of documents `ids`: flex attention's BlockMask (`flex`:
    fused kernels on the GPU), else SDPA's boolean mask (the same semantics, for the CPU)."""
    return flex_block_mask(ids) if flex else block_causal_mask(ids)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.flavour == "gpt2"
        assert cfg.n_kv_heads is not None
        self.head_dim = cfg.head_dim
        self.use_rope = cfg.flavour == "llama"
        self.dropout = cfg.dropout
        self.wq = nn.Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=bias)
        # No key bias even in gpt2: q.(k + b) shifts every score of a query by q.b, which the
        # softmax cancels, so its gradient is pure rounding noise that Adam would amplify into
        # irreproducible updates. Exported to GPT-2 as zeros (the same function).
        self.wk = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=bias)
        self.core: Callable[..., torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None, documents: Any = None) -> torch.Tensor:
        """`documents`: None (causal over the whole row); with a `core`, the rows' document ids;
        without, the mask `attention_mask` made of them."""
        B, T, _ = x.shape
        # -1 heads: a tensor-parallel shard holds only its own heads.
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        if self.use_rope:
            assert rope is not None
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, head_dim]
        gqa = q.shape[1] != k.shape[1]
        dropout = self.dropout if self.training else 0.0
        if self.core is not None:
            out = self.core(q, k, v, documents)
        elif documents is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, enable_gqa=gqa)
        elif isinstance(documents, torch.Tensor):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=documents, dropout_p=dropout, enable_gqa=gqa)
        else:
            out = _flex_attention(q.device.type)(q, k, v, block_mask=documents, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.ffn_hidden is not None
        self.gated = cfg.flavour == "llama"
        bias = not self.gated
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=bias)  # up (gpt2) / gate (llama)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=bias)  # down
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False) if self.gated else None  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        norm = (
            (lambda: nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps))
            if cfg.flavour == "gpt2"
            else (lambda: RMSNorm(cfg.hidden, cfg.norm_eps))
        )
        self.attention_norm = norm()
        self.attention = Attention(cfg)
        self.ffn_norm = norm()
        self.feed_forward = FeedForward(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None, documents: Any = None) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), rope, documents))
        return x + self.dropout(self.feed_forward(self.ffn_norm(x)))


def _parameter_seed(init_seed: int, name: str) -> int:
    return (init_seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, init_seed: int | None = None) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        # Every parameter starts from its own generator, seeded by this and its name, so a
        # pipeline stage or tensor shard built on its own gets the values the whole model has.
        self.init_seed = int(torch.randint(0, 2**31, (), device="cpu")) if init_seed is None else init_seed
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(cfg.max_seq_len, cfg.hidden) if cfg.flavour == "gpt2" else None
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = (
            nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps) if cfg.flavour == "gpt2" else RMSNorm(cfg.hidden, cfg.norm_eps)
        )
        self.output: nn.Linear | None = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        if cfg.flavour == "llama":
            # Persistent=False: recomputed by init_weights (also after to_empty from meta).
            self.register_buffer("rope", rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False)
        else:
            self.rope = None
        self.positions: torch.Tensor | None = None
        # True when the loss applies the head itself (chunked cross-entropy: the whole logits
        # never exist): forward then returns the final hidden states.
        self.head_in_loss = False
        self.tie_embedding_weights()
        self.init_weights()

    def tie_embedding_weights(self) -> None:
        """Make the head use the embedding's weight (with ``tie_embeddings``, when this module
        holds both). Called again after anything that replaces parameters one module at a time
        (``to_empty``, tensor-parallel plans), which gives each module its own copy."""
        if self.config.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Megatron init: N(0, init_std) everywhere, output projections of each residual
        branch (wo, w2) with std / sqrt(2 * n_layers); biases zero, norms one."""
        self.init_buffers(buffer_device)
        with torch.no_grad():
            for name, param in self.named_parameters():
                self.init_parameter(name, param)

    def init_buffers(self, device: torch.device | None = None) -> None:
        """Recompute the non-persistent buffers (the RoPE table), e.g. after ``to_empty``."""
        if self.rope is not None:
            cfg = self.config
            with torch.no_grad():
                self.rope = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, device=device or self.rope.device)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Fill ``tensor`` (the full-size parameter ``name``) with its initial value, in place."""
        cfg = self.config
        if tensor.is_meta:
            return tensor
        module, kind = name.rsplit(".", 2)[-2:]
        if kind == "bias":
            return tensor.zero_()
        if module.endswith("norm"):
            return tensor.fill_(1.0)
        std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if module in ("wo", "w2") else cfg.init_std
        if cfg.tie_embeddings and name == "output.weight":
            name = "tok_embeddings.weight"  # a pipeline's last stage holds the tied weight under this name
        # Drawn on the tensor's own device (no CPU copy of a large model): the same values for
        # the same seed in any layout on that kind of device; a GPU draws other values than the CPU.
        generator = torch.Generator(device=tensor.device).manual_seed(_parameter_seed(self.init_seed, name))
        return tensor.normal_(0.0, std, generator=generator)

    def forward(
        self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab]; hidden states in/out on middle stages.
        `document_ids` [B, T_row]: attend only within documents; `positions` [B, T]: each
        token's position (None: the `positions` hook, or 0..T-1)."""
        T = tokens.shape[1]
        positions = self.positions if positions is None else positions
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(T, device=tokens.device) if positions is None else positions)
            h = self.dropout(h)
        else:
            h = tokens
        rope = self.rope if self.rope is None or positions is None else self.rope[:, positions]
        if document_ids is None or any(layer.attention.core is not None for layer in self.layers.values()):
            documents: Any = document_ids  # a core (ring attention) masks each block itself
        else:
            # Flex attention has no dropout: with dropout, SDPA's mask on the GPU too.
            flex = h.device.type == "cuda" and not (self.training and self.config.dropout > 0)
            documents = attention_mask(document_ids, flex)
        for layer in self.layers.values():
            h = layer(h, rope, documents)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None and not self.head_in_loss:
            h = self.output(h)
        return h
