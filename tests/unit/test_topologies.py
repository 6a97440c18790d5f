"""Topology graphs: counts, degrees, wiring, DPIDs and interface names."""
import pytest

from topologies import (
    IFNAME_MAX,
    SWITCH_NAME_RE,
    TOPOLOGIES,
    FatTreeTopo,
    LeafSpineTopo,
    StarTopo,
    TopoGraph,
    make_topology,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fattree_counts_and_degrees(k):
    t = FatTreeTopo(k)
    tiers = [t.switch_info[s].tier for s in t.switches()]
    assert len(t.hosts()) == k ** 3 // 4
    assert tiers.count(2) == (k // 2) ** 2
    assert tiers.count(1) == k * k // 2
    assert tiers.count(0) == k * k // 2
    # every switch has exactly k ports, every host one
    for s in t.switches():
        assert len(t.ports(s)) == k, s
    for h in t.hosts():
        assert len(t.ports(h)) == 1
    assert len(t.links()) == k ** 3 // 4 + 2 * (k // 2) * k * (k // 2)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fattree_wiring_follows_al_fares(k):
    t = FatTreeTopo(k)
    half = k // 2
    for p in range(k):
        for a in range(half):
            agg = f"dta{p}{a}"
            up = sorted(n for n in t.neighbours(agg) if t.switch_info[n].tier == 2)
            # aggregation a of every pod reaches the same core group a
            assert up == [f"dtc{a * half + i:02d}" for i in range(half)]
            down = sorted(n for n in t.neighbours(agg) if t.switch_info[n].tier == 0)
            assert down == [f"dte{p}{e}" for e in range(half)]
    for c in (s for s in t.switches() if t.switch_info[s].tier == 2):
        pods = sorted(t.switch_info[n].pod for n in t.neighbours(c))
        assert pods == list(range(k)), c


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fattree_dpids_addresses_names(k):
    t = FatTreeTopo(k)
    dpids = [t.dpid_of(s) for s in t.switches()]
    assert len(set(dpids)) == len(dpids) and all(d > 0 for d in dpids)
    # DPID encodes layer/pod/index
    assert t.dpid_of("dta21") == 0x020201
    ips = [t.host_info[h].ip for h in t.hosts()]
    macs = [t.host_info[h].mac for h in t.hosts()]
    assert len(set(ips)) == len(ips) and len(set(macs)) == len(macs)
    assert t.host_info[f"h{k - 1}10"].ip == f"10.{k - 1}.1.2"
    for name in t.interface_names():
        assert len(name) <= IFNAME_MAX, name
    for s in t.switches():
        assert SWITCH_NAME_RE.match(s)


@pytest.mark.parametrize("bad", [3, 2, 10, 0, "4", None])
def test_fattree_rejects_bad_k(bad):
    with pytest.raises(ValueError, match="k must be"):
        FatTreeTopo(bad)


def test_star_has_paper_roles():
    t = StarTopo()
    assert t.role("server") == "srv"
    assert t.role("workers") == ["w1", "w2", "w3"]
    assert t.role("cross") == ["x1"]
    assert len(t.switches()) == 1 and len(t.hosts()) == 5
    server, workers = t.place(3)
    assert server == "srv" and workers == ["w1", "w2", "w3"]
    with pytest.raises(ValueError, match="n_workers"):
        t.place(9)


def test_leafspine_full_bipartite():
    t = LeafSpineTopo(leaves=4, spines=3, hosts_per_leaf=2)
    for leaf in range(4):
        assert sorted(n for n in t.neighbours(f"dtl{leaf}") if t.isSwitch(n)) == \
            ["dtp0", "dtp1", "dtp2"]
    assert len(t.hosts()) == 8
    with pytest.raises(ValueError, match="spines"):
        LeafSpineTopo(spines=0)


def test_registry_and_roundtrip():
    assert set(TOPOLOGIES) >= {"fattree", "star", "leafspine"}
    t = make_topology("fattree", k=4)
    u = TopoGraph.from_dict(t.to_dict())
    assert u.hosts() == t.hosts() and u.switches() == t.switches()
    assert [link.intf1() for link in u.links()] == [link.intf1() for link in t.links()]
    assert u.roles == t.roles
    with pytest.raises(ValueError, match="topology 'ring' unknown"):
        make_topology("ring")


def test_fattree_placement_is_cross_pod_first():
    t = FatTreeTopo(4)
    server, workers = t.place(6)
    assert server == "h000"
    assert [t.host_info[w].pod for w in workers[:3]] == [1, 2, 3]
    assert server not in workers and len(set(workers)) == 6
