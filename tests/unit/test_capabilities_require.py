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
