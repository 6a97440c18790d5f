"""The k-ary fat-tree of Al-Fares et al. (SIGCOMM 2008) as a pure graph."""
from __future__ import annotations

from .graph import Knob, TopoGraph

LAYER_CORE, LAYER_AGG, LAYER_EDGE, LAYER_SINGLE = 1, 2, 3, 4


def make_dpid(layer: int, pod: int, index: int) -> int:
    """DPID 0x0000_0000_00LL_PPII: layer, pod, index readable in hex.

    Why explicit: Mininet derives DPIDs from the digits in switch names, and
    names such as a01/e01 would collide.
    """
    return (layer << 16) | (pod << 8) | index


class FatTreeTopo(TopoGraph):
    """k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores, k^3/4 hosts.

    Host h of edge switch e in pod p is ``h{p}{e}{h}`` with IP 10.p.e.(h+2)
    (Al-Fares' addressing). Switches are ``dte{p}{e}``, ``dta{p}{a}`` and
    ``dtc{NN}``. Ports: edge 1..k/2 down to hosts, k/2+1.. up to aggregation a
    on port k/2+1+a; aggregation 1..k/2 down to edge e on port e+1, up to core
    a*(k/2)+i on port k/2+1+i; core port p+1 goes to pod p.
    """

    KNOBS = {"k": Knob(4, 4, 8, "set topology.k to 4, 6 or 8", step=2)}

    def __init__(self, k: int = 4):
        self.check_knobs("fat-tree", k=k)
        super().__init__(name=f"fattree-k{k}", prefixlen=8)
        self.k = k
        self.params = {"k": k}
        self.build()

    def build(self):
        k, half = self.k, self.k // 2
        cores = []
        for c in range(half * half):
            cores.append(self.addSwitch(f"dtc{c:02d}", make_dpid(LAYER_CORE, 0, c), tier=2))
        for p in range(k):
            aggs = [self.addSwitch(f"dta{p}{a}", make_dpid(LAYER_AGG, p, a), tier=1, pod=p)
                    for a in range(half)]
            edges = [self.addSwitch(f"dte{p}{e}", make_dpid(LAYER_EDGE, p, e), tier=0, pod=p)
                     for e in range(half)]
            for e, edge in enumerate(edges):
                for h in range(half):
                    host = self.addHost(f"h{p}{e}{h}", f"10.{p}.{e}.{h + 2}", pod=p)
                    self.addLink(host, edge, 0, h + 1)
                for a, agg in enumerate(aggs):
                    self.addLink(edge, agg, half + 1 + a, e + 1)
            for a, agg in enumerate(aggs):
                for i in range(half):
                    self.addLink(agg, cores[a * half + i], half + 1 + i, p + 1)
        # Roles: the server in pod 0, one worker per other pod (all cross-pod,
        # through the core), cross-traffic sources next to the server.
        server = "h000"
        workers = [f"h{p}00" for p in range(1, k)]
        order = workers + [f"h{p}{e}{h}" for h in range(half) for e in range(half)
                           for p in range(1, k) if f"h{p}{e}{h}" not in workers]
        order += [f"h0{e}{h}" for e in range(half) for h in range(half) if (e, h) != (0, 0)]
        cross = [f"h00{h}" for h in range(1, half)] + [f"h0{e}{h}" for e in range(1, half)
                                                        for h in range(half)]
        self.roles = {"server": server, "workers": workers, "cross": cross,
                      "placement_order": order}

    @classmethod
    def hosts_for(cls, knobs: dict) -> int:
        return knobs["k"] ** 3 // 4

    def core_switches(self):
        return [s for s in self.switches() if self.switch_info[s].tier == 2]
