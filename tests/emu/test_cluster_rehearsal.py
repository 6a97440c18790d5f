"""The fabric across machines, rehearsed: this machine and a container beside it (issue 42).

The container (`testbed.emulation.cluster.machines`) is a second machine in
every way the fabric uses: its own network stack, Open vSwitch, sshd, state
directory and machine lock, and the project set up in it by ``./setup.sh``.
Its only road to this machine is the rehearsal's network (10.250.0.0/24),
over which the fabric's crossing links run as VXLAN tunnels.
"""
import json
import re
import time

import pytest

from testbed.emulation import netcheck
from testbed.emulation.cluster import ClusterError
from testbed.emulation.cluster.fabric import ClusterFabric
from testbed.emulation.cluster.machines import Machines
from testbed.emulation.cluster.nodes import VXLAN_OVERHEAD
from testbed.emulation.cluster.preflight import SETUP_STAMP
from testbed.emulation.fabric import Fabric
from topologies import FatTreeTopo

pytestmark = pytest.mark.emu

RATE_MBPS = 20


@pytest.fixture(scope="module")
def machines(optional_tool):
    optional_tool("rehearsal", "dockerd")
    optional_tool("rehearsal", "debootstrap")
    with Machines(1, log=print) as m:
        yield m


def remote_leftovers(machines) -> dict:
    """What a fabric may leave on the second machine, read there (not through the fabric)."""
    script = ("ovs-vsctl --timeout=10 list-br; echo ---; ip -o link show; echo ---; "
              "ls /run/dblp-testbed; echo ---; ps -eo args")
    out = machines.exec(0, ["sh", "-c", script]).stdout.split("---\n")
    bridges = [b for b in out[0].split() if re.fullmatch(r"dt[a-z]\d+", b)]
    links = [line.split(":")[1].strip().split("@")[0] for line in out[1].splitlines()
             if len(line.split(":")) > 2 and line.split(":")[1].strip().startswith("dt")]
    states = [f for f in out[2].split() if f.endswith(".json")]
    shells = [p for p in out[3].splitlines() if re.search(r"mininet:\S+$", p)]
    return {"bridges": bridges, "links": links, "state_files": states, "host_shells": shells}


def underlay_bytes() -> int:
    """Bytes both ways on this machine's end of the machines' network (the outer, tunnelled frames)."""
    with open("/sys/class/net/dblpmach1/statistics/rx_bytes") as rx, \
            open("/sys/class/net/dblpmach1/statistics/tx_bytes") as tx:
        return int(rx.read()) + int(tx.read())


def busiest_tunnel(fab) -> tuple[str, int]:
    """(link, bytes sent into the tunnel by its local end) of the crossing link that carried most."""
    best = max(fab.tunnel_counters(), key=lambda c: c["ends"][0]["tx_bytes"] + c["ends"][1]["tx_bytes"])
    end = max(best["ends"], key=lambda e: e["tx_bytes"])
    return best["link"], end["tx_bytes"]


def test_k4_fat_tree_across_two_machines(machines, tmp_path, leftovers):
    one = Fabric(FatTreeTopo(4), run_dir=str(tmp_path / "one"), bw_mbps=RATE_MBPS, queue_pkts=100)
    with one:
        one_machine_s = one.startup_s
    with ClusterFabric(FatTreeTopo(4), run_dir=str(tmp_path / "two"), servers=["local", *machines.servers],
                       ssh_options=machines.ssh_options, bw_mbps=RATE_MBPS, queue_pkts=100) as fab:
        fidelity = fab.fidelity()
        # Whole pods per machine: pods 0-1 and two cores here, pods 2-3 and two cores there;
        # each core has one link to every pod, so 8 of the 16 core links cross.
        assert fidelity["per_server"] == {"local": {"switches": 10, "hosts": 8},
                                          machines.servers[0]: {"switches": 10, "hosts": 8}}
        assert fidelity["crossing_links"] == 8
        assert {fab.placement[h] for h in ("h000", "h100")} == {"local"}
        assert {fab.placement[h] for h in ("h200", "h300")} == {machines.servers[0]}

        pairs = netcheck.all_pairs(fab, count=3)
        assert pairs["pairs_ok"] == pairs["pairs"] == 240, pairs["failed"]

        # One TCP flow from a pod here to a pod there crosses one tunnel; the tunnel's
        # local end is a switch port shaped like every other: what it sends in the
        # flow's steady state is the shaped rate (HTB counts the same frames).
        flow = [("h000", "h300")]
        done = {}

        def measure():
            time.sleep(1.5)  # past the flow's start
            link, b0 = busiest_tunnel(fab)
            u0, t0 = underlay_bytes(), time.monotonic()
            time.sleep(4.0)
            link1, b1 = busiest_tunnel(fab)
            u1, t1 = underlay_bytes(), time.monotonic()
            done.update(link=link1, mbps=(b1 - b0) * 8 / (t1 - t0) / 1e6, inner=b1 - b0, outer=u1 - u0)

        import threading
        meter = threading.Thread(target=measure)
        meter.start()
        goodput = netcheck.tcp_goodput(fab, flow, duration_s=7)
        meter.join()
        overhead = done["outer"] / done["inner"] - 1
        print(f"\none machine: k=4 routed in {one_machine_s:.1f} s; two machines: {fab.startup_s:.1f} s "
              f"({json.dumps({k: round(v, 2) for k, v in fab.timings.items()})})\n"
              f"tunnel {done['link']}: {done['mbps']:.2f} Mbit/s of {RATE_MBPS} shaped; iperf3 goodput "
              f"{goodput['total_mbps']} Mbit/s; outer/inner bytes - 1 = {overhead:.4f} "
              f"(VXLAN adds {VXLAN_OVERHEAD} B per frame)")
        assert abs(done["mbps"] - RATE_MBPS) <= 0.05 * RATE_MBPS, done
        # The outer frames carry the inner ones plus 50 bytes each (and the ACKs' way back).
        assert 0 < overhead < 0.1, done
        assert fab.startup_s < 60
    assert fab.cleanup_report[machines.servers[0]].get("live") == []
    assert remote_leftovers(machines) == {"bridges": [], "links": [], "state_files": [], "host_shells": []}
    assert not any(leftovers().values()), leftovers()


def test_an_unprepared_server_is_refused_in_seconds_naming_it(machines, tmp_path):
    stamp = f"{machines.repo}/{SETUP_STAMP}"
    assert machines.exec(0, ["mv", stamp, stamp + ".away"]).returncode == 0
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as err:
            with ClusterFabric(FatTreeTopo(4), run_dir=str(tmp_path), servers=["local", *machines.servers],
                               ssh_options=machines.ssh_options):
                pass
        took = time.monotonic() - t0
    finally:
        machines.exec(0, ["mv", stamp + ".away", stamp])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cluster server {machines.servers[0]!r}: no project set-up in "), message
    assert took < 10, took
