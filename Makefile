# The two quick-start commands are `make demo` and `make test`; each sets up what it
# needs (virtualenv, dependencies, Docker engine, images) and is fast when done.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fleet-installed
QUESTION ?= How do Python's asyncio tasks get cancelled, and how does a program shield work from cancellation?

# What the virtualenv holds: `locked` (requirements.lock, what CI tests) or `latest` (the
# newest releases pyproject.toml's ranges allow: `make test-latest`).
DEPS ?= locked
LOCK := requirements.lock

.PHONY: setup demo test test-latest test-deps lint lock rehearse bench clean docs docs-serve

# The lock's releases, each file checked against the lock's hashes (pip refuses a file
# that differs and a dependency the lock does not name). The virtualenv is made anew
# whenever the lock changes, so that it holds the lock and nothing else.
$(VENV)/.fleet-locked: $(LOCK)
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q python3-venv; \
	  else echo "fleet: python3 venv support is missing; run 'sudo apt-get install python3-venv'" >&2; exit 2; fi; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	@touch $@

# The newest allowed releases, asked of the index every time.
.PHONY: $(VENV)/.fleet-latest
$(VENV)/.fleet-latest:
	@[ -x $(BIN)/pip ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade --upgrade-strategy eager setuptools -e '.[dev,cluster]'
	@touch $@

# Fleet itself, editable, over what the line above installed (no dependency of its own).
$(STAMP): $(VENV)/.fleet-$(DEPS) pyproject.toml
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	@$(BIN)/pip check >/dev/null || { $(BIN)/pip check; exit 1; }
	@touch $@

# Fleet's own modules are byte-compiled here: the editable install leaves them as
# source, and where PYTHONDONTWRITEBYTECODE is set every fleet process (and every Ray
# worker) would compile them again (about 0.3 s of CPU each). Up to date, this is a stat;
# a tree it may not write to is left as it is.
setup: $(STAMP)
	@$(BIN)/python -m compileall -qq coordinator subagents sandbox || true
	$(BIN)/fleet setup

demo: setup
	$(BIN)/fleet research "$(QUESTION)" --members 3

# The trace page is tested in the host's Chromium (Debian's package), like a user's browser;
# the repository-setup test sets up a real published project (tests/projects/), whose
# files are downloaded here once, each checked against the hash the list pins.
PROJECTS_DIR = $${FLEET_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/fleet}/test-projects
test-deps: $(STAMP)
	@d=$(PROJECTS_DIR)/freezegun; [ -f $$d/.done ] || { rm -rf $$d && \
	  $(BIN)/pip download -q --no-deps --require-hashes -r tests/projects/freezegun.txt -d $$d && touch $$d/.done; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then echo "fleet: installing chromium for the trace page tests (one time)"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	  else echo "fleet: the tests need Chromium; run 'sudo apt-get install chromium'" >&2; exit 2; fi; }

# The documentation site (mkdocs.yml, docs/), built strictly: a broken link, anchor or
# API reference fails the build (the suite builds it too: tests/test_docs_site.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

# Lint, format and types gate the tests: what a reviewer would check, CI checks first;
# then gVisor is registered (the tests run boxes under it too; registering needs root, and
# without it they skip, or fail under CI) and fleet doctor says which of Fleet's
# guarantees hold on this machine (exit 1 if one does not). The suite keeps its
# bytecode even where PYTHONDONTWRITEBYTECODE is set: without it each worker rewrote and
# compiled every test module again (11 s of CPU to collect instead of 5), and every
# process a test starts compiled the helpers it imports. Four workers on two cores: a
# worker spends much of a test waiting on a box, a node or a timeout (759 s against 826 s
# for three, back to back on one machine, bench/README.md). The images, the tests' own
# dependencies and the lint gate are made at the same time once the virtualenv is there:
# on a new machine the images take minutes, mostly waiting on Debian's mirror, and the
# lint gate's half a minute of CPU fits beside them (lines of their output interleave).
test: $(STAMP)
	@$(MAKE) --no-print-directory -j3 --output-sync=line setup test-deps lint
	$(BIN)/fleet setup --gvisor || [ "$$(id -u)" != 0 ]
	$(BIN)/fleet doctor
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -x -q -n 4

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy images/corpus/corpus_server.py  # in its image's directory, not a package

# The suite against the newest releases pyproject.toml allows, in a virtualenv of its
# own: an upstream release that breaks Fleet shows here before a user meets it. When it
# passes, `make lock UPGRADE=1` takes those releases into the lock.
test-latest:
	$(MAKE) test VENV=.venv-latest DEPS=latest

# Re-resolve requirements.lock from pyproject.toml's ranges (and its build backend),
# keeping each pin that still fits; UPGRADE=1 takes the newest allowed instead. For
# every platform and Python 3.11+, with the hashes of every file of each release.
lock: $(STAMP)
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
	  | $(BIN)/uv pip compile pyproject.toml - --extra dev --extra cluster --universal \
	    --python-version 3.11 --generate-hashes --index-url https://pypi.org/simple \
	    --custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade) -q -o $(LOCK)

# CI's run on a new clone, started three ways (foreground, as a background job, beside
# two CPU-bound processes), each from a stopped engine with no Fleet image: bench/rehearse.py.
rehearse:
	$(PYTHON) bench/rehearse.py

bench: setup
	$(BIN)/python bench/sandbox.py && $(BIN)/python bench/harness.py && $(BIN)/python bench/fanout.py && $(BIN)/python bench/cluster.py

clean:
	rm -rf $(VENV) .venv-latest build *.egg-info
