# trtforge: `make demo` and `make test` work on a fresh clone; they create .venv themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trtforge-installed
DEMO_DIR ?= build/demo
PYTEST_ARGS ?=

.PHONY: venv demo test test-floor test-gpu gpu-wheels gpu-carry old-tree triton-cache lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	# CPU torch first (from local disk): pip must not resolve a CUDA build for us.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[rtx,serve,dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m trtforge.demo --out $(DEMO_DIR)

# The CPU suite over TEST_WORKERS pytest-xdist workers (default: the cores, at most 4; 0: in one process).
TEST_WORKERS ?= $(shell python3 -c "import os; a = getattr(os, 'sched_getaffinity', None); print(min(4, len(a(0)) if a else os.cpu_count() or 1))")

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The decoder families against the oldest transformers we support (5.17, the H200's): its modules differ
# from the newest in attributes the adapters read (GPT-J's per-attention sinusoid table, Falcon's
# softmax scale). Installs that release (and a huggingface-hub it accepts) beside the venv, in FLOOR_SITE.
FLOOR_TRANSFORMERS ?= 5.17.0
FLOOR_SITE ?= build/transformers-$(FLOOR_TRANSFORMERS)
test-floor: $(STAMP)
	@test -f $(FLOOR_SITE)/.done || { rm -rf $(FLOOR_SITE) && $(PY) -m pip install -q --no-deps --target $(FLOOR_SITE) \
	  transformers==$(FLOOR_TRANSFORMERS) "huggingface-hub>=1.5,<2" && touch $(FLOOR_SITE)/.done; }
	HF_HUB_OFFLINE=1 PYTHONPATH=$(FLOOR_SITE) $(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS) tests/llm/models \
	  tests/llm/test_generate.py tests/llm/test_torch_executor.py

# GPU tests run on a machine with CUDA torch already installed (the H200 device: torch 2.11 + Triton),
# with the system python and this checkout on PYTHONPATH. Pure-Python dependencies that machine lacks
# (polygraphy, for the reports test) travel as wheels in .whl/ (README: "GPU tests").
# Two passes: the `whole_gpu` tests (they measure or fill the device's free memory) alone, then the
# other GPU tests over GPU_WORKERS xdist workers (empty: none). Failures and tests slower than GPU_SLOW_S are
# named as they happen (--live-report), a test running past GPU_STACK_S dumps its stack, and with
# pytest-timeout installed a test past GPU_TIMEOUT_S fails; so a run cut short still says what failed.
GPU_SITE ?= /tmp/trtforge-gpu-site
# What the GPU machine's python lacks, with every dependency resolved for it (CPython GPU_PYTHON on
# manylinux x86_64), into .whl/: run `make gpu-wheels` once where PyPI is reachable, then carry .whl.
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= polygraphy fastapi uvicorn openai jsonschema
GPU_TESTS ?= tests
GPU_WORKERS ?= 8
GPU_SLOW_S ?= 30
GPU_STACK_S ?= 120
GPU_TIMEOUT_S ?= 150
GPU_PYTEST = PYTHONPATH=$(CURDIR):$(GPU_SITE) python3 -m pytest -p no:cacheprovider \
  --live-report=$(GPU_SLOW_S) --durations=15 \
  $(shell python3 -c "import pytest_timeout" 2>/dev/null && echo --timeout=$(GPU_TIMEOUT_S) --timeout-method=thread \
    || echo -o faulthandler_timeout=$(GPU_STACK_S)) $(PYTEST_ARGS)
# (pass 1 alone even when PYTEST_ARGS carries -n: a later -n 0 wins)
XDIST_OFF = $(shell python3 -c "import xdist" 2>/dev/null && printf -- '-n 0')
gpu-wheels:
	python3 -m pip download -q --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)

# The trained models for the device tool's carry (the working tree travels, ../shared does not): copied
# into the git-excluded .gpu/models; benchmarks/device_env.sh puts them back at ../shared/models there.
SHARED_MODELS ?= ../shared/models
gpu-carry:
	@test -d $(SHARED_MODELS) || { echo "gpu-carry: $(SHARED_MODELS) is absent" >&2; exit 2; }
	@mkdir -p .git/info && grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
	rm -rf .gpu/models.tmp && mkdir -p .gpu && cp -r $(SHARED_MODELS) .gpu/models.tmp
	rm -f .gpu/models.tmp/*.py && rm -rf .gpu/models && mv .gpu/models.tmp .gpu/models

# A previous revision's package for a same-call A/B on the device (issue #29's no-regression check):
# `make old-tree OLD_REV=abc123` puts that revision's trtforge/ in the git-excluded .old; carry ".old"
# too, and there `with_old python3 benchmarks/...` (benchmarks/device_env.sh) runs the old package.
# Several revisions (a bisection in one call): `make old-tree OLD_REV=abc123 OLD_DIR=.old-abc`, carry
# each folder, and there `OLD_DIR=.old-abc with_old python3 ...`.
OLD_REV ?= HEAD~1
OLD_DIR ?= .old
old-tree:
	@case "$(OLD_DIR)" in .old|.old-*) ;; *) echo "old-tree: OLD_DIR must be .old or .old-NAME" >&2; exit 2;; esac
	@mkdir -p .git/info && grep -qx '/.old\*/' .git/info/exclude 2>/dev/null || echo '/.old*/' >> .git/info/exclude
	rm -rf $(OLD_DIR).tmp && mkdir -p $(OLD_DIR).tmp && git archive $(OLD_REV) trtforge | tar -x -C $(OLD_DIR).tmp
	git rev-parse $(OLD_REV) > $(OLD_DIR).tmp/REV && rm -rf $(OLD_DIR) && mv $(OLD_DIR).tmp $(OLD_DIR)

# Triton's kernel cache from a device call (`save_triton_cache` in benchmarks/device_env.sh wrote it to
# $OUT): `make triton-cache FROM=/work/.device/N/triton-cache.txz` keeps it in the git-excluded .triton; carry
# ".triton" and the next machine starts with those kernels compiled.
triton-cache:
	@test -f "$(FROM)" || { echo "triton-cache: FROM=path/to/triton-cache.txz (save_triton_cache's output)" >&2; exit 2; }
	@mkdir -p .git/info && grep -qx '/.triton/' .git/info/exclude 2>/dev/null || echo '/.triton/' >> .git/info/exclude
	mkdir -p .triton && cp "$(FROM)" .triton/triton-cache.txz.tmp && mv .triton/triton-cache.txz.tmp .triton/triton-cache.txz
	@du -h .triton/triton-cache.txz

test-gpu:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  python3 -m pip install -q --no-index --no-deps --no-compile --target $(GPU_SITE) .whl/*.whl; fi
	$(GPU_PYTEST) $(XDIST_OFF) -m "gpu and whole_gpu" $(GPU_TESTS); a=$$?; \
	$(GPU_PYTEST) -m "gpu and not whole_gpu" $(if $(GPU_WORKERS),-n $(GPU_WORKERS)) $(GPU_TESTS); b=$$?; \
	[ $$a -eq 0 -o $$a -eq 5 ] && [ $$b -eq 0 -o $$b -eq 5 ]  # (5: no test selected in that pass)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf build .pytest_cache
