#!/usr/bin/env bash
# The wheel set alone (make gpu-wheels-check): install only .whl/*.whl (--no-index --no-deps) into
# a fresh folder over PYTHON, a Python 3.12 + torch 2.11 environment with nothing but the GPU
# image's packages, and, from an empty directory (so this checkout cannot be imported), run
# `python -m tokenmill` train (the bundled tiny config), export-hf and eval, then import what
# bench/eval.py and bench/train_mfu.py take from the set (lm-evaluation-harness, torchtitan,
# torchao). A package the GPU machine would miss fails here.
#
#   bench/gpu_wheels_check.sh PYTHON
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The interpreter as given, made absolute: the checks run from an empty directory.
case "$1" in
*/*) PY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" ;;
*) PY="$1" ;;
esac
SHARED="${TOKENMILL_SHARED_DATA:-$ROOT/../shared/data}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

"$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$ROOT"/.whl/*.whl
cd "$WORK"
export PYTHONPATH="$WORK/site" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
"$PY" -c 'import tokenmill, torch; print(f"tokenmill from {tokenmill.__file__}, torch {torch.__version__}")'

# A token shard with its tokenizer, made from the repository's text (tests/gpu/repo_data.py).
"$PY" "$ROOT/tests/gpu/repo_data.py" data
eval_dir="data/eval"
tasks="lambada_openai"
if [[ -d "$SHARED/eval" ]]; then
    eval_dir="$SHARED/eval"
    tasks="lambada_openai,piqa,winogrande"
fi
"$PY" -m tokenmill train tiny --data data/shard --out run --steps 20 --no-progress
"$PY" -m tokenmill export-hf run hf
"$PY" -m tokenmill eval --model run --tasks "$tasks" --data-dir "$eval_dir" --limit 20 --bootstrap-iters 0 --threads 1
"$PY" -m tokenmill eval --model hf --tasks lambada_openai --data-dir "$eval_dir" --limit 20 --bootstrap-iters 0 --threads 1

"$PY" - <<'EOF'
import importlib.util

from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED  # noqa: F401
from lm_eval.evaluator import evaluate  # noqa: F401  timed without simple_evaluate's environment report
from lm_eval.models.huggingface import HFLM  # noqa: F401  bench/eval.py's reference
from lm_eval.tasks import TaskManager  # noqa: F401
from lm_eval.utils import set_torch_seed  # noqa: F401
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401  bench/eval.py --arch llama-1b

print("lm_eval: imports")
for name in ("torchtitan", "torchao"):  # bench/gpu-wheels.txt's, when the set has them
    if importlib.util.find_spec(name):
        importlib.import_module(name)
        print(f"{name}: imports")
    else:
        print(f"{name}: not in the wheel set")
EOF
echo "gpu-wheels-check: passed in $((SECONDS - start)) s"
