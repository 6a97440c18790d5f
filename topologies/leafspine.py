"""A two-tier leaf-spine fabric: every leaf connects to every spine."""
from __future__ import annotations

from .fattree import make_dpid
from .graph import Knob, TopoGraph

LAYER_LEAF, LAYER_SPINE = 5, 6


class LeafSpineTopo(TopoGraph):
    """``dtl{L}`` leaves with hosts ``l{L}h{i}`` (10.L.0.(i+2)), spines ``dtp{S}``.

    Leaf ports: 1..hosts_per_leaf down, then one per spine. Spine port L+1
    goes to leaf L.
    """

    KNOBS = {"leaves": Knob(4, 2, 16, "use 2..16 leaves"),
             "spines": Knob(2, 1, 8, "use 1..8 spines"),
             "hosts_per_leaf": Knob(2, 1, 8, "use 1..8 hosts per leaf")}

    def __init__(self, leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 2):
        self.check_knobs("leaf-spine", leaves=leaves, spines=spines, hosts_per_leaf=hosts_per_leaf)
        super().__init__(name=f"leafspine-{leaves}x{spines}", prefixlen=8)
        self.params = {"leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf}
        sp = [self.addSwitch(f"dtp{s}", make_dpid(LAYER_SPINE, 0, s), tier=1)
              for s in range(spines)]
        for n in range(leaves):
            leaf = self.addSwitch(f"dtl{n}", make_dpid(LAYER_LEAF, n, 0), tier=0, pod=n)
            for i in range(hosts_per_leaf):
                h = self.addHost(f"l{n}h{i}", f"10.{n}.0.{i + 2}", pod=n)
                self.addLink(h, leaf, 0, i + 1)
            for s, spine in enumerate(sp):
                self.addLink(leaf, spine, hosts_per_leaf + 1 + s, n + 1)
        server = "l0h0"
        workers = [f"l{n}h0" for n in range(1, leaves)]
        rest = [h for h in self.hosts() if h != server and h not in workers]
        self.roles = {"server": server, "workers": workers,
                      "cross": [h for h in rest if h.startswith("l0")],
                      "placement_order": workers + [h for h in rest if not h.startswith("l0")]
                      + [h for h in rest if h.startswith("l0")]}

    @classmethod
    def hosts_for(cls, knobs: dict) -> int:
        return knobs["leaves"] * knobs["hosts_per_leaf"]
