"""Bench: how much CORE moves between training seeds of one small model, against the sampling
error of its examples.

    OMP_NUM_THREADS=1 .venv/bin/python bench/core_noise.py [--seeds 1,2,3] [--steps 200] [--limit 50]
        [--out bench/results/core_noise.txt]

The same model (the demo's shape: 4 layers, hidden 128, 4 heads, 512 positions, 1.4M parameters
with its 2048-token vocabulary) is trained on the same data (WikiText-2's valid and test
articles, ingested, a 2048-token BPE trained and the shards encoded by `tokenmill curate` and
`tokenmill tokenize`) once per seed. `schedule.seed` sets both the initialisation and the order
of the samples, so the runs differ in both. Each run's last checkpoint is scored on the CORE
tasks whose files are in the shared ICL folder (../shared/data/eval/icl), the first `--limit`
examples of each, the same examples for every seed.

The report gives, per task and for CORE (the mean centered accuracy): each seed's score, their
mean, sample standard deviation and range (the spread due to training alone, the examples
being the same), and the binomial standard error sqrt(p (1 - p) / n) at the mean accuracy p
over the n examples (the sampling error of the examples, what the `±` of `tokenmill eval`
shows); for CORE, that error combined over the tasks as `tokenmill eval` combines it.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

from measure import check_load

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT))

VOCAB = 2048
MODEL = {"preset": "tiny", "n_layers": 4, "hidden": 128, "n_heads": 4, "max_seq_len": 512}


def prepare_shards(workdir: Path) -> Path:
    """WikiText-2 valid + test articles -> documents -> a BPE tokenizer -> shards (kept between runs)."""
    from tokenmill.cli import main

    prefix = workdir / "shards" / "wiki"
    if prefix.with_suffix(".json").exists():
        return prefix
    corpus = SHARED / "corpus"
    inputs = [str(corpus / "wikitext2_valid.txt"), str(corpus / "wikitext2_test.txt")]
    docs, tokenizer = workdir / "docs", workdir / "tokenizer.json"
    steps = [
        [
            "curate",
            "ingest",
            "--input",
            *inputs,
            "--separator",
            "^(?= = [^=])",
            "--output",
            str(docs),
            "--workers",
            "1",
        ],
        ["tokenize", "train-tokenizer", "--input", str(docs), "--vocab-size", str(VOCAB), "--output", str(tokenizer)],
        [
            "tokenize",
            "encode",
            "--input",
            str(docs),
            "--tokenizer",
            str(tokenizer),
            "--output-prefix",
            str(prefix),
            "--workers",
            "1",
        ],
    ]
    for argv in steps:
        if main([*argv, "--no-progress"]) != 0:
            raise SystemExit(f"tokenmill {' '.join(argv[:2])} failed")
    return prefix


def train_seed(workdir: Path, shards: Path, seed: int, steps: int) -> tuple[Path, float, float]:
    """One run of `steps` steps with `seed`: its directory, final loss and training seconds."""
    import yaml

    from tokenmill.cli import main
    from tokenmill.train.metrics import read_metrics

    run = workdir / f"seed{seed}-{steps}steps"
    config = workdir / f"seed{seed}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": MODEL,
                "dataset": {"path": str(shards), "seq_len": 128, "split": "100,0,0"},
                "schedule": {
                    "steps": steps,
                    "global_batch_size": 16,
                    "warmup_steps": steps // 10,
                    "decay_style": "cosine",
                    "seed": seed,
                },
                "optimizer": {"lr": 2.0e-3, "min_lr": 2.0e-4, "weight_decay": 0.1, "clip_grad": 1.0},
                "parallel": {"device": "cpu", "precision": "fp32"},
                "logging": {"interval": steps, "eval_interval": 0, "tensorboard": False, "progress": False},
                "checkpoint": {"interval": 0},
            }
        )
    )
    start = time.perf_counter()
    if not (run / "checkpoints").is_dir():
        if main(["train", str(config), "--out", str(run)]) != 0:
            raise SystemExit(f"training seed {seed} failed")
    seconds = time.perf_counter() - start
    return run, read_metrics(run)[-1]["loss"], seconds


def binomial_stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds (schedule.seed)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of each run (16 x 128 tokens each)")
    parser.add_argument("--limit", type=int, default=50, help="the first N examples of each CORE task")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp" / "core_noise")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "core_noise.txt")
    args = parser.parse_args()
    load_line = check_load()

    from tokenmill.eval.models import load_model
    from tokenmill.eval.suites import load_suite, load_suite_data, score_suite

    seeds = [int(s) for s in args.seeds.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    shards = prepare_shards(args.workdir)
    data = load_suite_data(load_suite("core"), SHARED / "eval" / "icl")
    results, lines_per_seed = [], []
    for seed in seeds:
        run, loss, train_seconds = train_seed(args.workdir, shards, seed, args.steps)
        start = time.perf_counter()
        result = score_suite(load_model(run), data, args.limit, args.batch_size, progress=False)
        results.append(result)
        line = (
            f"seed {seed}: final loss {loss:.3f} (trained in {train_seconds:.0f} s), {result.aggregate_label} "
            f"{result.aggregate_value:.4f} (scored in {time.perf_counter() - start:.0f} s)"
        )
        print(line, flush=True)
        lines_per_seed.append(line)

    tasks = [r.task for r in results[0].tasks]
    label = results[0].aggregate_label
    head = f"{'task':<34}{'n':>5}{'base':>6}" + "".join(f"{'seed ' + str(s):>9}" for s in seeds)
    head += f"{'mean':>9}{'sd':>8}{'range':>8}{'binom se':>10}"
    table = [head]
    centered_errors = []
    for index, task in enumerate(tasks):
        accuracies = [r.tasks[index].accuracy for r in results]
        n = len(results[0].tasks[index].correct)
        mean = statistics.mean(accuracies)
        stderr = binomial_stderr(mean, n)
        centered_errors.append(stderr / (1 - task.random_baseline / 100))
        table.append(
            f"{task.label:<34}{n:>5}{task.random_baseline:>6.0f}"
            + "".join(f"{a:>9.4f}" for a in accuracies)
            + f"{mean:>9.4f}{statistics.stdev(accuracies):>8.4f}{max(accuracies) - min(accuracies):>8.4f}{stderr:>10.4f}"
        )
    core = [r.aggregate_value for r in results]
    core_stderr = math.sqrt(sum(e * e for e in centered_errors)) / len(centered_errors)
    table.append(
        f"{label + ' (centered)':<34}{'':>5}{'':>6}"
        + "".join(f"{c:>9.4f}" for c in core)
        + f"{statistics.mean(core):>9.4f}{statistics.stdev(core):>8.4f}{max(core) - min(core):>8.4f}{core_stderr:>10.4f}"
    )
    lines = [
        load_line,
        f"model: tokenmill tiny preset, 4 layers, hidden 128, 4 heads, 512 positions, vocab {VOCAB}; "
        f"{args.steps} steps of 16 x 128 tokens ({args.steps * 16 * 128 / 1e6:.2f}M tokens) of WikiText-2 "
        f"(valid + test), seeds {args.seeds} (initialisation and sample order); CPU, "
        f"{os.environ.get('OMP_NUM_THREADS', 'default')} thread(s); CORE tasks present in the shared ICL folder, "
        f"the first {args.limit} examples of each (the same for every seed)",
        *lines_per_seed,
        "acc per task (base: random baseline, %); sd: sample standard deviation over the seeds; "
        "binom se: sqrt(p(1-p)/n) at the mean accuracy (for CORE: the tasks' centered errors combined)",
        *table,
        check_load("at the end"),
    ]
    print("\n".join(lines[len(lines_per_seed) + 2 :]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
