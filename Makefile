# `make demo` and `make test` each create (or reuse) .venv and install tokenmill with everything
# it needs. torch is pinned to 2.13.0: on the project's machines that resolves to the local CPU
# build; on a user's Linux machine pip takes the CUDA build from the registry.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
EVAL_DATA ?= $(wildcard $(or $(TOKENMILL_SHARED_DATA),../shared/data)/eval)
INSTALLED := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
PYTEST_FLAGS ?=

.PHONY: install demo test test-fast lint wheel-check torch-compat lean-upstream bench bench-env megatron-env \
	gpu-wheels gpu-image-env gpu-wheels-check gpu-check-dry clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[test]" "torch==$(TORCH_VERSION)"
	rm -f $(VENV)/.installed-*
	touch $@

demo: install
	$(VENV)/bin/tokenmill demo --workdir demo-work $(if $(EVAL_DATA),--eval-data $(EVAL_DATA))

# Every test: the fast ones and those marked slow or distributed. TEST_WORKERS pytest processes
# (pytest-xdist) share the work a file at a time, the longest first (tests/conftest.py).
TEST_WORKERS ?= 2
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --timeout=1200 --durations=25 -n $(TEST_WORKERS) $(PYTEST_FLAGS) tests

# ruff, as configured in pyproject.toml: lint, and formatting checked (`ruff format` applies it).
lint: install
	$(VENV)/bin/ruff check tokenmill tests bench
	$(VENV)/bin/ruff format --check tokenmill tests bench

# The quick subset for development.
test-fast: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not distributed" $(PYTEST_FLAGS) tests

# A user's install: build the wheel, install it alone in a fresh virtual environment (no
# Makefile steps, no editable checkout), check its requirements, and run the demo from another
# directory so nothing in this checkout can be imported by accident.
WHEEL_VENV ?= .venv-wheel
wheel-check:
	rm -rf dist build $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet --upgrade pip wheel
	$(WHEEL_VENV)/bin/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	$(WHEEL_VENV)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)" dist/tokenmill-*.whl
	$(WHEEL_VENV)/bin/python -m pip check
	cd "$$(mktemp -d)" && $(abspath $(WHEEL_VENV))/bin/tokenmill demo --workdir demo-work --no-progress \
		$(if $(EVAL_DATA),--eval-data $(abspath $(EVAL_DATA))) && test -s demo-work/report.html

# The default extractor, lean, reads internal names of trafilatura and jusText and was proven to
# give trafilatura's text on the releases in tokenmill/curate/extract/html_text.py (LEAN_PROVEN_VERSIONS);
# under others `curate extract` warns and extracts with trafilatura itself. This runs lean's
# equality tests against the newest releases, in a venv of their own (tokenmill without its
# dependencies, and only what those tests import), and says whether lean still gives
# trafilatura's text there: when it does, the new releases can join LEAN_PROVEN_VERSIONS.
LEAN_UPSTREAM_VENV ?= .venv-lean-upstream
LEAN_UPSTREAM_TESTS ?= tests/curate/test_lean_html.py
lean-upstream:
	test -x $(LEAN_UPSTREAM_VENV)/bin/python || $(PYTHON) -m venv $(LEAN_UPSTREAM_VENV)
	$(LEAN_UPSTREAM_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(LEAN_UPSTREAM_VENV)/bin/python -m pip install --quiet --upgrade trafilatura jusText lxml lxml_html_clean \
		pytest pytest-timeout "dask[distributed]"
	@versions="$$($(LEAN_UPSTREAM_VENV)/bin/python -c 'from importlib.metadata import version as v; \
		print("trafilatura", v("trafilatura") + ", jusText", v("jusText"))')"; \
	if OMP_NUM_THREADS=1 $(LEAN_UPSTREAM_VENV)/bin/python -m pytest -q --timeout=1200 $(LEAN_UPSTREAM_TESTS); then \
		echo "lean-upstream: under $$versions lean gives trafilatura's text (its equality tests pass)"; \
	else \
		echo "lean-upstream: under $$versions lean FAILS its equality tests (or cannot import): keep" \
			"LEAN_PROVEN_VERSIONS as it is; users of these releases get the trafilatura extractor"; exit 1; \
	fi

# The oldest torch tokenmill supports (pyproject's lower bound), on the GPU machine's Python
# (3.12): its own venv runs the trainer's single-process tests, its parity tests against the
# single process over gloo (dp/ZeRO, tp, pp; failed ranks restarting from a checkpoint), and
# eval's against the harness, and float8 through torchao (the `float8` extra; kept out of the main
# test venv, where torch 2.13 makes torchao print load errors whenever transformers imports it).
# torch internals that moved between versions fail here, not on a GPU.
TORCH_COMPAT_VERSION ?= 2.11.0
TORCH_COMPAT_VENV ?= .venv-torch211
PYTHON312 ?= $(or $(lastword $(sort $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.12*/bin/python3.12))),python3.12)
TORCH_COMPAT_TESTS ?= \
	tests/train/test_model.py tests/train/test_engine.py tests/train/test_loop.py \
	tests/train/test_optim.py tests/train/test_config.py tests/train/test_flops.py \
	tests/train/test_async_checkpoint.py tests/train/test_export_hf.py tests/train/test_worker.py \
	tests/train/test_eod_llama3.py tests/train/test_parallel_plan.py tests/train/test_float8.py \
	tests/train/test_parallel.py::test_layout_equals_single_process \
	"tests/train/test_elastic.py::test_a_killed_rank_restarts_the_job_from_the_latest_checkpoint[pp2xdp2-async]" \
	tests/train/test_elastic.py::test_without_restarts_a_killed_rank_ends_the_job_with_one_line \
	tests/eval/test_models.py tests/eval/test_native.py tests/eval/test_cli.py \
	"tests/eval/test_harness_equal.py::test_same_numbers_as_lm_eval[0]"
torch-compat:
	@command -v $(PYTHON312) >/dev/null 2>&1 || { echo "torch-compat: error: no Python 3.12 found; set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	test -x $(TORCH_COMPAT_VENV)/bin/python || $(PYTHON312) -m venv $(TORCH_COMPAT_VENV)
	$(TORCH_COMPAT_VENV)/bin/python -m pip install --quiet "torch==$(TORCH_COMPAT_VERSION)"
	$(TORCH_COMPAT_VENV)/bin/python -m pip install --quiet -e ".[test,float8]" "torch==$(TORCH_COMPAT_VERSION)"
	$(TORCH_COMPAT_VENV)/bin/python -c 'import sys, torch; print("torch-compat: Python", sys.version.split()[0], "torch", torch.__version__)'
	OMP_NUM_THREADS=1 $(TORCH_COMPAT_VENV)/bin/python -m pytest -q --timeout=900 --durations=10 $(PYTEST_FLAGS) $(TORCH_COMPAT_TESTS)

bench: install
	for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

# Peers that cannot share tokenmill's environment, each in its own (git-ignored) one.
# datatrove: bench/curate_filter.py, bench/tokenize_encode.py, bench/pii.py and bench/url_filter.py compare
# against it (skipped without it); its URLFilter needs tldextract, fasteners and pyahocorasick.
bench-env:
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install --quiet "datatrove==0.10.1" spacy regex pandas pyarrow tokenizers tldextract fasteners pyahocorasick
# bench/web.py and bench/web_scale.py: datatrove's WarcReader, Trafilatura extractor and LanguageFilter need these.
	.venv-bench/bin/pip install --quiet warcio faust-cchardet python-magic trafilatura lxml_html_clean fasttext-numpy2-wheel

# Megatron-Core is the reference reader of our shards (tests/compat/, bench/tokenize_loader.py). Its
# dataset code needs only the CPU build of torch: 0.16.1 is the newest release for Python 3.11, so
# the pinned torch that `install` uses (the local CPU build on the project's machines) serves it too,
# instead of the multi-GB CUDA build pip picks for Python 3.12.
megatron-env:
	test -x .venv-megatron/bin/python || $(PYTHON) -m venv .venv-megatron
	.venv-megatron/bin/pip install --quiet "megatron-core==0.16.1" "torch==$(TORCH_VERSION)" numpy

# The GPU machine (docs/gpu.md): Python 3.12, torch 2.11, no network. `gpu-wheels` fills .whl/
# (git-ignored; carried to the machine) with tokenmill's wheel, the wheels of what its image
# lacks for training, eval and the benches, and the benchmark data; bench/gpu_check.sh is the one
# command run there.
gpu-wheels:
	PYTHON=$(PYTHON) bench/gpu_wheels.sh

# The GPU image mimicked on the CPU: Python 3.12 with torch 2.11 (the CPU build) and only the
# image's packages that tokenmill's training and eval paths use, at the image's versions. Its
# own venv (same recipe as torch-compat's), since a venv with tokenmill's full requirements
# would hide a wheel missing from .whl/.
GPU_IMAGE_VENV ?= .venv-gpu-image
GPU_IMAGE_PACKAGES := torch==2.11.0 numpy==2.5.2 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 \
	huggingface_hub==1.33.0 accelerate==1.15.0 pandas==3.1.1 pyarrow==26.0.1 pyyaml tqdm tensorboard fsspec \
	aiohttp requests psutil pytest pytest-timeout xxhash regex sacrebleu scikit-learn jinja2 click joblib \
	absl-py six peft numba==0.68.1
GPU_IMAGE_LACKS := pydantic pydantic-core annotated-types typing-inspection datasets evaluate lm_eval dill multiprocess \
	torchtitan torchao dask datasketch ftfy
gpu-image-env: $(GPU_IMAGE_VENV)/.installed
$(GPU_IMAGE_VENV)/.installed: Makefile
	test -x $(GPU_IMAGE_VENV)/bin/python || $(PYTHON312) -m venv $(GPU_IMAGE_VENV)
	$(GPU_IMAGE_VENV)/bin/python -m pip install --quiet $(GPU_IMAGE_PACKAGES)
# What the image lacks must come from .whl/, even where one of the packages above pulled it in.
	$(GPU_IMAGE_VENV)/bin/python -m pip uninstall --quiet --yes $(GPU_IMAGE_LACKS)
	touch $@

# The wheel set alone over the mimic: train tiny, export-hf, eval, and the benches' imports.
gpu-wheels-check: gpu-wheels gpu-image-env
	bench/gpu_wheels_check.sh $(GPU_IMAGE_VENV)/bin/python

# bench/gpu_check.sh end to end on the CPU (tiny shapes, tests/gpu on the CPU) over the mimic.
gpu-check-dry: gpu-wheels gpu-image-env
	OUT=bench/results/tmp/gpu_check PYTHON=$(GPU_IMAGE_VENV)/bin/python GPU_CHECK_SITE=$(abspath $(GPU_IMAGE_VENV))/gpu-site \
		bench/gpu_check.sh --dry-run

clean:
	rm -rf $(VENV) $(WHEEL_VENV) $(TORCH_COMPAT_VENV) dist build demo-work .pytest_cache .whl
