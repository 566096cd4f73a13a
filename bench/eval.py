"""Bench: `tokenmill eval` examples/s against lm-evaluation-harness 0.4.x, same model, task, batch size.

    OMP_NUM_THREADS=1 .venv/bin/python bench/eval.py [--limit 100] [--batch-size 16] [--threads 1]
        [--device cpu|cuda] [--out bench/results/eval.txt]
    .venv/bin/python bench/eval.py --threads auto --load 2 --out bench/results/eval_loaded.txt

`--load N` runs N busy processes beside the measurement, as on a shared machine; with
`--threads auto` each tool takes the threads it takes by default: ours the cores free now
(`tokenmill eval`'s default, tokenmill/infra/cpu.py), the harness torch's (one per core).

Model: a randomly initialised GPT-2 (transformers; no weights can be downloaded here) with a
byte-level BPE trained on the shared WikiText-2 + Shakespeare text, both saved to a local
directory that both tools load in float32 on `--device` (the CPU by default; `--device cuda`:
ours and the harness's HFLM both on the GPU, as bench/gpu_check.sh runs it). Tasks: the shared benchmark files
(../shared/data/eval), the first `--limit` documents, zero- and few-shot; ARC, OpenBookQA, Social
IQa, COPA, CommonsenseQA and WSC273 from files in their Hugging Face schemas rebuilt from the
shared ICL files (tests/eval/hub_exports.py; COPA has 76 documents to evaluate). `--tasks` picks
some of the cases. The harness runs
in-process through `lm_eval.simple_evaluate` on an `HFLM` and a `TaskManager` built once (not
timed), on
its own task YAMLs pointed at the same local files (tests/eval/harness_ref.py); its dataset
cache is warmed first. Each side is timed from reading the task data to the aggregated metrics
(both compute the bootstrap perplexity stderr with the harness's 100,000 replicates), the median
of `--repeat` runs that alternate between the tools, since the machine is shared. Scores of
both are printed next to each other: they must be equal.
"""

from __future__ import annotations

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import subprocess
import sys
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from measure import Timing, check_load  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DISABLE_MULTIPROC", "1")  # the harness's bootstrap: one process, like ours
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT))  # tests/eval/harness_ref.py, as the package tests.eval

CASES = [
    ("piqa", 0),
    ("piqa", 5),
    ("boolq", 0),
    ("winogrande", 5),
    ("lambada_openai", 0),
    ("arc_easy", 0),
    ("arc_challenge", 5),
    ("openbookqa", 0),
    ("social_iqa", 0),
    ("copa", 5),
    ("commonsense_qa", 0),
    ("wsc273", 0),
]


def build_model(out: Path, vocab: int, hidden: int, layers: int, heads: int) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    if (out / "model.safetensors").exists():
        return out
    corpus = SHARED / "corpus"
    texts = [
        (corpus / n).read_text(encoding="utf-8")
        for n in ("wikitext2_valid.txt", "wikitext2_test.txt", "tinyshakespeare.txt")
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>").save_pretrained(
        out
    )
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=1024,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(cfg).save_pretrained(out)
    return out


def device_name(device: str) -> str:
    """'CPU', or the GPU's name and torch's version, for the result file's header."""
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (torch {torch.__version__})"
    return "CPU"


def run_ours(
    model, task_name: str, shots: int, data_dir: Path, limit: int, batch_size: int
) -> tuple[float, dict[str, float], int]:
    from tokenmill.eval.evaluator import evaluate_task, load_task_data
    from tokenmill.eval.tasks import get_task

    start = time.perf_counter()
    task = get_task(task_name)
    data = load_task_data(task, data_dir, limit, need_pool=shots > 0)
    result = evaluate_task(model, task, shots, data, batch_size=batch_size, progress=False)
    seconds = time.perf_counter() - start
    return seconds, {r["metric"]: r["value"] for r in result.rows}, len(data.docs)


def run_harness(lm, task_manager, task_name: str, shots: int, limit: int) -> tuple[float, dict[str, float]]:
    import lm_eval

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=[f"tm_{task_name}"],
            num_fewshot=shots,
            limit=limit,
            task_manager=task_manager,
            log_samples=False,
        )
    seconds = time.perf_counter() - start
    res = out["results"][f"tm_{task_name}"]
    return seconds, {k.split(",")[0]: v for k, v in res.items() if "," in k and "stderr" not in k}


@contextlib.contextmanager
def busy_processes(n: int):
    """`n` processes spinning on a core each, until the block ends; waits (up to 90 s) for the
    1-minute load average to show them, since that is what a default thread count reads."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        deadline = time.monotonic() + 90
        while n and os.getloadavg()[0] < n - 0.5 and time.monotonic() < deadline:
            time.sleep(2)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--tasks", default=None, help="comma-separated tasks: only their cases (default: every case)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--threads",
        default="1",
        help="torch threads for both tools, or 'auto': each tool's default (ours: the cores free now; the harness: one per core)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of both tools' model, e.g. cuda (default cpu)")
    parser.add_argument("--load", type=int, default=0, help="busy processes running beside the measurement")
    parser.add_argument("--repeat", type=int, default=2, help="best of N alternating runs (the machine is shared)")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp" / "eval")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eval.txt")
    args = parser.parse_args()
    machine_load = check_load()  # before --load's busy processes start

    import torch

    from tokenmill.infra.cpu import free_cores

    harness_default = torch.get_num_threads()
    with busy_processes(args.load):
        if args.threads == "auto":
            ours_threads, harness_threads = free_cores(), harness_default
        else:
            ours_threads = harness_threads = int(args.threads)
        return measure(args, ours_threads, harness_threads, machine_load)


def measure(args: argparse.Namespace, ours_threads: int, harness_threads: int, machine_load: str) -> int:
    import torch

    logging.disable(logging.WARNING)
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from tests.eval.harness_ref import write_reference_tasks
    from tokenmill.eval.models import load_model

    model_dir = build_model(
        args.workdir / f"gpt2-{args.hidden}x{args.layers}-v{args.vocab}",
        args.vocab,
        args.hidden,
        args.layers,
        args.heads,
    )
    task_dir = args.workdir / "harness_tasks"
    references = write_reference_tasks(SHARED / "eval", task_dir, n_exported=args.limit)
    cases = [(name, shots) for name, shots in CASES if not args.tasks or name in args.tasks.split(",")]
    ours_model = load_model(model_dir, device=args.device)
    with contextlib.redirect_stderr(io.StringIO()):
        lm = HFLM(pretrained=str(model_dir), dtype="float32", batch_size=args.batch_size, device=args.device)
    # The task index (a scan of every harness YAML) is built once, outside the timings.
    task_manager = TaskManager(include_path=str(task_dir))
    for name, _ in cases:  # warm the harness's dataset cache (json -> arrow) before timing
        run_harness(lm, task_manager, name, 0, 1)

    n_params = sum(p.numel() for p in ours_model.model.parameters())
    lines = [
        machine_load,
        f"model: random GPT-2, hidden {args.hidden}, {args.layers} layers, vocab {ours_model.model.config.vocab_size}, "
        f"{n_params / 1e6:.1f}M params, float32, {device_name(args.device)}, threads: ours {ours_threads}, lm-eval {harness_threads};"
        f" {args.load} busy process(es) beside; batch size {args.batch_size}; "
        f"first {args.limit} docs; the median of {args.repeat} alternating runs (spread: slowest - fastest over median)",
        f"{'task':<16}{'shots':>5}{'ours ex/s':>11}{'lm-eval ex/s':>14}{'ratio':>7}  scores (ours | lm-eval)",
    ]
    print("\n".join(lines), flush=True)
    total_ours = total_theirs = 0.0
    for name, shots in cases:
        ours_seconds, theirs_seconds = [], []
        for _ in range(args.repeat):  # alternate the tools so that load changes hit both alike
            torch.set_num_threads(ours_threads)
            t, s_ours, n = run_ours(ours_model, name, shots, references[name][1], args.limit, args.batch_size)
            ours_seconds.append(t)
            torch.set_num_threads(harness_threads)
            t, s_theirs = run_harness(lm, task_manager, name, shots, args.limit)
            theirs_seconds.append(t)
        ours_timing, theirs_timing = Timing(ours_seconds), Timing(theirs_seconds)
        t_ours, t_theirs = ours_timing.median, theirs_timing.median
        total_ours += t_ours
        total_theirs += t_theirs
        fmt = lambda s: " ".join(f"{k}={v:.6g}" for k, v in sorted(s.items()))  # noqa: E731
        line = (
            f"{name:<16}{shots:>5}{n / t_ours:>11.2f}{n / t_theirs:>14.2f}{t_theirs / t_ours:>6.2f}x  "
            f"{fmt(s_ours)} | {fmt(s_theirs)}  (spread {ours_timing.spread:.0%} | {theirs_timing.spread:.0%})"
        )
        print(line, flush=True)
        lines.append(line)
    summary = (
        f"overall: ours {total_ours:.1f} s, lm-eval {total_theirs:.1f} s, ratio {total_theirs / total_ours:.2f}x "
        f"(load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print(summary)
    lines.append(summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
