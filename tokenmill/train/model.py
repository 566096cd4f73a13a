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
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.train.flops import flops_per_token

FLAVOURS = ("gpt2", "llama")


@dataclass
class ModelConfig:
    flavour: str = "gpt2"
    vocab_size: int = 50304
    n_layers: int = 12
    hidden: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None  # None: as many as query heads (no GQA)
    ffn_hidden: int | None = None  # None: 4*hidden (gpt2) or ~8/3*hidden rounded (llama)
    max_seq_len: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        # Resolve the defaults here so that the saved config is explicit.
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.ffn_hidden is None:
            if self.flavour == "llama":
                # SwiGLU keeps the MLP's parameter count near 8h^2: 2/3 of 4h, rounded up.
                multiple = 256 if self.hidden >= 1024 else 16
                self.ffn_hidden = multiple * math.ceil(int(8 * self.hidden / 3) / multiple)
            else:
                self.ffn_hidden = 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    def validate(self) -> None:
        """Raise ValueError naming the field when the shape cannot be built."""
        if self.flavour not in FLAVOURS:
            raise ValueError(f"flavour: {self.flavour!r} is not one of {', '.join(FLAVOURS)}")
        for name in ("vocab_size", "n_layers", "hidden", "n_heads", "max_seq_len", "ffn_hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden: {self.hidden} is not divisible by n_heads={self.n_heads}")
        assert self.n_kv_heads is not None
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: {self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if self.flavour == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError("n_kv_heads: grouped-query attention needs flavour 'llama'")
        if self.flavour == "llama" and self.head_dim % 2:
            raise ValueError(f"hidden: head_dim {self.head_dim} must be even for rotary embeddings")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def num_params(self, include_embeddings: bool = True) -> int:
        """Exact parameter count of ``GPT(self)`` (tested against the module)."""
        h, f, v, L = self.hidden, self.ffn_hidden, self.vocab_size, self.n_layers
        assert f is not None and self.n_kv_heads is not None
        kv = self.n_kv_heads * self.head_dim
        if self.flavour == "gpt2":
            attn = (h * h + h) + h * kv + (h * kv + kv) + (h * h + h)  # no key bias
            mlp = (h * f + f) + (f * h + h)
            norms = 2 * 2 * h
            final_norm = 2 * h
        else:
            attn = h * h + 2 * h * kv + h * h
            mlp = 3 * h * f
            norms = 2 * h
            final_norm = h
        total = L * (attn + mlp + norms) + final_norm
        if include_embeddings:
            total += v * h  # token embeddings
            if self.flavour == "gpt2":
                total += self.max_seq_len * h
        if not self.tie_embeddings or not include_embeddings:
            total += v * h  # output head (a matmul, so counted even without embeddings)
        return total

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward, no recomputation) at `seq_len`
        (default: `max_seq_len`), as `tokenmill.train.flops` counts them."""
        assert self.ffn_hidden is not None and self.n_kv_heads is not None
        return flops_per_token(
            self.n_layers,
            self.hidden,
            self.ffn_hidden,
            self.vocab_size,
            seq_len or self.max_seq_len,
            kv_dim=self.n_kv_heads * self.head_dim,
            gated=self.flavour == "llama",
        )


def _gpt2(n_layers: int, hidden: int, n_heads: int, seq: int = 2048, **kw) -> ModelConfig:
    # GPT-2 and Megatron share the input embedding with the output head.
    return ModelConfig("gpt2", 50304, n_layers, hidden, n_heads, max_seq_len=seq, tie_embeddings=True, **kw)


def _llama3(n_layers: int, hidden: int, n_heads: int, ffn_hidden: int, seq: int, **kw) -> ModelConfig:
    # The Llama 3 family: 128256-token vocabulary, 8 key/value heads, rope theta 5e5.
    return ModelConfig(
        "llama",
        128256,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads=8,
        ffn_hidden=ffn_hidden,
        max_seq_len=seq,
        norm_eps=1e-5,
        rope_theta=500000.0,
        **kw,
    )


PRESETS: dict[str, ModelConfig] = {
    # For tests and the smoke recipe: seconds per step on a laptop CPU.
    "tiny": ModelConfig("gpt2", 512, 2, 64, 4, max_seq_len=128),
    "tiny-llama": ModelConfig("llama", 512, 2, 64, 4, n_kv_heads=2, ffn_hidden=160, max_seq_len=128),
    # GPT-2 / GPT-3 sizes (Megatron's padded GPT-2 vocabulary, 50304).
    "gpt2-125m": _gpt2(12, 768, 12, 1024),
    "gpt2-350m": _gpt2(24, 1024, 16, 1024),
    "gpt2-1.3b": _gpt2(24, 2048, 32),
    "gpt3-175b": _gpt2(96, 12288, 96, init_std=0.006),
    # Megatron-Turing NLG 530B (init std 4e-3 as published).
    "mtnlg-530b": _gpt2(105, 20480, 128, init_std=0.004),
    # Llama 3.2 1B's and 3B's shapes (tied embeddings): the llamas of the GPU throughput
    # measurements (bench/train_mfu.py).
    "llama-1b": _llama3(16, 2048, 32, 8192, seq=2048, tie_embeddings=True),
    "llama-3b": _llama3(28, 3072, 24, 8192, seq=2048, tie_embeddings=True),
    "llama-8b": _llama3(32, 4096, 32, 14336, seq=8192),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A copy of a preset with some fields replaced (resolved defaults recomputed)."""
    base = PRESETS[name]
    if "n_heads" in overrides and "n_kv_heads" not in overrides and base.n_kv_heads == base.n_heads:
        overrides["n_kv_heads"] = None
    if ("hidden" in overrides or "flavour" in overrides) and "ffn_hidden" not in overrides:
        overrides["ffn_hidden"] = None
    return replace(base, **overrides)


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
    """x: [B, T, heads, head_dim]; rope: [2, >=T, head_dim]."""
    T = x.shape[1]
    cos = rope[0, :T].to(x.dtype)[None, :, None, :]
    sin = rope[1, :T].to(x.dtype)[None, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


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

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
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
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0, enable_gqa=gqa
        )
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

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), rope))
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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab]; hidden states in/out on middle stages."""
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
                h = h + self.pos_embeddings(positions)
            h = self.dropout(h)
        else:
            h = tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h
