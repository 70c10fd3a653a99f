# make demo: create .venv, install the package and torch, and profile the CPU reference
#            MegaKernel into ./mcprof-store.
# make test: install the dev extras too if needed, then lint, check formatting, check the
#            import layers and run the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed
DEV := $(VENV)/.installed-dev
# Test files run in parallel processes, whole files to a process (module fixtures are built
# once); every test is independent of the others' order and process.
TEST_WORKERS ?= 2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Nothing is byte-compiled at install: compiling all that pip installs took 26 s of a
# fresh clone's setup, even with compileall on every core, and most of it is never
# imported. Python compiles a module the first time it is imported and keeps its bytecode
# where it may write it: the demo, the import check and the tests clear
# PYTHONDONTWRITEBYTECODE so that it may.
PIP_INSTALL := $(BIN)/python -m pip install --quiet --no-compile
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=

.PHONY: demo test lint layers bench clean

# What the demo needs: the package and torch.
$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so that installing the project never fetches a CUDA one.
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e .
	touch $(BASE)

# What the checks and benchmarks add: pytest, ruff, import-linter, Spark, the S3 server, HTA,
# msprof-analyze.
$(DEV): $(BASE) pyproject.toml
	$(PIP_INSTALL) -e '.[dev]'
	touch $(DEV)

demo: $(BASE)
	$(WRITE_BYTECODE) $(BIN)/mcprof demo

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The contracts in pyproject.toml: each room imports only the rooms below it.
layers: $(DEV)
	$(WRITE_BYTECODE) $(BIN)/lint-imports --no-cache

# The HTML report's test opens the page in a headless Chromium; the Spark test needs Java.
# The tests write bytecode even where PYTHONDONTWRITEBYTECODE is set: every process the
# tests start (commands, capture writers, trace workers) imports the package and its
# libraries again, and would compile them again.
test: lint layers
	command -v chromium >/dev/null 2>&1 || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium)
	command -v java >/dev/null 2>&1 || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openjdk-17-jre-headless)
	$(WRITE_BYTECODE) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

bench: $(DEV)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/export.py
	$(BIN)/python bench/fuse.py
	$(BIN)/python bench/kineto.py
	$(BIN)/python bench/kineto.py --scale 10 --repeat 1
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/compact.py
	$(BIN)/python bench/cross_rank.py

clean:
	rm -rf $(VENV) mcprof-store mcprof-store-torch
