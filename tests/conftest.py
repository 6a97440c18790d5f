"""Shared pytest fixtures and the emulation-test policy.

Emulation tests (marker ``emu``) need root and Open vSwitch. A developer
without root sees them skipped; as root (which is how CI runs) a missing
emulator is a failure, never a skip, so CI cannot go green without them.
"""
import os
import shutil
import subprocess

import pytest


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


@pytest.fixture(scope="session")
def emulator():
    """Skip (non-root) or fail (root) when the emulator cannot run."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run as root: emulation tests cannot be skipped")
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
