# Set-up commands for a fresh clone (see README.md):
#   make up     install into .venv if needed, then start the API and a worker (embedded defaults)
#   make test   install into .venv if needed, then run the whole test suite
#
# Overridable: PYTHON (>= 3.11), VENV, TORCH_SPEC (pip arguments for torch, e.g.
# TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128' for one
# CUDA build), PYTEST_ARGS, and ARGS (extra pytest arguments: make test ARGS='tests/trainer -x').

PYTHON ?= python3
VENV ?= .venv
# torch comes first and pinned: left to the dependency resolver, an unpinned torch may
# pull a multi-GB CUDA build where a CPU build is enough.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?= -q -ra --durations=15
ARGS ?=

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
# Written after a successful install; older than pyproject.toml means "install again".
STAMP := $(VENV)/.halfcast-installed

.PHONY: up test install

up: $(STAMP)
	$(BIN)/halfcast up

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS) $(ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e '.[test]'
	touch $@
