# Every target sets up what it needs: a fresh machine only needs python3 (3.11+), make,
# and a C compiler with the Python headers for the compiled core.
#
# .venv holds the library installed from its compiled wheel built here (never the
# checkout's source), the example broker's own distribution (examples/pyproject.toml) and
# the Spark report's (report/pyproject.toml).
# The compiled wheel carries both implementations of the core: PURGATORY_AIO_NO_EXTENSIONS=1
# runs its pure-Python source instead of the extensions (BUILD=pure below does that).
# Each other supported CPython (MATRIX_VERSIONS) gets .venv-X.Y with the core and its
# test tools, for the core suite (make test-versions).
# Commands run with PYTHONSAFEPATH=1 and the checkout appended to sys.path by a .pth
# file, so `tests`, `bench` and `examples` import from the checkout while
# `purgatory_aio`, `minikafka` and `purgatory_report` resolve to the installed wheels.
.DEFAULT_GOAL := install
# Nothing built here is a throwaway intermediate (the venvs' pythons in particular).
.SECONDARY:
PYTHON ?= python3
PYTEST_ARGS ?=

VENV      ?= .venv
DIST      := dist
# What goes into each wheel: a change to any of these files rebuilds and reinstalls it.
CORE_FILES := pyproject.toml hatch_build.py LICENSE \
	$(shell find purgatory_aio -type f -not -path '*/__pycache__/*' -not -name '*.py[co]' -not -name '*.so')
EXAMPLE_FILES := examples/pyproject.toml examples/LICENSE \
	$(shell find examples/minikafka -type f -not -path '*/__pycache__/*' -not -name '*.py[co]')
REPORT_FILES := report/pyproject.toml report/LICENSE report/README.md \
	$(shell find report/purgatory_report -type f -not -path '*/__pycache__/*' -not -name '*.py[co]')
# Extras of the library and of the examples that the tests, benches and demo use.
CORE_EXTRAS    := dev
EXAMPLE_EXTRAS := all

# Benchmarks, the simulator and the demo run on the compiled core; BUILD=pure runs them
# on the pure-Python source of the same install instead (the records say which ran).
BUILD ?= compiled
ifeq ($(BUILD),pure)
SWITCH := PURGATORY_AIO_NO_EXTENSIONS=1
else ifeq ($(BUILD),compiled)
SWITCH :=
else
$(error BUILD=$(BUILD): use BUILD=compiled or BUILD=pure)
endif
RUN_VENV := $(VENV)
RUN := PYTHONSAFEPATH=1 $(SWITCH) $(RUN_VENV)/bin

# The other supported CPythons: pyenv's build of each version where pyenv has one, else
# pythonX.Y on PATH. make test-versions fails if one is missing.
MATRIX_VERSIONS ?= 3.12 3.13
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
python_for = $(or $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python$(1)))),$(shell command -v python$(1) 2>/dev/null))

.PHONY: install wheel test test-all test-core-pure test-versions test-one-version lint docs bench bench-quick bench-versions \
	bench-http demo sim clean

# --- wheels ------------------------------------------------------------------------
# Built in an isolated build env (as `pip install .` does), by the build hook in
# hatch_build.py. PURGATORY_AIO_BUILD=compiled fails loudly without a C compiler.
$(DIST)/%/.built: $(CORE_FILES) | $(VENV)/bin/python
	rm -rf $(DIST)/$*
	PURGATORY_AIO_BUILD=$* $(VENV)/bin/python -m pip wheel --quiet --no-deps -w $(DIST)/$* .
	touch $@

$(DIST)/examples/.built: $(EXAMPLE_FILES) | $(VENV)/bin/python
	rm -rf $(DIST)/examples
	$(VENV)/bin/python -m pip wheel --quiet --no-deps -w $(DIST)/examples ./examples
	touch $@

$(DIST)/report/.built: $(REPORT_FILES) | $(VENV)/bin/python
	rm -rf $(DIST)/report
	$(VENV)/bin/python -m pip wheel --quiet --no-deps -w $(DIST)/report ./report
	touch $@

wheel: $(DIST)/compiled/.built $(DIST)/pure/.built $(DIST)/examples/.built $(DIST)/report/.built
	@ls $(DIST)/*/*.whl

# --- virtualenvs -------------------------------------------------------------------
%/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "purgatory_aio needs Python 3.11+, found " + sys.version'
	$(PYTHON) -m venv $*
	$*/bin/python -m pip install --quiet --upgrade pip

# $(1): the venv, $(2): the core build it gets. The wheels are reinstalled whenever
# rebuilt (same version number, hence --force-reinstall); the dependencies only once.
define install_into
	@# The fan-out tests start a real redis-server (Debian's package) on a free port.
	command -v redis-server >/dev/null || { apt-get update && apt-get install -y redis-server; }
	@# ... and a real PostgreSQL (initdb from Debian's package, which keeps it off PATH).
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get update && apt-get install -y postgresql; }
	$(1)/bin/python -m pip install --quiet --force-reinstall --no-deps \
	  $(DIST)/$(2)/*.whl $(DIST)/examples/*.whl $(DIST)/report/*.whl
	$(1)/bin/python -m pip install --quiet \
	  "$$(ls $(DIST)/$(2)/*.whl)[$(CORE_EXTRAS)]" "$$(ls $(DIST)/examples/*.whl)[$(EXAMPLE_EXTRAS)]" \
	  "$$(ls $(DIST)/report/*.whl)"
	echo "$(CURDIR)" > "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_purgatory_aio_checkout.pth"
	cd / && $(CURDIR)/$(1)/bin/python -c 'import purgatory_aio, sys; \
	  sys.exit(f"$(1) imports purgatory_aio.compiled={purgatory_aio.compiled}, wanted $(2)" \
	           if purgatory_aio.compiled != ("$(2)" == "compiled") else 0)'
	touch $(1)/.installed
endef

$(VENV)/.installed: $(DIST)/compiled/.built $(DIST)/examples/.built $(DIST)/report/.built | $(VENV)/bin/python
	$(call install_into,$(VENV),compiled)

install: $(VENV)/.installed

# --- the other CPythons: the core and its test tools only ------------------------------
# $(1): X.Y. Its compiled wheel is built by that interpreter, in an isolated build env.
define version_venv
.venv-$(1)/bin/python:
	@test -n "$$(call python_for,$(1))" || { echo "make: CPython $(1) not found (pyenv install $(1), or put python$(1) on PATH)" >&2; exit 1; }
	$$(call python_for,$(1)) -m venv .venv-$(1)
	.venv-$(1)/bin/python -m pip install --quiet --upgrade pip

$(DIST)/$(1)/.built: $(CORE_FILES) | .venv-$(1)/bin/python
	rm -rf $(DIST)/$(1)
	PURGATORY_AIO_BUILD=compiled .venv-$(1)/bin/python -m pip wheel --quiet --no-deps -w $(DIST)/$(1) .
	touch $$@

.venv-$(1)/.installed: $(DIST)/$(1)/.built
	.venv-$(1)/bin/python -m pip install --quiet --force-reinstall --no-deps $(DIST)/$(1)/*.whl
	.venv-$(1)/bin/python -m pip install --quiet "$$$$(ls $(DIST)/$(1)/*.whl)[$(CORE_TEST_EXTRAS)]"
	echo "$(CURDIR)" > "$$$$(.venv-$(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_purgatory_aio_checkout.pth"
	touch $$@
endef
CORE_TEST_EXTRAS := test,uvloop
$(foreach version,$(MATRIX_VERSIONS),$(eval $(call version_venv,$(version))))

# --- tests -------------------------------------------------------------------------
# conftest checks that the installed package is the one imported, and that the
# implementation asked for here runs. pytest exits 5 when it collected no test: a
# failure here, never a pass.
# $(1): the venv, $(2): compiled or pure, $(3): pytest's arguments, $(4): the directory of
# the library wheel installed there (dist/compiled by default).
define pytest_on
	@echo "== tests on the $(2) core ($(1): $$($(1)/bin/python -c 'import platform; print(platform.python_version())'))"
	@PYTHONSAFEPATH=1 PURGATORY_AIO_EXPECT_BUILD=$(2) $(if $(filter pure,$(2)),PURGATORY_AIO_NO_EXTENSIONS=1) \
	  PURGATORY_AIO_WHEEL_DIR=$(CURDIR)/$(or $(4),$(DIST)/compiled) \
	  PURGATORY_AIO_EXAMPLES_WHEEL_DIR=$(CURDIR)/$(DIST)/examples \
	  PURGATORY_AIO_REPORT_WHEEL_DIR=$(CURDIR)/$(DIST)/report \
	  $(1)/bin/python -m pytest $(PYTEST_ARGS) $(3); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc
endef

# The docs are built once (they read the source, not an installed build). Then the whole
# suite runs once, on the compiled core, and the core's own tests (marker `core`) again
# on its pure-Python source: everything else (fan-out, integrations, broker, report)
# runs the same code whichever implementation of the core is imported.
test: docs test-all test-core-pure

# The whole suite is spread over PYTEST_WORKERS processes (pytest-xdist, --dist loadgroup:
# tests/conftest.py keeps each file's tests on one worker, and the Spark tests and the
# fan-out's, whose servers start once per run, on one worker each).
PYTEST_WORKERS ?= 2
test-all: $(VENV)/.installed $(DIST)/pure/.built
	$(call pytest_on,$(VENV),compiled,-n $(PYTEST_WORKERS) --dist loadgroup)

test-core-pure: $(VENV)/.installed
	$(call pytest_on,$(VENV),pure,-m core)

# The core's tests on every other supported CPython, on both implementations (CI runs it
# after make test; it fails if one of those interpreters is missing).
test-versions: $(foreach version,$(MATRIX_VERSIONS),.venv-$(version)/.installed)
	@set -e; for version in $(MATRIX_VERSIONS); do \
	  for build in compiled pure; do \
	    $(MAKE) --no-print-directory test-one-version VERSION=$$version IMPL=$$build; \
	  done; \
	done

test-one-version:
	$(call pytest_on,.venv-$(VERSION),$(IMPL),-m core -p no:cacheprovider,$(DIST)/$(VERSION))

# The interpreter make would use for a version (.ci/run asks for 3.11's); fails if none.
interpreter-%:
	@test -n "$(call python_for,$*)" || { echo "make: CPython $* not found (pyenv install $*, or put python$* on PATH)" >&2; exit 1; }
	@echo "$(call python_for,$*)"

lint: install
	$(VENV)/bin/ruff check purgatory_aio report tests examples bench hatch_build.py mkdocs_hooks.py
	$(VENV)/bin/ruff format --check purgatory_aio report tests examples bench hatch_build.py mkdocs_hooks.py
	$(VENV)/bin/mypy

# --- documentation -----------------------------------------------------------------
# The site from docs/ into site/. --strict makes every warning an error: a broken link
# or anchor, a page missing from the nav, a reference mkdocstrings cannot resolve.
# mkdocstrings reads the checkout's source statically (never imports it), so the site
# needs neither the library nor any other extra: .venv-docs holds the requirements of
# the library's `docs` extra alone, read from pyproject.toml.
DOCS_VENV := .venv-docs
$(DOCS_VENV)/.installed: pyproject.toml | $(DOCS_VENV)/bin/python
	$(DOCS_VENV)/bin/python -c 'import subprocess, sys, tomllib; \
	  docs = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]; \
	  sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *docs]))'
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

# --- running -----------------------------------------------------------------------
bench: $(RUN_VENV)/.installed
	$(RUN)/python -m bench all

bench-quick: $(RUN_VENV)/.installed
	$(RUN)/python -m bench all --quick

# W5 and W1-user on every supported CPython, compiled, asyncio, one after another in one
# run: records under bench/results/versions/X.Y/ (docs/benchmarks.md quotes them).
BENCH_VERSIONS_ARGS ?=
bench-versions: $(VENV)/.installed $(foreach version,$(MATRIX_VERSIONS),.venv-$(version)/.installed)
	@set -e; for venv in $(VENV) $(foreach version,$(MATRIX_VERSIONS),.venv-$(version)); do \
	  version=$$($$venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  out=bench/results/versions/$$version; mkdir -p $$out; \
	  for workload in w5 w1-user; do \
	    echo "== $$workload on CPython $$version (compiled, asyncio)"; \
	    extra=; if [ $$workload = w5 ]; then extra="--duration 30"; fi; \
	    PYTHONSAFEPATH=1 $$venv/bin/python -m bench $$workload --loop asyncio --plain \
	      --no-report --results-dir $$out $$extra $(BENCH_VERSIONS_ARGS); \
	  done; \
	done

bench-http: $(RUN_VENV)/.installed
	$(RUN)/python -m bench http

sim: $(RUN_VENV)/.installed
	$(RUN)/purgatory-sim --virtual-time --duration 120 --faults all

demo: $(RUN_VENV)/.installed
	$(RUN)/python -m examples.demo

clean:
	rm -rf $(VENV) $(DOCS_VENV) $(foreach version,$(MATRIX_VERSIONS),.venv-$(version)) $(DIST) build site .pytest_cache .mypy_cache .ruff_cache .hypothesis
