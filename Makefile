# The two quick-start commands are `make demo` and `make test`; each sets up what it
# needs (virtualenv, dependencies, Docker engine, images) and is fast when done.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fleet-installed
QUESTION ?= How do Python's asyncio tasks get cancelled, and how does a program shield work from cancellation?

.PHONY: setup demo test test-deps lint bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q python3-venv; \
	  else echo "fleet: python3 venv support is missing; run 'sudo apt-get install python3-venv'" >&2; exit 2; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,cluster]'
	@touch $(STAMP)

# Fleet's own modules are byte-compiled here: the editable install leaves them as
# source, and where PYTHONDONTWRITEBYTECODE is set every fleet process (and every Ray
# worker) would compile them again (about 0.3 s of CPU each). Up to date, this is a stat;
# a tree it may not write to is left as it is.
setup: $(STAMP)
	@$(BIN)/python -m compileall -qq coordinator subagents sandbox || true
	$(BIN)/fleet setup

demo: setup
	$(BIN)/fleet research "$(QUESTION)" --members 3

# The trace page is tested in the host's Chromium (Debian's package), like a user's browser.
test-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then echo "fleet: installing chromium for the trace page tests (one time)"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	  else echo "fleet: the tests need Chromium; run 'sudo apt-get install chromium'" >&2; exit 2; fi; }

# Lint, format and types gate the tests: what a reviewer would check, CI checks first;
# then gVisor is registered (the tests run boxes under it too; registering needs root, and
# without it they skip, or fail under CI) and fleet doctor says which of Fleet's
# guarantees hold on this machine (exit 1 if one does not). The suite keeps its
# bytecode even where PYTHONDONTWRITEBYTECODE is set: without it each worker rewrote and
# compiled every test module again (11 s of CPU to collect instead of 5), and every
# process a test starts compiled the helpers it imports.
test: setup test-deps lint
	$(BIN)/fleet setup --gvisor || [ "$$(id -u)" != 0 ]
	$(BIN)/fleet doctor
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -x -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy images/corpus/corpus_server.py  # in its image's directory, not a package

bench: setup
	$(BIN)/python bench/sandbox.py && $(BIN)/python bench/harness.py && $(BIN)/python bench/fanout.py && $(BIN)/python bench/cluster.py

clean:
	rm -rf $(VENV) build *.egg-info
