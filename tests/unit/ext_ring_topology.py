"""A topology defined outside the project, in this one file: switches in a ring.

Its knobs (``ring_size``, ``hosts_per_switch``) become the spec's
``topology.ring_size`` and ``topology.hosts_per_switch`` once the class is
registered (``topologies.register_topology(RingTopo, "ring")``); the spec
takes their ranges, defaults and host count from here.
"""
from __future__ import annotations

from topologies import Knob, TopoGraph, make_dpid

LAYER_RING = 7


class RingTopo(TopoGraph):
    """``dtg{i}`` switches in a ring, hosts ``g{i}h{j}`` (10.i.0.(j+2)); the server on ``dtg0``."""

    KNOBS = {"ring_size": Knob(6, 3, 12, "use a ring of 3..12 switches"),
             "hosts_per_switch": Knob(1, 1, 4, "use 1..4 hosts per switch")}

    def __init__(self, ring_size: int = 6, hosts_per_switch: int = 1):
        self.check_knobs("ring", ring_size=ring_size, hosts_per_switch=hosts_per_switch)
        super().__init__(name=f"ring-{ring_size}", prefixlen=8)
        self.params = {"ring_size": ring_size, "hosts_per_switch": hosts_per_switch}
        sw = [self.addSwitch(f"dtg{i}", make_dpid(LAYER_RING, 0, i), tier=0, pod=i)
              for i in range(ring_size)]
        for i, s in enumerate(sw):
            for j in range(hosts_per_switch):
                self.addHost(f"g{i}h{j}", f"10.{i}.0.{j + 2}", pod=i)
                self.addLink(f"g{i}h{j}", s, 0, j + 1)
        for i, s in enumerate(sw):   # port H+1 to the next switch, H+2 from the previous one
            self.addLink(s, sw[(i + 1) % ring_size], hosts_per_switch + 1, hosts_per_switch + 2)
        workers = [f"g{i}h0" for i in range(1, ring_size)]
        rest = [h for h in self.hosts() if h != "g0h0" and h not in workers]
        self.roles = {"server": "g0h0", "workers": workers,
                      "cross": [h for h in rest if h.startswith("g0")],
                      "placement_order": workers + rest}

    @classmethod
    def hosts_for(cls, knobs: dict) -> int:
        return knobs["ring_size"] * knobs["hosts_per_switch"]
