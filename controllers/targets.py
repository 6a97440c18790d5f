"""Burst targets by name, resolved to switch ports of the emulated fabric.

Names (the same the experiment spec accepts):
  ``server-downlink``     the server's edge-switch port, egress (towards the server)
  ``server-uplink``       the same port, ingress (what the server sends)
  ``workerN-downlink`` / ``workerN-uplink``  likewise for worker N of the placement
  ``HOST-downlink`` / ``HOST-uplink``        likewise for a host by name
  ``core-uplinks``        every aggregation->core port (leaf->spine), egress: every
                          cross-pod packet crosses exactly one of them
  ``A:B``                 switch A's port towards neighbour B, egress
  ``SWITCH-ethN``         that switch port, egress
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TargetPort:
    switch: str
    port: int
    direction: str  # "egress" (leaving the switch) or "ingress" (entering it)

    @property
    def intf(self) -> str:
        return f"{self.switch}-eth{self.port}"


# What to write instead of a target that does not resolve (the spec's and the socket's errors).
TARGET_FIX = ("use server-downlink, server-uplink, workerN-downlink, workerN-uplink, HOST-downlink, "
              "core-uplinks, SWITCH:NEIGHBOUR or SWITCH-ethN")


class TargetError(ValueError):
    """A target name that does not resolve in this topology and placement: the problem; the fix."""

    def __init__(self, problem: str, fix: str = TARGET_FIX):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


def _host_port(topo, host, direction):
    sw, port = topo.host_switch(host)
    return [TargetPort(sw, port, direction)]


def resolve_target(topo, name: str, roles: dict | None = None) -> list:
    """[TargetPort, ...] for a target name; raises TargetError naming the target."""
    roles = dict(topo.roles, **(roles or {}))
    if not isinstance(name, str) or not name:
        raise TargetError(f"target must be a non-empty string, got {name!r}")
    m = re.match(r"^(.+)-(downlink|uplink)$", name)
    if m and not re.match(r"^dt[a-z]\d+-eth\d+$", name):
        who, kind = m.groups()
        direction = "egress" if kind == "downlink" else "ingress"
        if who == "server":
            host = roles.get("server")
        elif re.match(r"^worker\d+$", who):
            workers = roles.get("workers", [])
            i = int(who[6:])
            if i >= len(workers):
                raise TargetError(f"target {name!r}: only {len(workers)} workers placed",
                                  f"use worker0..worker{len(workers) - 1}" if workers else TARGET_FIX)
            host = workers[i]
        else:
            host = who
        if host not in topo.host_info:
            raise TargetError(f"target {name!r}: no host {host!r} in {topo.name}")
        return _host_port(topo, host, direction)
    if name == "core-uplinks":
        tiers = {topo.switch_info[s].tier for s in topo.switches()}
        top = max(tiers)
        if top == 0:
            raise TargetError(f"target 'core-uplinks': {topo.name} has a single switch tier")
        out = []
        for s in topo.switches():
            if topo.switch_info[s].tier == top - 1:
                for p, (n, _) in sorted(topo.ports(s).items()):
                    if topo.isSwitch(n) and topo.switch_info[n].tier == top:
                        out.append(TargetPort(s, p, "egress"))
        return out
    m = re.match(r"^(dt[a-z]\d+)-eth(\d+)$", name)
    if m:
        s, p = m.group(1), int(m.group(2))
        if s not in topo.switch_info or p not in topo.ports(s):
            raise TargetError(f"target {name!r}: no such switch port in {topo.name}")
        return [TargetPort(s, p, "egress")]
    if ":" in name:
        a, b = name.split(":", 1)
        if a not in topo.switch_info:
            raise TargetError(f"target {name!r}: {a!r} is not a switch", "use SWITCH:NEIGHBOUR")
        try:
            return [TargetPort(a, topo.port_to(a, b), "egress")]
        except KeyError:
            raise TargetError(f"target {name!r}: no link {a}-{b} in {topo.name}") from None
    raise TargetError(f"unknown target {name!r}")
