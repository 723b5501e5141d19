# Two commands on a fresh clone: `make demo` and `make test`. Each creates .venv if missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TINY    := models/tiny-recall
BUNDLE  := build/tiny-recall

.PHONY: demo test test-gpu lint bench clean kernels

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp files so the install runs once per change of pyproject.toml.
# The serve extra (starlette, uvicorn, prometheus_client; no pydantic) is small: with it
# the README's `edgeprefill serve` works right after `make demo`.
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[serve]"
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev,export]"
	touch $(VENV)/.core $@

# The demo needs only the core install: export reads safetensors without torch.
# Afterwards: `. .venv/bin/activate` puts `edgeprefill` on the PATH (README, "Use it").
demo: $(VENV)/.core
	$(BIN)/edgeprefill export $(TINY) -o $(BUNDLE) --overwrite
	$(BIN)/python samples/demo.py $(BUNDLE)

lint: $(VENV)/.dev
	$(BIN)/ruff check edgeprefill tests samples benchmarks scripts
	$(BIN)/mypy  # strict on edgeprefill/sdk, engines, contract.py, bundle.py ([tool.mypy] in pyproject)

# The native kernels (edgeprefill/kernels) are built when g++ and npm are there, so the
# tests exercise them; without them the tests of the stock graph still run.
kernels: $(VENV)/.core
	$(BIN)/python -m edgeprefill.kernels.build --if-possible

# Two test processes where there are two CPUs: most tests are single-threaded Python (the
# transformers reference, exporting, the server's clients), and tests/conftest.py keeps the
# engines' threads from spinning and torch on one thread, so the two share the cores (381 s
# of pytest on a quiet 2-core VM, against 507 s while the threads spun). Each file runs
# whole in one process (its module fixtures built once).
# `make test TEST_WORKERS=0` runs it in this process.
TEST_WORKERS ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 0)

test: lint kernels
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# On a machine with an NVIDIA GPU, TensorRT and onnxruntime-gpu (see docs/jetson.md).
test-gpu: $(VENV)/.dev
	$(BIN)/python -m pytest -q -m gpu

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/compare.py

clean:
	rm -rf build
