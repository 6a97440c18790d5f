"""A machine that cannot emulate gets one line and exit 2 from every fabric command."""
import pytest

from testbed.emulation import capabilities
from testbed.errors import MachineError


def test_require_raises_machine_error_naming_the_first_problem():
    report = {"problems": ["Open vSwitch not running: ovs-ctl start (or ./setup.sh)",
                           "tcpdump missing"]}
    with pytest.raises(MachineError) as err:
        capabilities.require(report)
    msg = str(err.value)
    assert "\n" not in msg
    assert "Open vSwitch not running" in msg and "1 more" in msg
    assert err.value.exit_code == 2


def test_require_returns_a_clean_report():
    report = {"problems": [], "notes": []}
    assert capabilities.require(report) is report


def test_the_c_core_is_reported_and_its_absence_noted(monkeypatch):
    """doctor and the manifest say whether dblp's C core loaded: timings depend on it."""
    import sys

    from testbed.emulation import capabilities
    core = capabilities.c_core()
    assert core["loaded"] is True and core["path"].endswith(".so") and core["error"] is None
    # ... and which library tags keyed jobs' datagrams in it: ./setup.sh installs Intel's
    # on x86-64 (libipsec-mb-dev), libcrypto elsewhere.
    import os
    assert core["mac"] == ("intel-ipsec-mb" if os.path.exists("/usr/include/intel-ipsec-mb.h")
                           else "libcrypto"), core
    # Without it (a machine with no compiler): not loaded, the error kept, a note in the report.
    monkeypatch.setitem(sys.modules, "dblp._fastpath", None)
    core = capabilities.c_core()
    assert core["loaded"] is False and core["path"] is None and "_fastpath" in core["error"]
    rep = capabilities.check(probe_qdiscs=False)
    assert rep["c_core"] == core
    assert any(n.startswith("dblp's C core not loaded") for n in rep["notes"])


def test_a_run_without_the_c_core_says_so_at_its_start():
    """`run` warns with the same line before its first unit (testbed/run/runner.py)."""
    import inspect

    from testbed.emulation import capabilities
    from testbed.run import runner
    line = capabilities.c_core_warning({"loaded": False, "path": None,
                                        "error": "No module named 'dblp._fastpath'"})
    assert line is not None and "No module named 'dblp._fastpath'" in line and "./setup.sh" in line
    assert capabilities.c_core_warning(capabilities.c_core()) is None   # built here
    # The runner says it right after the run directory, before the fabric is built.
    src = inspect.getsource(runner.run_experiment)
    assert src.index("c_core_warning") < src.index("_run_on_fabric(")
