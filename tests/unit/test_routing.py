"""Routing as plain functions: loop-free paths, and multipath over every core."""
import itertools

import pytest

from topologies import FatTreeTopo, LeafSpineTopo, StarTopo, compute_rules, trace_path
from topologies.routing import PRIO_DIRECT, lookup, packet

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("k", [4, 6])
def test_every_pair_has_a_loop_free_path(k):
    t = FatTreeTopo(k)
    rules = compute_rules(t)
    for src, dst in itertools.permutations(t.hosts(), 2):
        for kw in ({"proto": "udp", "sport": 40000 + hash((src, dst)) % 1000},
                   {"proto": "icmp"}, {"arp": True}):
            path = trace_path(t, rules, src, dst, **kw)
            switches = [s for s, _ in path]
            assert len(switches) == len(set(switches))
            # shortest: 1 (same edge), 3 (same pod), 5 (cross pod) switches
            same_pod = t.host_info[src].pod == t.host_info[dst].pod
            same_edge = t.host_switch(src)[0] == t.host_switch(dst)[0]
            assert len(path) == (1 if same_edge else 3 if same_pod else 5)


def test_k8_spot_paths():
    t = FatTreeTopo(8)
    rules = compute_rules(t)
    for src, dst in [("h000", "h733"), ("h312", "h301"), ("h700", "h701")]:
        assert trace_path(t, rules, src, dst)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_upward_paths_spread_over_all_cores(k):
    t = FatTreeTopo(k)
    rules = compute_rules(t)
    cores = set(t.core_switches())
    used = {}
    for i in range(64):
        path = trace_path(t, rules, "h000", f"h{k - 1}00", proto="udp", sport=50000 + i)
        core = path[2][0]
        used[core] = used.get(core, 0) + 1
    assert set(used) == cores
    # near-even: no core carries more than twice the mean
    assert max(used.values()) <= 2 * 64 / len(cores)


def test_same_hosts_different_udp_ports_take_different_cores():
    t = FatTreeTopo(4)
    rules = compute_rules(t)
    cores = {trace_path(t, rules, "h000", "h300", proto="udp", sport=40000 + i)[2][0]
             for i in range(4)}
    assert len(cores) == 4
    cores_tcp = {trace_path(t, rules, "h000", "h300", proto="tcp", sport=40000 + i)[2][0]
                 for i in range(4)}
    assert len(cores_tcp) == 4


def test_down_routes_are_deterministic_and_arp_never_floods():
    t = FatTreeTopo(4)
    rules = compute_rules(t)
    for s, rs in rules.items():
        for r in rs:
            assert r.out_port in t.ports(s)  # never FLOOD/ALL/CONTROLLER
    # at the destination's edge switch the direct route wins over multipath
    r = lookup(rules["dte00"], packet(t, "h300", "h001", proto="udp", sport=1))
    assert r.priority == PRIO_DIRECT and r.out_port == 2


@pytest.mark.parametrize("topo", [StarTopo(), LeafSpineTopo(leaves=3, spines=2)])
def test_other_topologies_route_all_pairs(topo):
    rules = compute_rules(topo)
    for src, dst in itertools.permutations(topo.hosts(), 2):
        assert trace_path(topo, rules, src, dst)


def test_leafspine_uses_every_spine():
    t = LeafSpineTopo(leaves=2, spines=4, hosts_per_leaf=1)
    rules = compute_rules(t)
    spines = {trace_path(t, rules, "l0h0", "l1h0", sport=7000 + i)[1][0] for i in range(16)}
    assert spines == {"dtp0", "dtp1", "dtp2", "dtp3"}
