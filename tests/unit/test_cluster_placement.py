"""Pods over servers (topologies.placement): only top-tier links cross machines."""
import collections

import pytest

from testbed.emulation.cluster import PlacementError, crossing_links, mininet_placer, place_pods, pods
from topologies import FatTreeTopo, LeafSpineTopo, StarTopo

LOCAL, B, C, D = "local", "root@lab2", "root@lab3", "root@lab4"


def _pod_of(topo, node):
    """The pod a node belongs to by the topology's own declaration (None: a core switch)."""
    if node in topo.host_info:
        return topo.host_info[node].pod
    info = topo.switch_info[node]
    return None if info.tier == 2 else info.pod


@pytest.mark.unit
@pytest.mark.parametrize("k,servers,crossing", [
    # Every core links once to every pod; its links to pods on other servers cross.
    (4, [LOCAL, B], 4 * 2),             # 4 cores x 2 pods elsewhere
    (8, [LOCAL, B], 16 * 4),            # 16 cores x 4 pods elsewhere
    (8, [LOCAL, B, C, D], 16 * 6),      # 16 cores x 6 pods elsewhere
    # pods 3, 3, 2 and cores 6, 5, 5: a core has 5, 5 or 6 pods elsewhere
    (8, [LOCAL, B, C], 6 * 5 + 5 * 5 + 5 * 6),
])
def test_a_fat_tree_keeps_pods_whole_and_only_core_links_cross(k, servers, crossing):
    topo = FatTreeTopo(k)
    placement = place_pods(topo, servers)
    assert set(placement) == set(topo.hosts()) | set(topo.switches())
    assert set(placement.values()) == set(servers)
    # A pod (its hosts, edge and aggregation switches) is on one server.
    by_pod = collections.defaultdict(set)
    for node, server in placement.items():
        if _pod_of(topo, node) is not None:
            by_pod[_pod_of(topo, node)].add(server)
    assert len(by_pod) == k and all(len(s) == 1 for s in by_pod.values())
    # Every link that does not touch a core stays on one server; the crossing ones touch a core.
    cores = set(topo.core_switches())
    for link in topo.links():
        if not {link.node1, link.node2} & cores:
            assert placement[link.node1] == placement[link.node2], link
    tunnels = crossing_links(topo, placement)
    assert all({t.node1, t.node2} & cores for t in tunnels)
    assert len(tunnels) == crossing
    # Pods and cores are spread evenly: counts differ by at most one.
    pods_per_server = collections.Counter(next(iter(s)) for s in by_pod.values())
    assert max(pods_per_server.values()) - min(pods_per_server.values()) <= 1
    cores_per_server = collections.Counter(placement[c] for c in cores)
    assert max(cores_per_server.values()) - min(cores_per_server.values()) <= 1
    # The aggregation server's pod stays on this machine, with the controller.
    assert placement[topo.roles["server"]] == LOCAL


@pytest.mark.unit
def test_k4_on_two_servers_is_pods_0_1_here_and_2_3_there():
    topo = FatTreeTopo(4)
    placement = place_pods(topo, [LOCAL, B])
    assert {h: placement[h] for h in ("h000", "h111", "h200", "h311")} == \
        {"h000": LOCAL, "h111": LOCAL, "h200": B, "h311": B}
    assert [placement[c] for c in sorted(topo.core_switches())] == [LOCAL, LOCAL, B, B]


@pytest.mark.unit
def test_one_server_runs_everything_and_nothing_crosses():
    topo = FatTreeTopo(4)
    placement = place_pods(topo, [LOCAL])
    assert set(placement.values()) == {LOCAL} and crossing_links(topo, placement) == []


@pytest.mark.unit
def test_pods_are_found_from_the_graph():
    assert [len(p) for p in pods(FatTreeTopo(4))] == [8] * 4        # 2 edge + 2 agg + 4 hosts
    assert [len(p) for p in pods(LeafSpineTopo(4, 2, 2))] == [3] * 4  # a leaf and its hosts
    assert len(pods(StarTopo(3))) == 1


@pytest.mark.unit
def test_a_leaf_spine_crosses_machines_only_on_spine_links():
    topo = LeafSpineTopo(leaves=4, spines=2, hosts_per_leaf=2)
    placement = place_pods(topo, [LOCAL, B])
    tunnels = crossing_links(topo, placement)
    assert tunnels and all({t.node1, t.node2} & {"dtp0", "dtp1"} for t in tunnels)
    assert len(tunnels) == 4  # each spine: 2 of its 4 leaves elsewhere


@pytest.mark.unit
@pytest.mark.parametrize("topo,servers,words", [
    (StarTopo(3), [LOCAL, B], "1 pod(s), fewer than the 2 servers"),
    (FatTreeTopo(4), [LOCAL, B, C, D, "root@lab5"], "4 pod(s), fewer than the 5 servers"),
    (FatTreeTopo(4), [LOCAL, B, B], "listed twice"),
    (FatTreeTopo(4), [], "no servers"),
])
def test_placements_that_cannot_be_made_are_refused(topo, servers, words):
    with pytest.raises(PlacementError, match=words.replace("(", r"\(").replace(")", r"\)")):
        place_pods(topo, servers)


@pytest.mark.unit
def test_mininet_cluster_edition_takes_the_placement():
    """The cluster edition's Placer interface, on the Mininet topology the fabric builds."""
    pytest.importorskip("mininet.examples.cluster")
    from testbed.emulation.fabric import _mininet_topo
    topo = FatTreeTopo(4)
    net_topo = _mininet_topo(topo)
    placer_class = mininet_placer(topo)
    # MininetCluster's own call (placeNodes), with its name for this machine.
    placer = placer_class(servers=["localhost", B], nodes=net_topo.nodes(), hosts=net_topo.hosts(),
                          switches=net_topo.switches(), links=net_topo.links())
    want = place_pods(topo, ["localhost", B])
    assert {n: placer.place(n) for n in net_topo.nodes()} == want
