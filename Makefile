# trtforge: `make demo` and `make test` work on a fresh clone; they create .venv themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trtforge-installed
DEMO_DIR ?= build/demo
PYTEST_ARGS ?=

.PHONY: venv demo test test-gpu lint clean

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

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(PYTEST_ARGS)

# GPU tests run on a machine with CUDA torch already installed (the H200 device: torch 2.11 + Triton),
# with the system python and this checkout on PYTHONPATH. Pure-Python dependencies that machine lacks
# (polygraphy, for the reports test) travel as wheels in .whl/ (README: "GPU tests").
GPU_SITE ?= /tmp/trtforge-gpu-site
test-gpu:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  python3 -m pip install -q --no-index --no-deps --no-compile --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(CURDIR):$(GPU_SITE) python3 -m pytest -m gpu -p no:cacheprovider $(PYTEST_ARGS) tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf build .pytest_cache
