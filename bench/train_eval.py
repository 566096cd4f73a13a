"""Bench: the cost of evaluation during training (the `eval:` section), as a share of training time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_eval.py [--steps 20] [--seq-len 512]
        [--global-batch 64] [--limit 50] [--every 1000] [--out bench/results/train_eval.txt]

One run of `tokenmill train` on the CPU (the tiny preset, a byte-level BPE of 2048 tokens trained
here on the shared Shakespeare text) with the whole CORE suite (`--limit` examples per task, the
shared files under ../shared/data/eval/icl) and bits per byte of 20 WikiText documents, scored
once, at the last step. A step's time is the median of the rows' tokens per second (the
evaluation falls outside them); the evaluation's is the row's `eval/seconds`. The share at an
interval of N steps is eval / (N x step + eval). Both the step and the evaluation are forward
passes of the same model, so the share depends mostly on the tokens a step trains on against
the tokens the suite reads: give `--seq-len` and `--global-batch` of the run to estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "tests" / "train"))


def build_data(work: Path) -> tuple[Path, Path]:
    """A BPE shard of Shakespeare (its tokenizer named in PREFIX.json) and held-out WikiText."""
    import pandas as pd
    from shard_files import text_documents, write_shard
    from tokenizers import Tokenizer

    from tokenmill.tokenize.tokenizer import EOD_TOKEN, train_tokenizer

    docs = [d.decode() for d in text_documents(SHARED / "corpus" / "tinyshakespeare.txt", 300_000)]
    (work / "docs").mkdir()
    pd.DataFrame({"id": [str(i) for i in range(len(docs))], "text": docs, "source": "shakespeare"}).to_parquet(
        work / "docs" / "part-0.parquet"
    )
    tok_path = train_tokenizer(work / "docs", 2048, work / "tokenizer.json")
    tok = Tokenizer.from_file(str(tok_path))
    ids = [np.array(e.ids, dtype=np.uint16) for e in tok.encode_batch(docs)]
    shard = write_shard(
        work / "shard", ids, eod=tok.token_to_id(EOD_TOKEN), vocab_size=tok.get_vocab_size(), tokenizer=str(tok_path)
    )
    text = (SHARED / "corpus" / "wikitext2_valid.txt").read_text()
    held = [d.strip() for d in text.split("\n\n") if len(d.strip()) > 200][:20]
    held_out = work / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"text": d}) + "\n" for d in held))
    return shard, held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--limit", type=int, default=50, help="examples per task (the eval section's default)")
    parser.add_argument("--every", type=int, default=1000, help="the interval to give the share at (the default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from tokenmill.cli import main as tokenmill
    from tokenmill.train.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shard, held_out = build_data(work)
        config = {
            "model": {"preset": "tiny", "max_seq_len": args.seq_len},
            "dataset": {"path": str(shard), "seq_len": args.seq_len},
            "schedule": {"steps": args.steps, "global_batch_size": args.global_batch, "micro_batch_size": args.micro_batch},
            "parallel": {"device": "cpu"},
            "logging": {"interval": 1, "tensorboard": False, "progress": False},
            "eval": {"every": args.steps, "suite": "core", "data_dir": str(SHARED / "eval" / "icl"),
                     "limit": args.limit, "bpb": str(held_out)},
        }  # fmt: skip
        (work / "train.yaml").write_text(yaml.safe_dump(config))
        if tokenmill(["train", str(work / "train.yaml"), "--out", str(work / "run")]) != 0:
            raise SystemExit("training failed")
        rows = read_metrics(work / "run")
    tokens = args.global_batch * args.seq_len
    step_s = statistics.median(tokens / r["tokens_per_s"] for r in rows if r.get("tokens_per_s"))
    scored = [r for r in rows if "eval/seconds" in r]
    eval_s = scored[-1]["eval/seconds"]
    share = eval_s / (args.every * step_s + eval_s)
    lines = [
        f"$ bench/train_eval.py --steps {args.steps} --seq-len {args.seq_len} --global-batch {args.global_batch} "
        f"--micro-batch {args.micro_batch} --limit {args.limit} --every {args.every}",
        f"model: tiny preset (2 layers, hidden 64), vocab 2048, CPU, {os.environ.get('OMP_NUM_THREADS', 'default')} "
        f"thread(s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        f"step: {tokens} tokens, median {step_s:.3f} s",
        f"evaluation: CORE ({len([k for k in scored[-1] if k.endswith('/centered_acc')])} tasks present, "
        f"{args.limit} examples each) + bits per byte of 20 documents: {eval_s:.1f} s "
        f"(eval/core {scored[-1].get('eval/core', float('nan')):.4f}, eval/bpb {scored[-1]['eval/bpb']:.3f})",
        f"share of training time, every {args.every} steps: {share:.2%}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
