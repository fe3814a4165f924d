# Every target sets up what it needs: a fresh machine only needs python3 (3.11+), make,
# and a C compiler with the Python headers for the compiled core.
#
# Two virtualenvs, each with the library installed from a wheel built here (never the
# checkout's source): .venv holds the compiled core, .venv-pure the pure-Python one.
# Both also hold the example broker's own distribution (examples/pyproject.toml).
# Commands run with PYTHONSAFEPATH=1 and the checkout appended to sys.path by a .pth
# file, so `tests`, `bench` and `examples` import from the checkout while
# `purgatory_aio` and `minikafka` resolve to the installed wheels.
.DEFAULT_GOAL := install
# Nothing built here is a throwaway intermediate (the venvs' pythons in particular).
.SECONDARY:
PYTHON ?= python3
PYTEST_ARGS ?=

VENV      ?= .venv
VENV_PURE ?= .venv-pure
DIST      := dist
# What goes into each wheel: a change to any of these files rebuilds and reinstalls it.
CORE_FILES := pyproject.toml hatch_build.py LICENSE \
	$(shell find purgatory_aio -type f -not -path '*/__pycache__/*' -not -name '*.py[co]' -not -name '*.so')
EXAMPLE_FILES := examples/pyproject.toml examples/LICENSE \
	$(shell find examples/minikafka -type f -not -path '*/__pycache__/*' -not -name '*.py[co]')
# Extras of the library and of the examples that the tests, benches and demo use.
CORE_EXTRAS    := dev
EXAMPLE_EXTRAS := all

# Benchmarks, the simulator and the demo run on the compiled core; BUILD=pure runs them
# on the pure-Python one instead (the records say which build ran).
BUILD ?= compiled
ifeq ($(BUILD),pure)
RUN_VENV := $(VENV_PURE)
else ifeq ($(BUILD),compiled)
RUN_VENV := $(VENV)
else
$(error BUILD=$(BUILD): use BUILD=compiled or BUILD=pure)
endif
RUN := PYTHONSAFEPATH=1 $(RUN_VENV)/bin

.PHONY: install install-pure wheel test test-compiled test-pure lint docs bench bench-quick \
	bench-http bench-proto demo sim clean

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

wheel: $(DIST)/compiled/.built $(DIST)/pure/.built $(DIST)/examples/.built
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
	$(1)/bin/python -m pip install --quiet --force-reinstall --no-deps \
	  $(DIST)/$(2)/*.whl $(DIST)/examples/*.whl
	$(1)/bin/python -m pip install --quiet \
	  "$$(ls $(DIST)/$(2)/*.whl)[$(CORE_EXTRAS)]" "$$(ls $(DIST)/examples/*.whl)[$(EXAMPLE_EXTRAS)]"
	echo "$(CURDIR)" > "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_purgatory_aio_checkout.pth"
	cd / && $(CURDIR)/$(1)/bin/python -c 'import purgatory_aio, sys; \
	  sys.exit(f"$(1) imports purgatory_aio.compiled={purgatory_aio.compiled}, wanted $(2)" \
	           if purgatory_aio.compiled != ("$(2)" == "compiled") else 0)'
	touch $(1)/.installed
endef

$(VENV)/.installed: $(DIST)/compiled/.built $(DIST)/examples/.built | $(VENV)/bin/python
	$(call install_into,$(VENV),compiled)

$(VENV_PURE)/.installed: $(DIST)/pure/.built $(DIST)/examples/.built | $(VENV_PURE)/bin/python
	$(call install_into,$(VENV_PURE),pure)

install: $(VENV)/.installed
install-pure: $(VENV_PURE)/.installed

# --- tests -------------------------------------------------------------------------
# The whole suite runs against each installed build; conftest checks that the
# installed package is the one imported, and of the build asked for here.
# pytest exits 5 when it collected no test: a failure here, never a pass.
define pytest_on
	@echo "== tests on the $(2) core ($(1))"
	@PYTHONSAFEPATH=1 PURGATORY_AIO_EXPECT_BUILD=$(2) PURGATORY_AIO_WHEEL_DIR=$(CURDIR)/$(DIST)/$(2) \
	  PURGATORY_AIO_EXAMPLES_WHEEL_DIR=$(CURDIR)/$(DIST)/examples \
	  $(1)/bin/python -m pytest $(PYTEST_ARGS) $(3); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc
endef

# The docs are built once (they read the source, not an installed build); the suite
# then runs on each build, its snippet and API-reference tests included.
test: docs test-compiled test-pure

# Each run also needs the other build's wheel: the differential test runs both.
test-compiled: $(VENV)/.installed $(DIST)/pure/.built
	$(call pytest_on,$(VENV),compiled)

test-pure: $(VENV_PURE)/.installed $(DIST)/compiled/.built
	$(call pytest_on,$(VENV_PURE),pure)

lint: install
	$(VENV)/bin/ruff check purgatory_aio tests examples bench hatch_build.py mkdocs_hooks.py
	$(VENV)/bin/ruff format --check purgatory_aio tests examples bench hatch_build.py mkdocs_hooks.py
	$(VENV)/bin/mypy

# --- documentation -----------------------------------------------------------------
# The site from docs/ into site/. --strict makes every warning an error: a broken link
# or anchor, a page missing from the nav, a reference mkdocstrings cannot resolve.
# mkdocstrings reads the checkout's source statically, so either build documents it.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# --- running -----------------------------------------------------------------------
bench: $(RUN_VENV)/.installed
	$(RUN)/python -m bench all

bench-quick: $(RUN_VENV)/.installed
	$(RUN)/python -m bench all --quick

bench-http: $(RUN_VENV)/.installed
	$(RUN)/python -m bench http

# The C prototype of the timer core (bench/proto/cwheel.c, not part of the library):
# compiled here only, never by `make test`. Its tests check it does a timer's work
# (the `proto` marker, left out of the default run), then W3 measures it.
bench-proto: $(RUN_VENV)/.installed
	$(call pytest_on,$(RUN_VENV),$(BUILD),-m proto tests/test_proto_timer.py)
	$(RUN)/python -m bench proto-timer

sim: $(RUN_VENV)/.installed
	$(RUN)/purgatory-sim --virtual-time --duration 120 --faults all

demo: $(RUN_VENV)/.installed
	$(RUN)/python -m examples.demo

clean:
	rm -rf $(VENV) $(VENV_PURE) $(DIST) build site .pytest_cache .mypy_cache .ruff_cache .hypothesis
