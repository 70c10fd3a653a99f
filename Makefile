# make demo: create .venv, install, and profile the CPU reference MegaKernel into ./mcprof-store.
# make test: install if needed, then lint, check formatting and run the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so that installing the project never fetches a CUDA one.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mcprof demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The HTML report's test opens the page in a headless Chromium; the Spark test needs Java.
test: lint
	command -v chromium >/dev/null 2>&1 || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium)
	command -v java >/dev/null 2>&1 || ($(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openjdk-17-jre-headless)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/export.py
	$(BIN)/python bench/fuse.py
	$(BIN)/python bench/kineto.py
	$(BIN)/python bench/kineto.py --scale 10 --repeat 1
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/compact.py

clean:
	rm -rf $(VENV) mcprof-store mcprof-store-torch
