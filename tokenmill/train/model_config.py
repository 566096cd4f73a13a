"""The model's shape: `ModelConfig` and the named presets, without torch, so that a training
config can be read and checked (and its mistakes reported) before torch is imported."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

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

    def flops_per_token(self, seq_len: int | None = None, tied_head: bool = True) -> float:
        """Training FLOPs per token (forward + backward, no recomputation) at `seq_len`
        (default: `max_seq_len`), as `tokenmill.train.flops` counts them. `tied_head` False
        leaves a tied head's matmul out, as torchtitan counts (an untied head is counted
        either way)."""
        assert self.ffn_hidden is not None and self.n_kv_heads is not None
        return flops_per_token(
            self.n_layers,
            self.hidden,
            self.ffn_hidden,
            self.vocab_size,
            seq_len or self.max_seq_len,
            kv_dim=self.n_kv_heads * self.head_dim,
            gated=self.flavour == "llama",
            head=tied_head or not self.tie_embeddings,
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
