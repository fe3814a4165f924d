# Every target sets up what it needs: a fresh machine only needs python3 (3.11+) and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# The compiled core (mypyc): a copy of the package whose hot modules are C extensions.
# Targets run on it with its directory first on the path and the checkout's own
# directory not prepended (PYTHONSAFEPATH), so the compiled copy is the one imported.
COMPILED     := build/mypyc
COMPILED_OK  := $(COMPILED)/.built
ON_COMPILED  := PYTHONSAFEPATH=1 PYTHONPATH=$(CURDIR)/$(COMPILED)

.PHONY: install compile wheel test test-pure test-compiled lint bench bench-quick bench-http demo sim clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "purgatory_aio needs Python 3.11+, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@# The fan-out tests start a real redis-server (Debian's package) on a free port.
	command -v redis-server >/dev/null || { apt-get update && apt-get install -y redis-server; }
	touch $(STAMP)

install: $(STAMP)

$(COMPILED_OK): $(wildcard purgatory_aio/*.py) $(STAMP)
	$(BIN)/python -m purgatory_aio._compile --out $(COMPILED)
	touch $@

compile: $(COMPILED_OK)

# A wheel with the compiled core in it (a plain `pip install .` builds a pure one).
wheel: install
	HATCH_BUILD_HOOK_ENABLE_CUSTOM=1 $(BIN)/python -m pip wheel --no-deps -w dist .

# The whole suite runs on both builds of the core: the pure-Python source and the
# compiled copy. pytest exits 5 when it collected no test: a failure here, never a pass.
test: test-pure test-compiled

test-pure: install
	@echo "== tests on the pure-Python core"
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-compiled: compile
	@echo "== tests on the compiled core"
	@$(ON_COMPILED) $(BIN)/python -c 'import purgatory_aio, sys; sys.exit(not purgatory_aio.compiled)' \
	  || { echo "make test: the compiled core was not the one imported" >&2; exit 1; }
	@$(ON_COMPILED) $(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check purgatory_aio tests examples bench
	$(BIN)/ruff format --check purgatory_aio tests examples bench
	$(BIN)/mypy

# Benchmarks, the simulator and the demo run on the compiled core; BUILD=pure runs
# them on the pure-Python source instead (the records say which build ran).
BUILD ?= compiled
ifeq ($(BUILD),pure)
RUN_DEPS :=
RUN_ENV  :=
else
RUN_DEPS := $(COMPILED_OK)
RUN_ENV  := $(ON_COMPILED)
endif

bench: install $(RUN_DEPS)
	$(RUN_ENV) $(BIN)/python -m bench all

bench-quick: install $(RUN_DEPS)
	$(RUN_ENV) $(BIN)/python -m bench all --quick

bench-http: install $(RUN_DEPS)
	$(RUN_ENV) $(BIN)/python -m bench http

sim: install $(RUN_DEPS)
	$(RUN_ENV) $(BIN)/purgatory-sim --virtual-time --duration 120 --faults all

demo: install $(RUN_DEPS)
	$(RUN_ENV) $(BIN)/python -m examples.demo

clean:
	rm -rf $(VENV) $(COMPILED) .pytest_cache .mypy_cache .ruff_cache .hypothesis
