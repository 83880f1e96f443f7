# The two commands of the README: `make book` and `make test`. Each creates the pinned
# environment in .venv first when it is missing or older than the lock file.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: env book test test-fast clean

env: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going
	@echo "Open _build/html/index.html in a browser."

test: $(STAMP)
	$(PYTEST) -n 2 --cov=tfm_solution --cov-report=term --cov-fail-under=95

test-fast: $(STAMP)
	$(PYTEST) -m fast -q

clean:
	rm -rf _build .pytest_cache .coverage
