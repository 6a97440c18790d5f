"""The routed k=4 fat-tree: reachability, goodput, multipath over the core, control socket."""
import json
import os
import socket
import stat
import subprocess

import pytest

from testbed.emulation import netcheck

pytestmark = pytest.mark.emu


@pytest.fixture(scope="module")
def fab(fattree):
    """The shared k=4 fat-tree at 20 Mbit/s (tests/emu/conftest.py), as the burst tests use it."""
    return fattree.get()


def test_all_240_pairs_reach_each_other_without_loss(fab):
    r = netcheck.all_pairs(fab, count=3)
    assert r["pairs"] == 240
    assert r["pairs_ok"] == 240, r["failed"]


def test_cross_pod_tcp_reaches_90_percent_of_shaped_rate(fab):
    g = netcheck.tcp_goodput(fab, [("h000", "h300")], duration_s=4)
    assert g["total_mbps"] >= 0.9 * 20, g


def test_16_udp_flows_with_distinct_ports_use_all_4_cores(fab):
    s = netcheck.core_spread(fab, "h000", "h300", flows=16)
    assert s["core_switches"] == 4
    assert s["core_switches_used"] == 4, s["per_core"]
    # near-even: 4 flows per core
    counts = sorted(s["per_core"].values())
    assert counts[0] >= 0.5 * counts[-1], s["per_core"]


def test_switch_ports_have_htb_and_bounded_queue(fab):
    out = subprocess.run(["tc", "qdisc", "show", "dev", "dte00-eth1"], capture_output=True,
                         text=True).stdout
    assert "htb 1:" in out and "pfifo 10:" in out and "limit 100p" in out
    host = fab.run("h000", ["tc", "qdisc", "show", "dev", "h000-eth0"]).stdout
    assert "limit 100p" in host
    feat = fab.run("h000", ["ethtool", "-k", "h000-eth0"]).stdout
    assert "tx-checksumming: off" in feat


def test_control_socket_is_private_and_survives_bad_requests(fab):
    mode = stat.S_IMODE(os.stat(fab.control_socket).st_mode)
    assert mode == 0o600
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(fab.control_socket)
        f = s.makefile("rwb")
        for bad in (b"not json\n", b"[1,2]\n", b'{"op": "fly"}\n',
                    b'{"op": "round", "event": "middle", "arm": "a", "round": 1}\n',
                    b'{"op": "burst", "kind": "loss", "target": "nowhere", "duration_ms": 10, '
                    b'"params": {"p": 0.5}}\n',
                    b'{"op": "burst", "kind": "loss", "target": "server-downlink", "duration_ms": 10, '
                    b'"params": {"p": 7}}\n'):
            f.write(bad)
            f.flush()
            reply = json.loads(f.readline())
            assert reply["ok"] is False and reply["error"], bad
    st = fab.control({"op": "status"})
    assert st["ok"] and st["ready"] and st["routed"] == 20


def test_switch_reconnect_restores_routes(fab):
    before = fab.control({"op": "status"})["switches"][str(fab.topo.dpid_of("dte00"))]["connects"]
    subprocess.run(["ovs-vsctl", "del-controller", "dte00"], check=True)
    subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", "dte00"], check=True)
    subprocess.run(["ovs-vsctl", "set-controller", "dte00", f"tcp:127.0.0.1:{fab.of_port}"], check=True)
    import time
    deadline = time.time() + 20
    while time.time() < deadline:
        sw = fab.control({"op": "status"})["switches"][str(fab.topo.dpid_of("dte00"))]
        if sw["connects"] > before and sw["routed"]:
            break
        time.sleep(0.2)
    assert sw["connects"] > before and sw["routed"]
    flows = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "dte00"],
                           capture_output=True, text=True).stdout
    assert flows.count("priority=") == sw["flows"]
    r = netcheck.all_pairs(fab, count=1)
    assert r["pairs_ok"] == 240


def test_no_flooding_or_controller_actions(fab):
    for sw in ("dte00", "dta10", "dtc03"):
        flows = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw],
                               capture_output=True, text=True).stdout
        assert "actions=output:" in flows
        assert "FLOOD" not in flows and "ALL" not in flows and "CONTROLLER" not in flows
        fail_mode = subprocess.run(["ovs-vsctl", "get-fail-mode", sw], capture_output=True,
                                   text=True).stdout.strip()
        assert fail_mode == "secure"


def test_host_api(fab):
    h = fab.host("h000")
    assert h.ip == "10.0.0.2" and h.intf == "h000-eth0" and h.pid > 0
    assert fab.server == "h000" and len(fab.workers) == 3
    with pytest.raises(TypeError):
        fab.popen("h000", "echo hi")
    out = fab.run("h100", ["ip", "-o", "addr", "show", "h100-eth0"]).stdout
    assert "10.1.0.2/8" in out
    with pytest.raises(KeyError, match="no host"):
        fab.host("nope")


def test_a_hosts_name_lookups_fail_at_once_and_stay_off_the_fabric(fab):
    """The machine's name servers are unreachable from every host: a lookup (torch's c10d
    asks for its peers' host names) fails at once instead of waiting 5 s for a server
    inside the fabric's 10.0.0.0/8 that never answers, and sends nothing into the fabric."""
    from testbed.emulation.fabric import RESOLV_CONF, name_servers

    try:
        with open(RESOLV_CONF) as f:
            servers = name_servers(f.read())
    except FileNotFoundError:
        servers = []
    for host in fab.hosts():
        routes = fab.run(host, ["ip", "-4", "route", "show", "type", "unreachable"]).stdout
        assert all(a in routes.split() for a in servers), (host, routes)
    lookup = ["python3", "-c", "import socket, time; t = time.monotonic()\n"
              "try:\n    socket.getnameinfo(('10.3.1.2', 80), socket.NI_NAMEREQD)\n"
              "except OSError:\n    pass\nprint(time.monotonic() - t)"]
    assert float(fab.run("h000", lookup, timeout=30).stdout) < 2.0


def test_name_servers_are_the_ipv4_nameserver_lines():
    from testbed.emulation.fabric import name_servers

    text = "# resolv.conf\nnameserver 10.255.255.53\nnameserver ::1\nsearch lan\nnameserver  192.0.2.7 \n"
    assert name_servers(text) == ["10.255.255.53", "192.0.2.7"]
    assert name_servers("") == []
