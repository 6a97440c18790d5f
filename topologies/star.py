"""A single switch with the paper's 3 workers + 1 server (plus a cross-traffic host)."""
from __future__ import annotations

from .fattree import LAYER_SINGLE, make_dpid
from .graph import TopoGraph


class StarTopo(TopoGraph):
    """``srv`` (10.0.0.1), ``w1..wN`` (10.0.0.2..) and ``x1..`` on switch ``dtr1``.

    Why the extra host: the `congest` burst needs a cross-traffic source that
    is neither a worker nor the server. A spec sizes it by its placement: one
    host per worker (no knob of its own).
    """

    MAX_WORKERS = 64

    def __init__(self, workers: int = 3, cross: int = 1):
        if not isinstance(workers, int) or not 1 <= workers <= self.MAX_WORKERS:
            raise ValueError(f"star workers must be an integer in 1..{self.MAX_WORKERS}, "
                             f"got {workers!r}")
        if not isinstance(cross, int) or not 0 <= cross <= 8:
            raise ValueError(f"star cross must be an integer in 0..8, got {cross!r}")
        super().__init__(name=f"star-{workers}w", prefixlen=8)
        self.params = {"workers": workers, "cross": cross}
        sw = self.addSwitch("dtr1", make_dpid(LAYER_SINGLE, 0, 1), tier=0)
        names = ["srv"] + [f"w{i}" for i in range(1, workers + 1)] + \
                [f"x{i}" for i in range(1, cross + 1)]
        for port, name in enumerate(names, start=1):
            self.addHost(name, f"10.0.{port // 250}.{port % 250}")
            self.addLink(name, sw, 0, port)
        self.roles = {"server": "srv", "workers": names[1:workers + 1],
                      "cross": names[workers + 1:], "placement_order": names[1:]}

    @classmethod
    def from_spec(cls, knobs: dict, workers: int) -> StarTopo:
        return cls(workers=workers)

    @classmethod
    def hosts_for(cls, knobs: dict) -> int:
        """The server and as many workers as a placement asks for, up to ``MAX_WORKERS``."""
        return 1 + cls.MAX_WORKERS
