"""A pure, root-free topology graph that mirrors Mininet's ``Topo`` API.

Why not subclass ``mininet.topo.Topo``: the controller process and the unit
tests load topologies without Mininet (DESIGN: Mininet imports stay inside
``testbed/``). ``testbed.emulation.fabric`` converts a ``TopoGraph`` into a Mininet
``Topo`` with the same names, DPIDs, addresses and port numbers, so what the
controller routes is exactly what Mininet builds.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
# Every bridge the project creates starts with this prefix: `dblp-testbed
# clean` removes bridges matching SWITCH_NAME_RE and nothing else.
SWITCH_PREFIX = "dt"
SWITCH_NAME_RE = re.compile(r"^dt[a-z]\d{1,4}$")


@dataclass
class HostInfo:
    name: str
    ip: str          # dotted quad, no prefix length
    mac: str
    pod: int = 0
    tier: int = -1   # hosts sit below tier 0


@dataclass
class SwitchInfo:
    name: str
    dpid: int
    tier: int        # 0 = edge/leaf/star, 1 = aggregation/spine, 2 = core
    pod: int = 0


@dataclass
class LinkInfo:
    node1: str
    node2: str
    port1: int
    port2: int

    def intf1(self) -> str:
        return f"{self.node1}-eth{self.port1}"

    def intf2(self) -> str:
        return f"{self.node2}-eth{self.port2}"


def mac_for_ip(ip: str) -> str:
    """A locally administered MAC derived from the IP: readable in pcaps."""
    parts = [int(x) for x in ip.split(".")]
    return "02:00:" + ":".join(f"{b:02x}" for b in parts)


@dataclass(frozen=True)
class Knob:
    """One integer knob of a topology kind, as an experiment spec sets it.

    Declared once, on the topology class (`TopoGraph.KNOBS`): the spec's
    ``[topology]`` section offers it with this range and default, and the
    constructor checks the same range, so a knob has one home. ``step``:
    the values run lo, lo + step, ... (a fat-tree's k is even).
    """

    default: int
    lo: int
    hi: int
    fix: str
    step: int = 1

    def describe(self) -> str:
        if self.step == 1:
            return f"an integer in {self.lo}..{self.hi}"
        if self.step == 2 and self.lo % 2 == 0:
            return f"an even integer in {self.lo}..{self.hi}"
        return "one of " + ", ".join(map(str, range(self.lo, self.hi + 1, self.step)))

    def allows(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) \
            and self.lo <= value <= self.hi and (value - self.lo) % self.step == 0

    def check(self, where: str, name: str, value: Any) -> int:
        """``value`` if allowed; else a ValueError naming ``where`` (the topology) and the knob."""
        if not self.allows(value):
            raise ValueError(f"{where} {name} must be {self.describe()}, got {value!r}")
        return value


@dataclass
class TopoGraph:
    """Hosts, switches and numbered links; the common base of all topologies.

    A topology kind is a subclass registered in ``topologies.TOPOLOGIES``
    (`topologies.register_topology`). What an experiment spec needs of it is
    declared here and nowhere else: its knobs (`KNOBS`, the spec's
    ``[topology]`` fields), how a spec builds it (`from_spec`) and how many
    hosts a placement may use (`hosts_for`).
    """

    #: The spec fields ``topology.NAME`` this kind reads (shared names must agree).
    KNOBS: ClassVar[dict[str, Knob]] = {}

    name: str = "graph"
    prefixlen: int = 8
    host_info: dict = field(default_factory=dict)
    switch_info: dict = field(default_factory=dict)
    link_info: list = field(default_factory=list)
    roles: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    @classmethod
    def check_knobs(cls, where: str, **values) -> None:
        """The constructor's check of its knobs, against their one declaration."""
        for name, value in values.items():
            cls.KNOBS[name].check(where, name, value)

    @classmethod
    def from_spec(cls, knobs: dict, workers: int) -> TopoGraph:
        """The graph a spec's ``[topology]`` values ask for (``workers``: the placement's)."""
        return cls(**{name: knobs[name] for name in cls.KNOBS})

    @classmethod
    def hosts_for(cls, knobs: dict) -> int:
        """Hosts a placement may use (server included) with these knob values.

        By default the graph is built and counted; a kind whose size follows
        its knobs by a formula says so instead.
        """
        return len(cls.from_spec(knobs, 1).hosts())

    # -- Mininet-like construction API ------------------------------------
    def addHost(self, name, ip, pod=0):
        if name in self.host_info or name in self.switch_info:
            raise ValueError(f"duplicate node name {name!r}")
        self.host_info[name] = HostInfo(name, ip, mac_for_ip(ip), pod)
        return name

    def addSwitch(self, name, dpid, tier, pod=0):
        if name in self.host_info or name in self.switch_info:
            raise ValueError(f"duplicate node name {name!r}")
        if not SWITCH_NAME_RE.match(name):
            raise ValueError(f"switch name {name!r} must match {SWITCH_NAME_RE.pattern} "
                             "so that `dblp-testbed clean` recognises it")
        self.switch_info[name] = SwitchInfo(name, int(dpid), tier, pod)
        return name

    def addLink(self, node1, node2, port1, port2):
        for n in (node1, node2):
            if n not in self.host_info and n not in self.switch_info:
                raise ValueError(f"link to unknown node {n!r}")
        for n, p in ((node1, port1), (node2, port2)):
            if p in self.ports(n):
                raise ValueError(f"port {p} of {n} used twice")
        self.link_info.append(LinkInfo(node1, node2, int(port1), int(port2)))

    # -- inspection --------------------------------------------------------
    def hosts(self):
        return sorted(self.host_info)

    def switches(self):
        return sorted(self.switch_info)

    def links(self):
        return list(self.link_info)

    def isSwitch(self, name):
        return name in self.switch_info

    def ports(self, node) -> dict:
        """port number -> (neighbour, neighbour port)."""
        out = {}
        for link in self.link_info:
            if link.node1 == node:
                out[link.port1] = (link.node2, link.port2)
            if link.node2 == node:
                out[link.port2] = (link.node1, link.port1)
        return out

    def port_to(self, node, neighbour) -> int:
        for p, (n, _) in self.ports(node).items():
            if n == neighbour:
                return p
        raise KeyError(f"{node} has no link to {neighbour}")

    def neighbours(self, node):
        return [n for n, _ in self.ports(node).values()]

    def host_switch(self, host):
        """(switch, switch port) where a host attaches."""
        (sw, port), = self.ports(host).values()
        return sw, port

    def host_intf(self, host) -> str:
        (p,) = self.ports(host).keys()
        return f"{host}-eth{p}"

    def interface_names(self):
        names = []
        for link in self.link_info:
            names += [link.intf1(), link.intf2()]
        return names

    def dpid_of(self, switch) -> int:
        return self.switch_info[switch].dpid

    def switch_by_dpid(self, dpid) -> str:
        for s in self.switch_info.values():
            if s.dpid == dpid:
                return s.name
        raise KeyError(f"no switch with DPID {dpid:#x}")

    def host_by_ip(self, ip) -> str:
        for h in self.host_info.values():
            if h.ip == ip:
                return h.name
        raise KeyError(f"no host with IP {ip}")

    def role(self, name):
        """Host(s) playing a role: 'server', 'workers', 'cross'."""
        if name not in self.roles:
            raise KeyError(f"topology {self.name!r} has no role {name!r}; has {sorted(self.roles)}")
        return self.roles[name]

    def place(self, n_workers: int):
        """(server, [workers]) for n workers, spread over the fabric.

        Why: the harness wants as many workers as the experiment asks for, on
        hosts whose traffic to the server crosses the fabric (other pods first).
        """
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        server = self.roles["server"]
        order = list(self.roles.get("workers", [])) + [
            h for h in self.roles.get("placement_order", self.hosts())
            if h != server and h not in self.roles.get("workers", [])]
        if n_workers > len(order):
            raise ValueError(f"n_workers={n_workers} exceeds the {len(order)} hosts "
                             f"available besides the server in {self.name}")
        return server, order[:n_workers]

    # -- (de)serialisation for the controller process ----------------------
    def to_dict(self) -> dict:
        return {
            "name": self.name, "prefixlen": self.prefixlen,
            "hosts": [asdict(h) for h in self.host_info.values()],
            "switches": [asdict(s) for s in self.switch_info.values()],
            "links": [asdict(link) for link in self.link_info],
            "roles": self.roles, "params": self.params,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TopoGraph:
        g = cls.__new__(cls)
        TopoGraph.__init__(g, name=d["name"], prefixlen=d.get("prefixlen", 8))
        g.host_info = {h["name"]: HostInfo(**h) for h in d["hosts"]}
        g.switch_info = {s["name"]: SwitchInfo(**s) for s in d["switches"]}
        g.link_info = [LinkInfo(**link) for link in d["links"]]
        g.roles = d.get("roles", {})
        g.params = d.get("params", {})
        return g

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)
