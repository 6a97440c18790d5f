"""Shared pytest fixtures and the emulation-test policy.

Emulation tests (markers ``emu`` and ``e2e``) need root and Open vSwitch. A
developer without root sees them skipped. Where they must run, a missing
emulator is a failure, never a skip: as root (the emulator was asked for),
under ``CI=true``, and whenever ``DBLP_TESTBED_REQUIRE_EMU=1``, which
``make test`` (the command ``.ci/run`` runs) sets, so CI cannot go green
without them.

``machine_leftovers`` is the oracle the tear-down tests compare against: it
reads the machine with the system's own tools (nft, ovs-vsctl, ip, ps) and
the project's naming convention, never through ``testbed``'s clean-up code,
so a clean-up bug cannot hide its own leftovers.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REQUIRE_ENV = "DBLP_TESTBED_REQUIRE_EMU"


def _emulator_problem():
    """Return why the emulator is unusable, or None."""
    for tool in ("mnexec", "ovs-vsctl", "tc", "ip", "nft", "ethtool"):
        if shutil.which(tool) is None:
            return f"{tool} not found (run ./setup.sh)"
    try:
        subprocess.run(["ovs-vsctl", "--timeout=5", "show"], check=True,
                       capture_output=True)
    except (subprocess.CalledProcessError, OSError):
        return "Open vSwitch is not running (run ./setup.sh)"
    return None


def emulation_required() -> bool:
    """Whether a missing emulator must fail the suite instead of skipping tests."""
    return os.environ.get("CI") == "true" or os.environ.get(REQUIRE_ENV) == "1"


@pytest.fixture(scope="session")
def emulator():
    """Skip (non-root developer) or fail (root, CI, .ci/run) when the emulator cannot run."""
    if os.geteuid() != 0:
        if emulation_required():
            pytest.fail("emulation tests must run here but need root "
                        f"(CI=true or {REQUIRE_ENV}=1); run as root")
        pytest.skip("emulation tests need root")
    problem = _emulator_problem()
    if problem:
        pytest.fail(f"root but the emulator is missing: {problem}")
    return True


@pytest.fixture(autouse=True)
def _emulation_gate(request):
    """Every ``emu``/``e2e`` test gets the emulator check first."""
    if request.node.get_closest_marker("emu") or request.node.get_closest_marker("e2e"):
        request.getfixturevalue("emulator")


def _lines(argv) -> list[str]:
    p = subprocess.run(argv, capture_output=True, text=True)
    return p.stdout.splitlines()


def machine_leftovers() -> dict:
    """What a run of the project may leave behind, read from the machine itself.

    - nftables tables named ``dtburst_*`` (the loss bursts' tables);
    - OVS bridges named ``dt`` + letter + digits (the fabric's switches);
    - root-namespace interfaces named ``dt*`` (switch ports, loss sinks);
    - Mininet host shells (``bash ... mininet:<host>``);
    - tcpdump processes writing a run's ``raw/*.pcap``;
    - workload and controller processes (``-m workloads.``, ``-m controllers.``);
    - the bench's network namespaces (``dbt-*``).
    """
    tables = [line.split()[2] for line in _lines(["nft", "list", "tables"])
              if len(line.split()) == 3 and line.split()[2].startswith("dtburst_")]
    bridges = [b for b in _lines(["ovs-vsctl", "--timeout=10", "list-br"])
               if re.fullmatch(r"dt[a-z]\d+", b)]
    links = [name for line in _lines(["ip", "-o", "link", "show"])
             if len(line.split(":")) > 2
             and (name := line.split(":")[1].strip().split("@")[0]).startswith("dt")]
    procs = [line.strip() for line in _lines(["ps", "-ww", "-eo", "pid,args"])[1:]]
    args = [p.split(None, 1)[1] if len(p.split(None, 1)) > 1 else "" for p in procs]
    return {
        "namespaces": [line.split()[0] for line in _lines(["ip", "netns", "list"])
                       if line.startswith("dbt-")],
        "nft_tables": tables,
        "bridges": bridges,
        "links": links,
        "host_shells": [p for p in procs if "bash" in p and re.search(r"mininet:\S+$", p)],
        "tcpdump": [p for p, a in zip(procs, args, strict=True)
                    if a and os.path.basename(a.split()[0]) == "tcpdump" and "/raw/" in a],
        "processes": [p for p in procs if "-m workloads." in p or "-m controllers." in p],
    }


@pytest.fixture
def leftovers():
    """``machine_leftovers`` as a fixture: call it, expect every list empty."""
    return machine_leftovers


@pytest.fixture(scope="session")
def optional_tool():
    """``optional_tool(group, tool)``: TOOL, which ``./setup.sh GROUP`` installs, must be there.

    Heavy or rarely used Debian packages (Vagrant, tshark) are not in every
    set-up: ``make test`` installs them with ``./setup.sh vagrant tshark cluster rehearsal``
    before the suite starts, so no test spends the suite's time in apt.
    Where the emulation tests must run (``make test``, CI), a missing tool is
    a failure; elsewhere (pytest run by hand) the test is skipped with the
    command that installs it.
    """
    def require(group: str, tool: str) -> None:
        if shutil.which(tool) is not None:
            return
        why = f"{tool} is not installed: run ./setup.sh {group} (make test does)"
        if emulation_required():
            pytest.fail(why)
        pytest.skip(why)
    return require


# The folder says what a test needs: tests/unit (no root, no network beyond
# loopback), tests/emu (root + OVS), tests/e2e (whole runs, the machine's
# set-up). The marker follows from the folder, so `-m unit` selects exactly
# tests/unit, and a test marked for another folder is an error, not a guess.
_FOLDER_MARKS = ("unit", "emu", "e2e")


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = item.path.parent.name
        if folder not in _FOLDER_MARKS:
            continue
        others = [m for m in _FOLDER_MARKS if m != folder and item.get_closest_marker(m)]
        if others:
            raise pytest.UsageError(f"{item.nodeid} is marked {others[0]} but lives in tests/{folder}: "
                                    f"move it to tests/{others[0]} or mark it {folder}")
        item.add_marker(getattr(pytest.mark, folder))


@pytest.fixture(autouse=True)
def _clean_after_end_to_end(request):
    """After every end-to-end test, the project's own clean-up (only what it created):
    whatever a failing test leaves behind must not fail the next one."""
    yield
    if "e2e" in request.node.path.parts:
        subprocess.run([sys.executable, "-m", "testbed.cli", "clean"],
                       cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True,
                       timeout=120)


# The suite's slowest tests, over the parts `make test` runs one after the
# other (unit tests in parallel, then emulation): each part adds its tests'
# durations to one file and ends with the slowest of all of them so far, so
# the last list printed is the whole suite's (pytest's --durations sees one
# part only).
SLOWEST = 25


def pytest_addoption(parser):
    parser.addoption("--suite-durations", metavar="FILE", default=None,
                     help=f"add this run's test durations to FILE (JSON lines) and end with the "
                          f"{SLOWEST} slowest tests in it (make test: over both of its parts)")


_durations: list[dict] = []


def pytest_runtest_logreport(report):
    _durations.append({"test": report.nodeid, "when": report.when, "s": report.duration})


def pytest_terminal_summary(terminalreporter, config):
    path = config.getoption("suite_durations")
    if not path or hasattr(config, "workerinput"):   # xdist: the controller writes, once
        return
    with open(path, "a") as f:
        f.writelines(json.dumps(d) + "\n" for d in _durations)
    with open(path) as f:
        rows = sorted((json.loads(line) for line in f), key=lambda d: -d["s"])
    terminalreporter.write_sep("=", f"the suite's {SLOWEST} slowest tests (so far: {path})")
    for d in rows[:SLOWEST]:
        if d["s"] >= 0.005:   # as pytest's --durations: shorter ones say nothing
            terminalreporter.write_line(f"{d['s']:8.2f}s {d['when']:<8} {d['test']}")
