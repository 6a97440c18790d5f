"""Tear-down removes exactly what the project created, also after SIGINT mid-start-up.

``leftovers`` (tests/conftest.py) reads the machine with its own tools, not with `cleanup`.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.emulation import cleanup

pytestmark = pytest.mark.emu
FOREIGN = "foreignbr0"
CLI = os.path.join(os.path.dirname(sys.executable), "dblp-testbed")


@pytest.fixture
def foreign_bridge(emulator):
    subprocess.run(["ovs-vsctl", "--may-exist", "add-br", FOREIGN, "--", "set", "bridge", FOREIGN,
                    "datapath_type=netdev"], check=True)
    yield FOREIGN
    subprocess.run(["ovs-vsctl", "--if-exists", "del-br", FOREIGN], check=True)


def test_net_check_json_and_nothing_left(leftovers, foreign_bridge, tmp_path):
    assert not any(leftovers().values()), leftovers()
    p = subprocess.run([CLI, "net", "check", "--json",
                        "--goodput-s", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("hosts", "switches", "pairs", "pairs_ok", "startup_s", "core_switches_used",
                "tcp_goodput_mbps", "shaped_mbps"):
        assert key in res
    assert res["pairs_ok"] == res["pairs"] == 240
    assert res["core_switches_used"] == 4
    assert res["startup_s"] <= 15
    assert not any(leftovers().values()), leftovers()
    assert FOREIGN in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True,
                                     text=True).stdout.split()


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("after_s,inherits_ignored", [(0.1, False), (1.2, False), (0.1, True)],
                         ids=["0.1s", "1.2s", "started-with-SIGINT-ignored"])
def test_sigint_during_startup_leaves_nothing(leftovers, foreign_bridge, tmp_path, after_s,
                                             inherits_ignored):
    """Also when started with SIGINT ignored, as a script's background job is."""
    p = subprocess.Popen([CLI, "net", "check", "--json",
                          "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_ignore_sigint if inherits_ignored else None)
    # wait until the fabric is half built: some bridges exist, routing not finished
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and not cleanup.project_bridges():
        time.sleep(0.05)
    time.sleep(after_s)
    # the signal must land on a fabric under construction, not after the check
    assert p.poll() is None, f"net check ended (rc {p.returncode}) before SIGINT could be sent"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, f"net check exited 0 after SIGINT: {err[-1500:]}"
    assert not any(leftovers().values()), leftovers()
    assert FOREIGN in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True,
                                     text=True).stdout.split()


def test_clean_removes_only_project_leftovers(leftovers, foreign_bridge):
    """Simulated leftovers of a crashed run go; the foreign bridge and veth stay."""
    subprocess.run(["ovs-vsctl", "add-br", "dtc99", "--", "set", "bridge", "dtc99",
                    "datapath_type=netdev"], check=True)
    subprocess.run(["ip", "link", "add", "dtc99-eth1", "type", "veth", "peer", "name", "dte99-eth1"],
                   check=True)
    subprocess.run(["ip", "link", "add", "fgn0", "type", "veth", "peer", "name", "fgn1"], check=True)
    subprocess.run(["nft", "-f", "-"], input="table netdev dtburst_left {\n}\n", text=True, check=True)
    try:
        cli = os.path.join(os.path.dirname(sys.executable), "dblp-testbed")
        p = subprocess.run([cli, "clean", "--json"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        rep = json.loads(p.stdout)
        assert "dtc99" in rep["bridges"]
        assert not any(leftovers().values()), leftovers()
        assert FOREIGN in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True,
                                         text=True).stdout.split()
        assert subprocess.run(["ip", "link", "show", "fgn0"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", "fgn0"], capture_output=True)
