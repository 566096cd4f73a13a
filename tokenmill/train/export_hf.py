"""Export a checkpoint as a Hugging Face model directory (safetensors + config.json).

gpt2 flavour -> ``GPT2LMHeadModel``: q/k/v are fused into ``c_attn`` and every projection is
stored transposed (GPT-2's ``Conv1D`` keeps weights as [in, out]).
llama flavour -> ``LlamaForCausalLM``: names map one to one; our rotary embedding already uses
the "rotate half" layout that transformers' Llama uses, so q/k need no permutation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tokenmill.errors import TokenmillError
from tokenmill.infra.outputs import OutputKind, claim_output
from tokenmill.tokenize.special import find_eod_id, pad_id
from tokenmill.train.checkpoint import load_for_inference
from tokenmill.train.model import GPT
from tokenmill.train.model_config import ModelConfig


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    cfg = model.config
    out = {
        "transformer.wte.weight": sd["tok_embeddings.weight"],
        "transformer.wpe.weight": sd["pos_embeddings.weight"],
        "transformer.ln_f.weight": sd["norm.weight"],
        "transformer.ln_f.bias": sd["norm.bias"],
    }
    for i in range(cfg.n_layers):
        p, h = f"layers.{i}.", f"transformer.h.{i}."
        out[h + "ln_1.weight"] = sd[p + "attention_norm.weight"]
        out[h + "ln_1.bias"] = sd[p + "attention_norm.bias"]
        out[h + "ln_2.weight"] = sd[p + "ffn_norm.weight"]
        out[h + "ln_2.bias"] = sd[p + "ffn_norm.bias"]
        qkv_w = torch.cat([sd[p + f"attention.{n}.weight"] for n in ("wq", "wk", "wv")], dim=0)
        q_b, v_b = sd[p + "attention.wq.bias"], sd[p + "attention.wv.bias"]
        qkv_b = torch.cat([q_b, torch.zeros_like(v_b), v_b], dim=0)  # we have no key bias
        out[h + "attn.c_attn.weight"] = qkv_w.t()
        out[h + "attn.c_attn.bias"] = qkv_b
        out[h + "attn.c_proj.weight"] = sd[p + "attention.wo.weight"].t()
        out[h + "attn.c_proj.bias"] = sd[p + "attention.wo.bias"]
        out[h + "mlp.c_fc.weight"] = sd[p + "feed_forward.w1.weight"].t()
        out[h + "mlp.c_fc.bias"] = sd[p + "feed_forward.w1.bias"]
        out[h + "mlp.c_proj.weight"] = sd[p + "feed_forward.w2.weight"].t()
        out[h + "mlp.c_proj.bias"] = sd[p + "feed_forward.w2.bias"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["output.weight"]
    return out


def gpt2_config(cfg: ModelConfig, special: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_ctx": cfg.max_seq_len,
        "n_embd": cfg.hidden,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.ffn_hidden,
        "activation_function": "gelu",  # exact erf GeLU, as our model (not GPT-2's tanh "gelu_new")
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": cfg.init_std,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        **special,
    }


def llama_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    cfg = model.config
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    names = {
        "attention.wq": "self_attn.q_proj",
        "attention.wk": "self_attn.k_proj",
        "attention.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for i in range(cfg.n_layers):
        for ours, theirs in names.items():
            out[f"model.layers.{i}.{theirs}.weight"] = sd[f"layers.{i}.{ours}.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["output.weight"]
    return out


def llama_config(cfg: ModelConfig, special: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4.x
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # transformers 5.x
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        **special,
    }


def _special_tokens(tokenizer_path: str | None, eod: int | None = None) -> dict[str, int]:
    """bos/eos ids (EOD is both, as in GPT-2): the checkpoint's EOD id (the one the data was
    encoded with), else the tokenizer's first known EOD spelling; and the padding token's id
    when the tokenizer has one (`<|pad|>` in tokenmill's); when the tokenizer can be read."""
    if not tokenizer_path or not Path(tokenizer_path).is_file():
        return {}
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_path))
    except Exception:  # not a tokenizers JSON: export the model without special ids
        return {}
    special = {}
    token_id = eod if isinstance(eod, int) and tok.id_to_token(eod) is not None else find_eod_id(tok)
    if token_id is not None:
        special.update(bos_token_id=token_id, eos_token_id=token_id)
    padding = pad_id(tok)
    if padding is not None:
        special["pad_token_id"] = padding
    return special


def _copy_tokenizer(tokenizer_path: str | None, outdir: Path, special: dict[str, int]) -> bool:
    if not tokenizer_path or not Path(tokenizer_path).is_file():
        return False
    source = Path(tokenizer_path)
    shutil.copyfile(source, outdir / "tokenizer.json")
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if special:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(source))
        # bos_token_id -> bos_token: the token's spelling, as transformers reads it
        config.update({key.removesuffix("_id"): tok.id_to_token(value) for key, value in special.items()})
    (outdir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return True


# What export-hf may write over: an earlier export, or nothing yet.
EXPORT_OUTPUT = OutputKind("a Hugging Face model directory", ("model.safetensors", "config.json"))


def export_hf(checkpoint: str | Path, outdir: str | Path) -> Path:
    """Write ``model.safetensors`` + ``config.json`` (+ tokenizer files) to ``outdir``, which
    holds nothing else yet or an earlier export (refused in one line before the checkpoint
    loads, as is an ``outdir`` inside the checkpoint)."""
    with claim_output(outdir, EXPORT_OUTPUT, flag="export-hf OUTDIR", inputs=[checkpoint]):
        return _export(checkpoint, Path(outdir))


def _export(checkpoint: str | Path, outdir: Path) -> Path:
    model, cfg, meta = load_for_inference(checkpoint)
    if cfg.flavour == "gpt2":
        if cfg.n_kv_heads != cfg.n_heads:
            raise TokenmillError("export-hf: GPT-2 has no grouped-query attention; use the llama flavour")
        tensors, make_config = gpt2_state_dict(model), gpt2_config
    elif cfg.flavour == "llama":
        tensors, make_config = llama_state_dict(model), llama_config
    else:
        raise TokenmillError(f"export-hf: unknown flavour {cfg.flavour!r}")
    outdir.mkdir(parents=True, exist_ok=True)
    tokenizer = meta.get("tokenizer")
    special = _special_tokens(tokenizer, meta.get("eod_id"))
    # safetensors refuses shared or non-contiguous storage: give every tensor its own copy.
    save_file(
        {k: v.detach().contiguous().clone() for k, v in tensors.items()},
        str(outdir / "model.safetensors"),
        metadata={"format": "pt", "source": "tokenmill", "step": str(meta.get("step"))},
    )
    (outdir / "config.json").write_text(json.dumps(make_config(cfg, special), indent=2) + "\n")
    _copy_tokenizer(tokenizer, outdir, special)
    return outdir
