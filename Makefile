# The README's commands. Each one runs ./setup.sh first (idempotent: Debian
# packages, Open vSwitch started, the virtual environment), so a fresh machine
# needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup venv run test test-all test-tools lint unit clean reference reproduce lock vm-check vm-results

setup:
	./setup.sh

run: setup
	$(VENV)/bin/dblp-testbed run $(ARGS)

# Debian packages only tests use, installed before the suite, never during it:
# Vagrant validates the Vagrantfile, tshark decodes a capture with the dissector,
# the preflight tests start their own sshd (the cluster group) on loopback.
TEST_TOOLS := vagrant tshark cluster rehearsal
# Unit tests run in parallel (pytest-xdist), one worker per core: they need
# no root and no fabric, and each makes its own files and ports.
UNIT_WORKERS ?= auto
# Emulation tests and whole runs `make test` leaves out: the ones marked
# `long` (README, "Tests": which and why). `make test-all` runs them too.
EMU_SELECT ?= -m "not long"

# The whole suite: lint and type check; unit tests first, in parallel; then
# emulation (root + OVS) and whole runs one at a time, since a run checks
# that it had the machine's CPU to itself. Both parts run and either one's
# failure fails the target (pytest's 5, nothing collected, is a failure too).
# The emulation tests are required here (CI runs this): without root or
# Open vSwitch they fail instead of being skipped. Both parts add their
# tests' durations to one file, and the suite ends with its 25 slowest tests.
# The rehearsal's machine image (minutes the first time, mostly network and
# disk) is made in the background while the unit tests use the CPU;
# the emulation tests start once it is ready (its log is shown if it failed:
# the rehearsal's tests then say why too).
test: setup lint test-tools
	d=$$(mktemp); \
	$(PY) -m testbed.emulation.cluster.machines >$$d.image 2>&1 & image=$$!; \
	$(PY) -m pytest -n $(UNIT_WORKERS) --suite-durations=$$d $(PYTEST_ARGS) tests/unit; unit=$$?; \
	wait $$image || { echo "rehearsal image failed:"; tail -5 $$d.image; }; \
	grep -h "ready in" $$d.image || true; rm -f $$d.image; \
	DBLP_TESTBED_REQUIRE_EMU=1 $(PY) -m pytest $(EMU_SELECT) --suite-durations=$$d $(PYTEST_ARGS) tests/emu tests/e2e; \
	emu=$$?; rm -f $$d; [ $$unit -eq 0 ] || exit $$unit; exit $$emu

# Every test, the long ones too: before a reference is remade (make reference,
# make reproduce), so the runs it rests on are checked in full.
test-all: EMU_SELECT =
test-all: test

test-tools: setup
	./setup.sh $(TEST_TOOLS)

# ruff over the tree, mypy over the transport (settings in pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The unit tests and the linters need no root: the environment without starting OVS.
venv:
	./setup.sh --no-ovs

unit: venv
	$(PY) -m pytest -n $(UNIT_WORKERS) $(PYTEST_ARGS) tests/unit

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
# installed here and by `make test` (./setup.sh vagrant), not for every user.
vm-check: setup
	./setup.sh vagrant
	$(PY) -m pytest tests/e2e/test_vagrant_validate.py $(PYTEST_ARGS)

# The reviewer VM's results/ copied back here: its synced folder (rsync, so it
# works with both providers and no guest additions) only goes into the VM.
vm-results:
	mkdir -p .vagrant results
	vagrant ssh-config > .vagrant/ssh-config
	rsync -a -e "ssh -F .vagrant/ssh-config" default:/vagrant/results/ results/
