# The README's commands. Each one runs ./setup.sh first (idempotent: Debian
# packages, Open vSwitch started, the virtual environment), so a fresh machine
# needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test unit clean

setup:
	./setup.sh

run: setup
	$(VENV)/bin/dblp-testbed run $(ARGS)

# The whole suite: unit, emulation (root + OVS) and end-to-end runs.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

clean: setup
	$(VENV)/bin/dblp-testbed clean
