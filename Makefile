# The two commands of the README. Each sets itself up in .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ITERATIONS ?= 2

.PHONY: run test test-fast install clean sandbox-deps

## make run: set up, then warm start + $(ITERATIONS) closed-loop iterations on the built-in policy
run: $(STAMP) sandbox-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/closedloop run --iterations $(ITERATIONS)

## make test: set up, then the whole test suite
test: $(STAMP) sandbox-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=25 -n 2 --dist loadscope --no-loadscope-reorder

## make test-fast: the inner loop: the unit tests only (no whole iteration, Prefect server or Ray cluster)
test-fast: $(STAMP) sandbox-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=10 -n 2 --dist loadscope --no-loadscope-reorder tests/unit -m "not slow and not ray and not gpu"

install: $(STAMP)

# torch is pinned: 2.13.0 is the CPU build on this machine's disk; a plain `torch` pulls a multi-GB
# CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The sandbox jails its workers with bubblewrap. Installed here when missing and we are root (CI, a
# fresh machine); otherwise the sandbox falls back to the strongest level it can have and says so.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || \
	  echo "note: bubblewrap not installed; the sandbox will run without namespaces"; }

clean:
	rm -rf $(VENV) .pytest_cache
