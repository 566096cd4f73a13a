"""What pretraining people watch, written three ways: console, metrics.jsonl, TensorBoard."""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.infra.atomic import atomic_write_text

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s per GPU (no sparsity), for MFU when `peak_tflops` is not given; the
# first key found in the device's name wins, so the PCIe H100 comes before the SXM one.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM (and NVL's per-GPU dense figure is close: 835; name it with --peak-tflops)
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "V100": 125e12,
}
# float8 tensor cores run twice the bf16 rate on the GPUs that have them (Hopper, Ada).
FLOAT8_GPUS = ("H200", "H100", "L40S")
_warned_unknown: set[str] = set()


def device_peak_flops(name: str, float8: bool = False) -> float | None:
    """The dense peak FLOP/s of the GPU called `name` (torch.cuda.get_device_name), in bf16 or,
    with `float8`, in fp8 (twice bf16 on GPUs with float8 tensor cores); None when unknown."""
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            if float8:
                return 2 * value if any(gpu in name for gpu in FLOAT8_GPUS) else None
            return value
    return None


def peak_flops(device: torch.device, configured_tflops: float | None, float8: bool = False) -> float | None:
    """Peak FLOP/s for MFU: `configured_tflops` when given, else the device's own (a CUDA
    device not in the table warns once, naming --peak-tflops; the CPU has none)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    peak = device_peak_flops(name, float8)
    if peak is None and name not in _warned_unknown:
        _warned_unknown.add(name)
        kind = "fp8" if float8 else "bf16"
        log.warning(
            f"no known {kind} peak for {name!r}: MFU is not reported; pass --peak-tflops "
            f"(logging.peak_tflops) with its dense {kind} TFLOP/s"
        )
    return peak


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated accelerator memory, or the process's peak resident set on the CPU."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


class MetricsLogger:
    """Appends one JSON object per logged step; mirrors scalars to TensorBoard."""

    def __init__(
        self, run_dir: Path, enabled: bool = True, tensorboard: bool = True, start_step: int | None = None
    ) -> None:
        """``start_step``: the step training starts from; rows (and TensorBoard events) of
        later steps, left by an attempt that ran past its last checkpoint, are dropped first."""
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._file = None
        self._tb = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if start_step is not None:
            truncate_metrics(self.path, start_step)
        self._file = open(self.path, "a")  # append: a resumed run continues the same file
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = {"purge_step": start_step + 1} if start_step is not None else {}
                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), **purge)
            except ImportError:  # tensorboard is a dependency, but keep training without it
                self._tb = None

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled or self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            step = int(record["step"])
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    # Validation and evaluation scores are their own TensorBoard sections.
                    tag = key if key.startswith(("val", "eval/")) else f"train/{key}"
                    self._tb.add_scalar(tag, value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the rows of ``path`` with step <= last_step (and only whole JSON lines: a killed
    writer may leave half of one); replaced atomically, so a crash here loses nothing."""
    if not path.is_file():
        return
    kept, changed = [], False
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            keep = int(record["step"]) <= last_step
        except (ValueError, KeyError, TypeError):
            keep = False
        changed |= not keep
        if keep:
            kept.append(line + "\n")
    if not changed:
        return
    atomic_write_text(path, "".join(kept))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` ([] when there is none), one per step in step
    order. A line cut by a killed writer is skipped; when a step was logged twice (a resumed
    run re-logs the steps after its checkpoint) its rows are merged, the later winning."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[Any, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        by_step[record.get("step")] = {**by_step.get(record.get("step"), {}), **record}
    return [by_step[k] for k in sorted(by_step, key=lambda s: (s is None, s))]


def format_record(record: dict[str, Any]) -> str:
    parts = [f"step {record['step']}"]
    for key, fmt in (
        ("loss", "{:.4f}"),
        ("val_loss", "{:.4f}"),
        ("lr", "{:.3e}"),
        ("grad_norm", "{:.3f}"),
        ("batch_size", "{}"),
        ("tokens_per_s", "{:.0f}"),
        ("mfu", "{:.1%}"),
        ("memory_gib", "{:.2f}"),
    ):
        if key in record and record[key] is not None:
            parts.append(f"{key} " + fmt.format(record[key]))
    # The evaluation's headline scores (a suite's aggregate, bits per byte), not every task's.
    parts += [f"{key} {value:.4f}" for key, value in record.items() if key.count("/") == 1 and key.startswith("eval/")]
    return " | ".join(parts)
