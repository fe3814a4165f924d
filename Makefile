# Every target sets up what it needs: a fresh machine only needs python3 (3.11+) and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test lint bench bench-quick bench-http demo sim clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "purgatory_aio needs Python 3.11+, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# pytest exits 5 when it collected no test: that is a failure here, never a silent pass.
test: install
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check purgatory_aio tests examples bench
	$(BIN)/ruff format --check purgatory_aio tests examples bench
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench all

bench-quick: install
	$(BIN)/python -m bench all --quick

bench-http: install
	$(BIN)/python -m bench http

sim: install
	$(BIN)/purgatory-sim --virtual-time --duration 120 --faults all

demo: install
	$(BIN)/python -m examples.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
