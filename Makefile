# Two entry points, each doing its own set-up on a fresh machine (see README):
#   make main   real-model comparison on the default preset (qwen-coder), prints the table
#   make test   lint and the default test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: main test setup setup-models lint

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0

setup: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"

setup-models: setup
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m rift_hf.models install qwen-coder

lint: setup
	$(BIN)/ruff check rift_hf kernels tests
	$(BIN)/ruff format --check rift_hf kernels tests

test: setup lint
	$(BIN)/python -m pytest -q

main: setup-models
	$(BIN)/rift-hf compare --preset qwen-coder --new-tokens 64 --delta 32
