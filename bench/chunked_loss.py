"""Memory and time of the output head + cross-entropy, plain (`F.cross_entropy` of the whole
logits) and chunked (`tokenmill.train.chunked_loss`, parallel.loss_chunk_tokens), on the CPU.

Two measurements:

- what the forward pass keeps for the backward pass at the full size (Llama 3's vocabulary
  128256, hidden 2048, 8192 tokens by default), counted by torch's saved-tensor hooks on the
  meta device (exact sizes, nothing computed);
- loss + backward run for real at `--measure-tokens` tokens (a full-size matmul takes minutes
  on a CPU), each round in a fresh process for its peak RSS above what the inputs hold, plain
  and chunked in alternating order, their seconds as median and spread.

    python bench/chunked_loss.py --out bench/results/chunked_loss.txt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.measure import Timing, check_load, emit_report, peak_rss_mib  # noqa: E402

PATHS = ("plain", "chunked")


def loss(path: str, hidden, weight, labels, chunk_tokens: int):
    import torch.nn.functional as F

    from tokenmill.train.chunked_loss import chunked_cross_entropy

    if path == "plain":
        return F.cross_entropy((hidden @ weight.t()).float(), labels)
    return chunked_cross_entropy(hidden, weight, labels, chunk_tokens)


def saved_bytes(path: str, tokens: int, hidden_size: int, vocab: int, chunk_tokens: int) -> int:
    """Bytes the forward pass saves for the backward pass, beyond the inputs themselves."""
    import torch

    hidden = torch.empty(tokens, hidden_size, device="meta", requires_grad=True)
    weight = torch.empty(vocab, hidden_size, device="meta", requires_grad=True)
    labels = torch.empty(tokens, dtype=torch.long, device="meta")
    inputs = {id(hidden), id(weight), id(labels)}
    seen: dict[int, int] = {}

    def pack(tensor):
        if id(tensor) not in inputs and tensor._base is None:
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss(path, hidden, weight, labels, chunk_tokens)
    return sum(seen.values())


def worker(path: str, tokens: int, hidden_size: int, vocab: int, chunk_tokens: int) -> None:
    """One loss + backward; prints its seconds and its peak RSS above the inputs' (MiB)."""
    import torch

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=g, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, generator=g) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    # The gradients' buffers are the same for both paths: allocate them before the baseline.
    hidden.grad, weight.grad = torch.zeros_like(hidden), torch.zeros_like(weight)
    torch.ones(1) @ torch.ones(1)  # load the matmul kernels before the baseline
    baseline = current_rss_mib()
    start = time.perf_counter()
    loss(path, hidden, weight, labels, chunk_tokens).backward()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mib": peak_rss_mib() - baseline}))


def current_rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the saved-tensor count")
    parser.add_argument("--measure-tokens", type=int, default=512, help="tokens of the timed runs")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, *sizes = args.worker
        worker(name, *map(int, sizes))
        return

    lines = [check_load()]
    mib = 2**20
    lines.append(
        f"saved for backward at {args.tokens} tokens, vocab {args.vocab}, hidden {args.hidden}, "
        f"chunks of {args.chunk_tokens} tokens (fp32, meta device):"
    )
    for name in PATHS:
        lines.append(
            f"  {name:8s} {saved_bytes(name, args.tokens, args.hidden, args.vocab, args.chunk_tokens) / mib:10.2f} MiB"
        )
    fp32_logits = args.tokens * args.vocab * 4
    chunk_logits = fp32_logits * args.chunk_tokens / args.tokens
    lines.append(f"  (the whole fp32 logits: {fp32_logits / mib:.0f} MiB; one chunk's: {chunk_logits / mib:.0f} MiB)")

    sizes = [str(v) for v in (args.measure_tokens, args.hidden, args.vocab, args.chunk_tokens)]
    seconds: dict[str, list[float]] = {name: [] for name in PATHS}
    peaks: dict[str, list[float]] = {name: [] for name in PATHS}
    for round_index in range(args.repeat):
        # Alternate which path goes first, so neither always runs on the warmer machine.
        for name in PATHS if round_index % 2 == 0 else PATHS[::-1]:
            command = [sys.executable, __file__, "--worker", name, *sizes]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            seconds[name].append(result["seconds"])
            peaks[name].append(result["peak_mib"])
    lines.append(
        f"loss + backward run at {args.measure_tokens} tokens (one thread per process as the machine gives it), "
        f"{args.repeat} rounds, alternating:"
    )
    timings = {name: Timing(seconds[name]) for name in PATHS}
    for name in PATHS:
        lines.append(f"  {name:8s} {timings[name]}; peak RSS above the inputs {max(peaks[name]):.0f} MiB")
    lines.append(f"  chunked / plain time: {timings['chunked'].median / timings['plain'].median:.2f}")
    lines.append(check_load("after the run"))
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
