#!/usr/bin/env bash
# The one command a GPU run needs (docs/gpu.md): on a machine with one H100/H200, no network, the
# working tree and .whl/ (make gpu-wheels) copied there, run from the repository root:
#
#   OUT=/some/empty/dir bench/gpu_check.sh             # on the GPU: under 8 minutes on an H100
#   OUT=/tmp/dry bench/gpu_check.sh --dry-run          # the same steps on the CPU, tiny shapes
#                                                      # (also DRY_RUN=1 or GPU_CHECK_DEVICE=cpu)
#   GPU_CHECK_PARTS="offload eval" OUT=... bench/gpu_check.sh   # only these parts (default: all)
#
# It installs the wheels, prints the device and torch's version, then runs, most important first:
#   1. bench/train_mfu.py: tokens/s/GPU, MFU, peak memory, ours beside torchtitan;
#   2. pytest tests/gpu: bf16 vs fp32 losses, resume, FSDP2, compile, export-hf, eval;
#   3. bench/activation_offload.py: peak device memory and step time of a 1B llama at 8192 tokens,
#      with and without parallel.activation_offload;
#   4. bench/eval.py --device cuda: `tokenmill eval` against lm-evaluation-harness's hf backend,
#      a random Llama of Llama 3.2 1B's shape in bf16, 1,000 documents per task.
# Each part has its own timeout, so a hang costs that part only, and the rest still runs; the exit
# status is 1 when any part failed.
#
# Sizing (8 minutes = 480 s in all, what one command of a 15-minute GPU loan can take with room
# left for one rerun of a part): each part's hard timeout below, summed, is 480 s:
#   install and device report: ~15 s;
#   train_mfu: --time-budget 110 s (the script stops starting new rows, and rounds past a row's
#     first, once it is spent, and lists what it skipped), hard timeout 130 s: compile of a
#     1B-3B llama takes ~30-60 s per mode, then ~20 timed steps, and each row runs 3 rounds (ours
#     and torchtitan alternating, a fresh trainer each), so a full matrix does not fit: run
#     GPU_CHECK_PARTS=train_mfu alone with MFU_BUDGET=540 for it;
#   tests/gpu: timeout 110 s; the tests took 92 s on an H100 (200-step bf16 runs of two tiny
#     models plus their fp32 CPU references on 16 cores, gpt2-125m's shape 2x200 steps on the
#     GPU, one compiled 40-step run, export and two evals);
#   offload: timeout 70 s (estimated, not yet measured): four fresh 1B engines (~10 s each to
#     build), 1 + 3 steps each at batch 1 x 8192 tokens, about 11 GB of activations copied each
#     way per step with offload on;
#   eval: timeout 155 s (estimated, not yet measured): a BPE and a random 1B Llama built on the
#     CPU and saved in float32, 4 GB (~40 s), both tools loading it in bf16 (~15 s), the harness's
#     task index (~10 s), then 5 task/shot cases x 1,000 documents for each tool, one pass each
#     (~1.5M tokens of forward passes a tool, ~10-30 s on an H100 in bf16).
#   A part that runs out of its time is reported as failed and the next one still runs.
# Measured on an H100 (2026-11-26), before the offload part and the 1B eval: install 4 s,
# train_mfu 133 s (all 12 rows; --profile adds two steps a row), tests 92 s, eval (a 17M GPT-2,
# 100 documents a task) 50 s: 286 s in all.
#
# Writes at most 5 files under $OUT (the GPU tool brings back 8): gpu_check.log (everything
# printed, with each part's exit status and seconds), train_mfu.txt, tests_gpu.xml (JUnit),
# activation_offload.txt and eval_<device>.txt.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
DRY=0
if [[ "${1:-}" == "--dry-run" || "${DRY_RUN:-0}" == "1" || "${GPU_CHECK_DEVICE:-cuda}" == "cpu" ]]; then
    DRY=1
fi
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/bench/results/tmp/gpu_check}"
SITE="${GPU_CHECK_SITE:-/tmp/site}"
PARTS=" ${GPU_CHECK_PARTS:-train_mfu tests offload eval} "
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
{ # everything printed goes to the terminal and to $LOG (the group's status is the script's)

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The benchmark data travels inside .whl/ (make gpu-wheels copies it there): ../shared/data does not.
if [[ -d "$ROOT/.whl/data/eval" ]]; then
    export TOKENMILL_SHARED_DATA="$ROOT/.whl/data"
fi

SUMMARY=()
FAILED=0
part() { # part NAME TIMEOUT_S COMMAND...: run with its own timeout, record status and seconds
    local name="$1" limit="$2"
    shift 2
    if [[ "$PARTS" != *" $name "* && "$name" != install ]]; then
        echo "=== $name: not in GPU_CHECK_PARTS, skipped"
        return
    fi
    echo
    local line="$*"
    echo "=== $name (timeout ${limit}s): ${line:0:240}"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    local took=$((SECONDS - start))
    local what="exit $rc"
    if ((rc == 124 || rc == 137)); then what="TIMED OUT (exit $rc)"; fi
    if ((rc != 0)); then FAILED=$((FAILED + 1)); fi
    echo "=== $name: $what after ${took}s"
    SUMMARY+=("$(printf '%-10s %-22s %4ds' "$name" "$what" "$took")")
}

echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), dry run: $DRY"
if compgen -G ".whl/*.whl" >/dev/null; then
    # PYTHONPATH: the working tree first (the code as it is now, even if .whl/ was built earlier),
    # then the wheels' folder for the packages the image lacks.
    part install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "gpu_check: no .whl/*.whl (make gpu-wheels): using the packages already installed"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi

if command -v nvidia-smi >/dev/null; then
    nvidia-smi
else
    echo "gpu_check: no nvidia-smi"
fi
"$PY" - <<'EOF'
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, capability {p.major}.{p.minor}")
EOF

if ((DRY)); then
    DEVICE=cpu
    MFU_ARGS=(--smoke --time-budget 120 --profile 3)
    MFU_LIMIT=300
    TESTS_LIMIT=1500 # 2 shared CPU cores: ~20 min at load 17 (the CPU compile ~8 min of it); ~5 unloaded
    OFFLOAD_ARGS=(--smoke --repeat 1 --steps 2)
    OFFLOAD_LIMIT=120
    EVAL_ARGS=(--device cpu --arch llama --vocab 1024 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --limit 5)
    EVAL_LIMIT=300
    export TOKENMILL_GPU_TESTS_DEVICE=cpu
else
    DEVICE=cuda
    MFU_ARGS=(--time-budget "${MFU_BUDGET:-110}" --profile 8)
    MFU_LIMIT=$((${MFU_BUDGET:-110} + 20))
    TESTS_LIMIT=110
    OFFLOAD_ARGS=(--shape 1b --seq-len 8192 --batch 1 --steps 3 --repeat 2)
    OFFLOAD_LIMIT=70
    EVAL_ARGS=(--device cuda --arch llama-1b --limit 1000 --batch-size 32)
    EVAL_LIMIT=155
fi

# 1. Training throughput, ours beside torchtitan (bench/train_mfu.py).
if [[ -f bench/train_mfu.py ]]; then
    part train_mfu "$MFU_LIMIT" "$PY" bench/train_mfu.py "${MFU_ARGS[@]}" --out "$OUT/train_mfu.txt"
else
    echo "gpu_check: no bench/train_mfu.py: throughput not measured"
    SUMMARY+=("$(printf '%-10s %-22s' train_mfu 'missing')")
fi

# 2. The GPU tests (tests/gpu), JUnit report for the record.
part tests "$TESTS_LIMIT" "$PY" -m pytest -q -p no:cacheprovider --basetemp="${TMPDIR:-/tmp}/gpu_check_pytest" \
    --junitxml="$OUT/tests_gpu.xml" -rs --durations=15 tests/gpu

# 3. Peak device memory with and without activation offload, at a long sequence.
part offload "$OFFLOAD_LIMIT" "$PY" bench/activation_offload.py "${OFFLOAD_ARGS[@]}" --out "$OUT/activation_offload.txt"

# 4. Eval speed and scores against lm-evaluation-harness's hf backend, both on the device; the
# tasks with at least 1,000 documents (5 task/shot cases), bf16 weights.
part eval "$EVAL_LIMIT" "$PY" bench/eval.py "${EVAL_ARGS[@]}" --dtype bfloat16 --repeat 1 --threads 1 \
    --tasks piqa,boolq,winogrande,lambada_openai --workdir "${TMPDIR:-/tmp}/gpu_check_eval" --out "$OUT/eval_$DEVICE.txt"

echo
echo "=== summary ($SECONDS s in all; files under $OUT: $(cd "$OUT" && ls | tr '\n' ' '))"
printf '%s\n' "${SUMMARY[@]}"
# Every part runs whatever an earlier one did; the status says whether all of them passed.
exit $((FAILED > 0))
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
