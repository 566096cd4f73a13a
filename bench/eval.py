"""Bench: `tokenmill eval` examples/s against lm-evaluation-harness 0.4.x, same model, task, batch size;
with `--suite core`, the ICL suite against the reference implementation of llm-foundry's protocol.

    OMP_NUM_THREADS=1 .venv/bin/python bench/eval.py [--limit 100] [--batch-size 16] [--threads 1]
        [--device cpu|cuda] [--out bench/results/eval.txt]
    .venv/bin/python bench/eval.py --threads auto --load 2 --out bench/results/eval_loaded.txt
    OMP_NUM_THREADS=1 .venv/bin/python bench/eval.py --suite core --limit 20 --hidden 128 --layers 2 \
        --heads 2 --vocab 4096 --repeat 3 --out bench/results/eval_icl.txt

`--load N` runs N busy processes beside the measurement, as on a shared machine; with
`--threads auto` each tool takes the threads it takes by default: ours the cores free now
(`tokenmill eval`'s default, tokenmill/infra/cpu.py), the harness torch's (one per core).

Model: a randomly initialised GPT-2 (transformers; no weights can be downloaded here) with a
byte-level BPE trained on the shared WikiText-2 + Shakespeare text, both saved to a local
directory that both tools load in `--dtype` (float32 by default) on `--device` (the CPU by
default; `--device cuda`: ours and the harness's HFLM both on the GPU, as bench/gpu_check.sh
runs it). `--arch llama` builds a Llama of the given shape instead, `--arch llama-1b` one of
Llama 3.2 1B's shape (hidden 2048, 16 layers, 32 heads, 8 key/value heads, MLP 8192, tied
embeddings; 1.0B parameters with the BPE's 16384 tokens), which bench/gpu_check.sh scores in
bf16 on 1,000 documents per task. Tasks: the shared benchmark files
(../shared/data/eval), the first `--limit` documents, zero- and few-shot; ARC, OpenBookQA, Social
IQa, COPA, CommonsenseQA and WSC273 from files in their Hugging Face schemas rebuilt from the
shared ICL files (tests/eval/hub_exports.py; COPA has 76 documents to evaluate). `--tasks` picks
some of the cases. The harness runs
in-process on an `HFLM` and a `TaskManager` built once (not timed), on its own task YAMLs
pointed at the same local files (tests/eval/harness_ref.py); its dataset cache is warmed first.
Its timing is what `lm_eval.simple_evaluate` does up to the aggregated metrics (seeds, task
loading, `evaluate`), not the environment report simple_evaluate adds after them. Each side is timed from reading the task data to the aggregated metrics
(both compute the bootstrap perplexity stderr with the harness's 100,000 replicates), the median
of `--repeat` runs that alternate between the tools, since the machine is shared. Scores of
both are printed next to each other: they must be equal.

`--suite NAME` (a bundled suite such as `core`, or a suite file) times each of its tasks whose
file is in the shared ICL folder (../shared/data/eval/icl) instead: tokenmill's
`read_examples` + `score_task` (batched, a shared prefix's key/value cache, logits only at the
continuation) against the reference of tests/eval/icl_ref.py (written from llm-foundry's and
DCLM's code, independent of tokenmill: its own prompts and one unbatched forward pass of the
`transformers` model per input), each from reading the task file to the outcome of every
example, on the same model. Rounds interleave the two (bench/measure.py `interleaved`,
alternating which goes first); the median of `--repeat` rounds counts. Every example's outcome
must be the same on both sides (the bench stops otherwise), so the accuracies are identical.
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
from functools import partial
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


# Llama 3.2 1B's shape (--arch llama-1b): with the bench's BPE vocabulary (16384 by default) in
# place of its 128256 tokens, 1.0B parameters.
LLAMA_1B = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192}


def model_dir_name(args: argparse.Namespace) -> str:
    """The cached model's folder under --workdir: its architecture, shape and vocabulary."""
    if args.arch == "gpt2":
        return f"gpt2-{args.hidden}x{args.layers}-v{args.vocab}"
    return f"llama-{args.hidden}x{args.layers}-h{args.heads}-kv{args.kv_heads}-f{args.ffn}-v{args.vocab}"


def build_model(out: Path, args: argparse.Namespace) -> Path:
    """A byte-level BPE trained on the shared text and a randomly initialised model of --arch
    (GPT-2, or Llama with tied embeddings as Llama 3.2's), saved in float32: nothing is
    downloaded, so it builds on a machine without network. Kept in `out` for the next run."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "config.json").exists() and list(out.glob("*.safetensors")):
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
            vocab_size=args.vocab,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>").save_pretrained(
        out
    )
    torch.manual_seed(0)
    if args.arch == "gpt2":
        cfg = GPT2Config(
            vocab_size=tok.get_vocab_size(),
            n_positions=1024,
            n_embd=args.hidden,
            n_layer=args.layers,
            n_head=args.heads,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=args.hidden,
            intermediate_size=args.ffn,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            max_position_embeddings=2048,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)  # float32: each run loads it in its own --dtype
    return out


def device_name(device: str) -> str:
    """'CPU', or the GPU's name and torch's version, for the result file's header."""
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (torch {torch.__version__})"
    return "CPU"


def describe_model(args: argparse.Namespace, model) -> str:
    """The result file's model line: the random model's architecture, shape, size, precision and device."""
    n_params = sum(p.numel() for p in model.parameters())
    arch = "GPT-2" if args.arch == "gpt2" else f"Llama ({args.kv_heads} key/value heads, ffn {args.ffn})"
    return (
        f"model: random {arch}, hidden {args.hidden}, {args.layers} layers, vocab {model.config.vocab_size}, "
        f"{n_params / 1e6:.1f}M params, {args.dtype}, {device_name(args.device)}"
    )


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
    """The harness's evaluation as `lm_eval.simple_evaluate` runs it (its seeds, the task's
    few-shot setting and seed, `evaluate` with its default bootstrap), timed from loading the
    task to the aggregated metrics; without what simple_evaluate adds after them (the git hash,
    the environment report, which runs `collect_env`, and the tokenizer's description)."""
    import random

    import numpy as np
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
    from lm_eval.evaluator import evaluate
    from lm_eval.utils import set_torch_seed

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        random.seed(DEFAULT_RANDOM_SEED)
        np.random.seed(DEFAULT_OTHER_SEED)
        set_torch_seed(DEFAULT_OTHER_SEED)
        loaded = task_manager.load([f"tm_{task_name}"])
        for task in loaded["tasks"].values():
            if task.get_config("num_fewshot") != 0:  # simple_evaluate keeps a task's fixed 0
                task.set_config(key="num_fewshot", value=shots)
            task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
        out = evaluate(lm=lm, task_dict=loaded, limit=limit, log_samples=False)
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
    parser.add_argument(
        "--suite", default=None, help="an ICL suite (core, or a suite file): time it against the reference instead"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--threads",
        default="1",
        help="torch threads for both tools, or 'auto': each tool's default (ours: the cores free now; the harness: one per core)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of both tools' model, e.g. cuda (default cpu)")
    parser.add_argument("--load", type=int, default=0, help="busy processes running beside the measurement")
    parser.add_argument("--repeat", type=int, default=2, help="best of N alternating runs (the machine is shared)")
    parser.add_argument(
        "--arch",
        choices=("gpt2", "llama", "llama-1b"),
        default="gpt2",
        help="the random model: GPT-2 or Llama of --hidden/--layers/--heads/--kv-heads/--ffn, or Llama 3.2 1B's shape",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both tools' weights")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=None, help="Llama's key/value heads (default: --heads)")
    parser.add_argument("--ffn", type=int, default=None, help="Llama's MLP width (default: 4 x --hidden)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results" / "tmp" / "eval")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eval.txt")
    args = parser.parse_args()
    if args.arch == "llama-1b":
        vars(args).update(LLAMA_1B, arch="llama")
    args.kv_heads = args.kv_heads or args.heads
    args.ffn = args.ffn or 4 * args.hidden
    machine_load = check_load()  # before --load's busy processes start

    import torch

    from tokenmill.infra.cpu import free_cores

    harness_default = torch.get_num_threads()
    with busy_processes(args.load):
        if args.threads == "auto":
            ours_threads, harness_threads = free_cores(), harness_default
        else:
            ours_threads = harness_threads = int(args.threads)
        if args.suite:
            return measure_suite(args, ours_threads, machine_load)
        return measure(args, ours_threads, harness_threads, machine_load)


def score_ours(model, task, path: Path, limit: int, batch_size: int):
    """tokenmill's side of the `--suite` bench: the task file read and scored."""
    from tokenmill.eval.icl import read_examples, score_task

    return score_task(model, task, read_examples(path, task), limit, batch_size, progress=False)


def measure_suite(args: argparse.Namespace, threads: int, machine_load: str) -> int:
    """The `--suite` bench: each task of the suite, ours against the reference, interleaved."""
    import torch
    from measure import interleaved
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.eval.icl_ref import reference_task
    from tokenmill.eval.models import HFModel
    from tokenmill.eval.suites import load_suite

    logging.disable(logging.WARNING)
    torch.set_num_threads(threads)
    model_dir = build_model(args.workdir / model_dir_name(args), args)
    icl_dir = SHARED / "eval" / "icl"
    ours_model = HFModel(model_dir, device=args.device, dtype=args.dtype)
    reference_model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(args.device, getattr(torch, args.dtype))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    suite = load_suite(args.suite)
    tasks = [t for t in suite.tasks if (icl_dir / t.file).is_file()]
    lines = [
        machine_load,
        f"{describe_model(args, reference_model)}, {threads} thread(s) each; "
        f"suite {suite.name}: {len(tasks)} of {len(suite.tasks)} tasks (those in {icl_dir.name}/), first {args.limit} "
        f"examples each; ours batch size {args.batch_size}, the reference one input at a time; the median of "
        f"{args.repeat} interleaved rounds (spread: slowest - fastest over median)",
        f"{'task':<34}{'shots':>5}{'ours ex/s':>11}{'ref ex/s':>10}{'ratio':>8}  accuracy (identical)",
    ]
    print("\n".join(lines), flush=True)
    total_ours = total_reference = 0.0
    examples = 0
    for task in tasks:
        path = icl_dir / task.file
        spec = {
            "icl_task_type": task.task_type,
            "num_fewshot": task.num_fewshot,
            "continuation_delimiter": task.continuation_delimiter,
            "example_delimiter": task.example_delimiter,
            "prompt_string": task.prompt_string,
            "fewshot_random_seed": task.fewshot_seed,
        }
        timings, results = interleaved(
            {
                "ours": partial(score_ours, ours_model, task, path, args.limit, args.batch_size),
                "reference": partial(
                    reference_task, reference_model, tokenizer, spec, path, args.limit, ours_model.max_length
                ),
            },
            args.repeat,
            alternate=True,
        )
        correct = results["ours"].correct
        if correct != results["reference"]["correct"]:
            raise SystemExit(f"{task.label}: the outcomes differ from the reference's")
        t_ours, t_reference = timings["ours"].median, timings["reference"].median
        total_ours, total_reference, examples = (
            total_ours + t_ours,
            total_reference + t_reference,
            examples + len(correct),
        )
        line = (
            f"{task.label:<34}{task.num_fewshot:>5}{len(correct) / t_ours:>11.2f}{len(correct) / t_reference:>10.2f}"
            f"{t_reference / t_ours:>7.2f}x  {results['ours'].accuracy:.4f}"
            f"  (spread {timings['ours'].spread:.0%} | {timings['reference'].spread:.0%})"
        )
        print(line, flush=True)
        lines.append(line)
    lines.append(
        f"overall: {examples} examples, ours {total_ours:.1f} s ({examples / total_ours:.2f} ex/s), reference "
        f"{total_reference:.1f} s ({examples / total_reference:.2f} ex/s), ratio {total_reference / total_ours:.2f}x; "
        f"every example's outcome identical; {check_load('at the end')}"
    )
    print(lines[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


def measure(args: argparse.Namespace, ours_threads: int, harness_threads: int, machine_load: str) -> int:
    import torch

    logging.disable(logging.WARNING)
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from tests.eval.harness_ref import write_reference_tasks
    from tokenmill.eval.models import HFModel

    model_dir = build_model(args.workdir / model_dir_name(args), args)
    task_dir = args.workdir / "harness_tasks"
    references = write_reference_tasks(SHARED / "eval", task_dir, n_exported=args.limit)
    cases = [(name, shots) for name, shots in CASES if not args.tasks or name in args.tasks.split(",")]
    ours_model = HFModel(model_dir, device=args.device, dtype=args.dtype)
    with contextlib.redirect_stderr(io.StringIO()):
        lm = HFLM(pretrained=str(model_dir), dtype=args.dtype, batch_size=args.batch_size, device=args.device)
    # The task index (a scan of every harness YAML) is built once, outside the timings.
    task_manager = TaskManager(include_path=str(task_dir))
    for name, _ in cases:  # warm the harness's dataset cache (json -> arrow) before timing
        run_harness(lm, task_manager, name, 0, 1)

    lines = [
        machine_load,
        f"{describe_model(args, ours_model.model)}, threads: ours {ours_threads}, lm-eval {harness_threads};"
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
