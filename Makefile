# The README's commands. Each one runs ./setup.sh first (idempotent: Debian
# packages, Open vSwitch started, the virtual environment), so a fresh machine
# needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test lint unit clean reference reproduce lock vm-check vm-results

setup:
	./setup.sh

run: setup
	$(VENV)/bin/dblp-testbed run $(ARGS)

# The whole suite: lint and type check, then unit, emulation (root + OVS)
# and end-to-end runs. The emulation tests are required here (CI runs this):
# without root or Open vSwitch they fail instead of being skipped.
test: setup lint
	DBLP_TESTBED_REQUIRE_EMU=1 $(PY) -m pytest $(PYTEST_ARGS)

# ruff over the tree, mypy over the transport (settings in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

clean: setup
	$(VENV)/bin/dblp-testbed clean

# Refresh results/reference/ci.json: five runs of the `ci` preset, their
# medians as the reference and their run-to-run spread as the tolerances.
REF_RUNS ?= 5
reference: setup
	@stamp=$$(date -u +%Y%m%dT%H%M%SZ); dirs=""; \
	for i in $$(seq 1 $(REF_RUNS)); do \
	  d=results/reference-runs/$$stamp-$$i; \
	  $(VENV)/bin/dblp-testbed run --preset ci --out $$d || exit 1; dirs="$$dirs $$d"; \
	done; \
	$(VENV)/bin/dblp-testbed compare $$dirs --reference results/reference/ci.json --update

# Every run behind the README's result tables, from scratch; keeps their
# small files under results/reference/ and re-renders the tables of the README
# and docs/results/.
reproduce: setup
	$(VENV)/bin/dblp-testbed reproduce $(ARGS)

# Rewrite constraints.txt (the exact Python package set setup.sh installs)
# from this machine's venv, after changing a dependency in pyproject.toml.
# torch is locked without its build label (+cpu): which build of that version
# a machine gets is setup.sh's choice (testbed/install.py).
lock: setup
	{ echo "# Exact versions ./setup.sh installs (pip -c). Regenerate: make lock"; \
	  $(VENV)/bin/pip freeze --exclude-editable | grep -v '^mininet==' \
	    | sed 's/^torch==\([^+]*\)+.*/torch==\1/'; } > constraints.txt

# The reviewer VM's Vagrantfile, validated by Vagrant itself. Vagrant is
# installed here only (./setup.sh vagrant), not for every user of the project.
vm-check: setup
	./setup.sh vagrant
	$(PY) -m pytest tests/e2e/test_vagrant_validate.py $(PYTEST_ARGS)

# The reviewer VM's results/ copied back here: its synced folder (rsync, so it
# works with both providers and no guest additions) only goes into the VM.
vm-results:
	mkdir -p .vagrant results
	vagrant ssh-config > .vagrant/ssh-config
	rsync -a -e "ssh -F .vagrant/ssh-config" default:/vagrant/results/ results/
