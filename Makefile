# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Each creates .venv when missing and installs what it needs (a no-op when up to date).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch first, pinned to the build that lies on local disk: a bare `torch` can pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: run test test-all test-gpu bench lint venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/surecall run

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -m "not slow and not gpu" $(PYTEST_ARGS)

test-all: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/kernels.py
	$(PY) benchmarks/compile.py
	$(PY) benchmarks/dispatch.py
	$(PY) benchmarks/toolbox.py
	$(PY) benchmarks/e2e.py

lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels grammars benchmarks tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
