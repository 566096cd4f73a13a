"""Step-time stall of synchronous against asynchronous checkpoints, same model and data.

    python bench/checkpoint.py [--layers 6] [--hidden 768] [--steps 16] [--interval 4]

Both runs are `tokenmill train` on the same config (a GPT big enough that its checkpoint,
weights plus AdamW moments, takes seconds to write on a CPU), each in its own process; only
`checkpoint.async_save` differs. A step's time comes from metrics.jsonl (tokens / tokens_per_s:
the time between two logged steps); the save made after step k is paid in step k+1's time.
The stall of a save is that step's time minus the median time of steps that follow no save.
The final checkpoint (after the last step, waited for by both) is not in any step's time.
Prints the stall per save for each mode, the ratio async / sync, and each run's peak memory
(async holds a host copy of the state while it writes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from measure import check_load

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))


def make_shard(prefix: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from conftest import text_documents, write_shard  # the test suite's shard writer

    write_shard(prefix, text_documents(SHARED / "corpus" / "tinyshakespeare.txt"))


def run(args: argparse.Namespace, shard: Path, out: Path, async_save: bool) -> dict:
    config = {
        "model": {
            "preset": "tiny",
            "vocab_size": 512,
            "max_seq_len": args.seq_len,
            "n_layers": args.layers,
            "hidden": args.hidden,
            "n_heads": args.hidden // 64,
        },
        "out": str(out),
        "dataset": {"path": str(shard), "seq_len": args.seq_len},
        "schedule": {"steps": args.steps, "global_batch_size": args.batch, "warmup_steps": 2},
        "parallel": {"device": "cpu"},
        "checkpoint": {"interval": args.interval, "keep_last": 2, "async_save": async_save},
        "logging": {"interval": 1, "tensorboard": False, "progress": False},
    }
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "train", str(path)], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tokens = args.batch * args.seq_len
    times = {r["step"]: tokens / r["tokens_per_s"] for r in rows}
    after_save = [s for s in times if s > 1 and (s - 1) % args.interval == 0]
    plain = [t for s, t in times.items() if s > 2 and s not in after_save]  # steps 1-2: warm-up
    base = statistics.median(plain)
    return {
        "step_s": base,
        "stalls": [times[s] - base for s in after_save],
        "wall_s": wall,
        "peak_gib": max(r["memory_gib"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    check_load()

    from tokenmill.train.model_config import preset

    model = preset("tiny", vocab_size=512, n_layers=args.layers, hidden=args.hidden, n_heads=args.hidden // 64)
    params = model.num_params()
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard"
        make_shard(shard)
        results = {}
        for mode in ("sync", "async"):
            results[mode] = run(args, shard, Path(tmp) / mode, async_save=mode == "async")
            size = sum(f.stat().st_size for f in (Path(tmp) / mode / "checkpoints").rglob("*") if f.is_file())
            results[mode]["checkpoint_mib"] = size / 2 / 2**20  # keep_last 2 checkpoints on disk
    print(
        f"model: gpt2 layers={args.layers} hidden={args.hidden} vocab=512"
        + f" ({params / 1e6:.0f}M parameters)"
        + f", seq={args.seq_len} batch={args.batch}, {args.steps} steps, a checkpoint every {args.interval}"
        f" ({results['sync']['checkpoint_mib']:.0f} MiB each), cpu, {args.threads} thread(s)"
    )
    for mode, r in results.items():
        stalls = ", ".join(f"{s:.2f}" for s in r["stalls"])
        print(
            f"{mode:5}  step {r['step_s']:.2f} s  stall per save {statistics.mean(r['stalls']):.2f} s "
            f"(saves: {stalls})  run {r['wall_s']:.1f} s  peak memory {r['peak_gib']:.2f} GiB"
        )
    ratio = statistics.mean(results["async"]["stalls"]) / statistics.mean(results["sync"]["stalls"])
    print(f"ratio stall async / sync: {ratio:.3f}")


if __name__ == "__main__":
    main()
