"""Process supervision: list argv only, stopped by PID, failures carry their logs."""
import signal
import sys

import pytest

from testbed.run.processes import ProcessGroup


@pytest.mark.unit
def test_shell_strings_are_refused(tmp_path):
    with pytest.raises(TypeError):
        ProcessGroup().start("x", "echo hi; rm -rf /", tmp_path / "x.log")


@pytest.mark.unit
def test_stop_terminates_by_pid_and_escalates_to_sigkill(tmp_path):
    group = ProcessGroup()
    stubborn = group.start("stubborn", [sys.executable, "-c",
                                        "import signal, time\n"
                                        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                        "print('ready', flush=True)\ntime.sleep(60)"],
                           tmp_path / "s.log")
    polite = group.start("polite", ["sleep", "60"], tmp_path / "p.log")
    import time
    deadline = time.monotonic() + 10
    while "ready" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    group.stop(grace=0.5)
    assert polite.poll() == -signal.SIGTERM
    assert stubborn.poll() == -signal.SIGKILL
    assert group.running() == []


@pytest.mark.unit
def test_failed_member_reports_its_last_lines(tmp_path):
    group = ProcessGroup()
    group.start("bad", [sys.executable, "-c",
                        "import sys\nfor i in range(20): print('line', i)\nsys.exit(3)"],
                tmp_path / "bad.log")
    group.start("aux", [sys.executable, "-c", "import sys; sys.exit(4)"], tmp_path / "aux.log",
                critical=False)
    assert group.wait(["bad", "aux"], timeout=20)
    [bad] = group.failed()
    assert bad.name == "bad" and bad.poll() == 3
    assert bad.tail(3).splitlines() == ["line 17", "line 18", "line 19"]
