"""float8 training (`parallel.float8`): the model's Linear layers become torchao's `Float8Linear`
with tensorwise dynamic scaling, applied from outside the model as torchtitan's float8
converter does, before compile and FSDP.

Left in high precision, as torchtitan leaves them: the output head (its large vocabulary
dimension is where float8 rounding hurts the loss most, and a tied head shares the embedding's
weight), the embeddings (lookups, not matmuls), and any Linear whose input or output size is
not a multiple of 16 (the float8 matmul kernels need it).
"""

from __future__ import annotations

from torch import nn

from tokenmill.errors import ConfigError

# Kept in high precision by name (the last component of the module's fully qualified name).
SKIPPED_MODULES = ("output",)


def keep_for_float8(module: nn.Module, fqn: str) -> bool:
    """torchao's module filter: True for a Linear that becomes Float8Linear."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in SKIPPED_MODULES:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, emulate: bool | None = None) -> int:
    """Swap `model`'s eligible Linear layers for torchao's Float8Linear (tensorwise scaling), in
    place; returns how many were converted. Works on a meta-device model (no weights read).
    `emulate` (default: when the model is on the CPU) rounds through float8 but multiplies in
    high precision: CPUs have no fast float8 matmul, so that is how a CPU run checks the path."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:  # optional dependency: only float8 runs need it
        raise ConfigError("parallel.float8: float8 training needs torchao; install it (pip install torchao)") from None
    if emulate is None:
        emulate = any(p.device.type == "cpu" for p in model.parameters())
    convert_to_float8_training(model, module_filter_fn=keep_for_float8, config=Float8LinearConfig(emulate=emulate))
    return sum(1 for m in model.modules() if isinstance(m, Float8Linear))
