#!/usr/bin/env bash
# Fill .whl/ with what a GPU machine without network needs on top of its image (docs/gpu.md):
# tokenmill's own wheel, the CPython 3.12 manylinux wheels of the packages training, export-hf,
# eval and lm-evaluation-harness's hf backend import that the image lacks, the lines of
# bench/gpu-wheels.txt (torchtitan, torchao and their dependencies, for bench/train_mfu.py), and
# a copy of the shared benchmark data under .whl/data/ (../shared/data does not travel; bench/eval.py
# reads it through TOKENMILL_SHARED_DATA). Downloads need the network: run it here, carry .whl/.
#
#   bench/gpu_wheels.sh [DEST]        (make gpu-wheels)
#
# One version of each package; the set, data included, must stay under 64 MiB (what one command
# may carry to the GPU machine). Curation-only packages (dask, datasketch, ftfy, fastwarc, ...)
# are left out: the training and eval paths import none of them.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PYTHON="${PYTHON:-python3}"
EXTRA="${GPU_WHEELS_EXTRA:-$ROOT/bench/gpu-wheels.txt}"
SHARED="${TOKENMILL_SHARED_DATA:-$ROOT/../shared/data}"
LIMIT_MIB=64

# The image (docs/gpu.md lists it) has torch, numpy, transformers, tokenizers, safetensors, pandas,
# pyarrow, pyyaml, tqdm, tensorboard, fsspec, aiohttp, xxhash, regex, accelerate, peft, sacrebleu,
# scikit-learn, jinja2, click, joblib, absl-py. Versions are those of the project's .venv.
BINARY=(
    # tokenmill.train.config, tokenmill.problems: the configuration is validated by pydantic.
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    # lm-evaluation-harness (bench/eval.py's reference) and what it imports.
    lm_eval==0.4.13 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19
    more-itertools==11.2.1 pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5
    pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1
    nltk==3.10.4 defusedxml==0.7.1
)
# Pure-python packages published only as source: built into py3-none-any wheels here.
SOURCE_ONLY=(rouge_score==0.1.2 sqlitedict==2.1.0 word2number==1.1)

name_of() { # the normalised project name of a requirement or a wheel file name
    local spec="${1##*/}"
    spec="${spec%%[=<>!~ ;\[]*}"
    spec="${spec%%-[0-9]*}"
    echo "$spec" | tr 'A-Z_.' 'a-z--'
}

# bench/gpu-wheels.txt (one requirement per line, # comments) takes precedence for a name both lists
# give: one version of each package.
declare -A SPEC=()
declare -a ORDER=()
add() {
    local key
    key="$(name_of "$1")"
    if [[ -n "${SPEC[$key]:-}" && "${SPEC[$key]}" != "$1" ]]; then
        echo "gpu-wheels: $1 (from $2) replaces ${SPEC[$key]}"
    else
        ORDER+=("$key")
    fi
    SPEC[$key]="$1"
}
for spec in "${BINARY[@]}"; do add "$spec" base; done
if [[ -f "$EXTRA" ]]; then
    while read -r line; do
        line="${line%%#*}"
        line="$(echo "$line" | xargs)"
        [[ -n "$line" ]] && add "$line" "${EXTRA#"$ROOT"/}"
    done <"$EXTRA"
else
    echo "gpu-wheels: no ${EXTRA#"$ROOT"/}: torchtitan and torchao are left out"
fi

rm -rf "$DEST"
mkdir -p "$DEST"
binary=()
for key in "${ORDER[@]}"; do binary+=("${SPEC[$key]}"); done

"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "$ROOT"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "${binary[@]}"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "${SOURCE_ONLY[@]}"

# One wheel per project (pip download keeps a file that was already there).
dupes="$(for wheel in "$DEST"/*.whl; do name_of "$wheel"; done | sort | uniq -d)"
if [[ -n "$dupes" ]]; then
    echo "gpu-wheels: error: more than one wheel of: $dupes" >&2
    exit 1
fi

if [[ -d "$SHARED/eval" ]]; then
    mkdir -p "$DEST/data"
    cp -r "$SHARED/eval" "$SHARED/corpus" "$DEST/data/"
else
    echo "gpu-wheels: no $SHARED/eval: bench/eval.py will not run on the GPU machine"
fi

ls -1 "$DEST"/*.whl | sed "s|^$DEST/|  |"
total_kib="$(du -sk "$DEST" | cut -f1)"
echo "gpu-wheels: $(ls "$DEST"/*.whl | wc -l) wheels + data, $((total_kib / 1024)) MiB in ${DEST#"$ROOT"/} (limit $LIMIT_MIB MiB)"
if ((total_kib > LIMIT_MIB * 1024)); then
    echo "gpu-wheels: error: ${DEST#"$ROOT"/} is over $LIMIT_MIB MiB" >&2
    exit 1
fi
