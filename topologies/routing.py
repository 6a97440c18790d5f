"""Proactive multipath routes computed from a topology graph, as plain data.

The controller turns each ``FlowRule`` into an OpenFlow 1.3 flow entry; the
tests call the same functions without a switch.

Multipath mechanism (why masked ports): OVS's default select-group hash
ignores UDP ports, and os-ken cannot send OVS's OpenFlow 1.5
``selection_method=hash`` group property. OpenFlow 1.3 masked matches on the
low ``m`` bits of the UDP/TCP *source* port can: a switch with n equal-cost
next hops at tier t picks next hop ``(v // base_t) % n`` where ``v = sport &
(2^m - 1)`` and ``base_t`` is the product of the fan-outs of the tiers below.
In a k-ary fat-tree a flow's core switch is therefore ``v mod (k/2)^2``:
consecutive source ports use every core. Traffic without ports (ICMP) and
ARP spread by destination host instead. ARP is routed like IP by target
address, so nothing is ever flooded.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

ETH_IP, ETH_ARP = 0x0800, 0x0806
PROTO = {"udp": 17, "tcp": 6}
PRIO_DIRECT, PRIO_MULTIPATH, PRIO_FALLBACK = 300, 200, 100


@dataclass(frozen=True)
class FlowRule:
    """One flow entry: priority, OpenFlow 1.3 match fields, output port."""
    priority: int
    match: tuple          # sorted ((field, value | (value, mask)), ...)
    out_port: int
    kind: str = "direct"  # direct | multipath | fallback | arp

    def match_dict(self) -> dict:
        return dict(self.match)

    def matches(self, pkt: dict) -> bool:
        for f, want in self.match:
            have = pkt.get(f)
            if have is None:
                return False
            if isinstance(want, tuple):
                value, mask = want
                if have & mask != value:
                    return False
            elif have != want:
                return False
        return True


def _m(**fields) -> tuple:
    return tuple(sorted(fields.items()))


def _dist_to(topo, target_switch) -> dict:
    dist = {target_switch: 0}
    q = deque([target_switch])
    while q:
        s = q.popleft()
        for n in topo.neighbours(s):
            if topo.isSwitch(n) and n not in dist:
                dist[n] = dist[s] + 1
                q.append(n)
    return dist


def next_hops(topo) -> dict:
    """{switch: {host: [ports on shortest paths, ascending]}}."""
    out = {s: {} for s in topo.switches()}
    for h in topo.hosts():
        edge, hport = topo.host_switch(h)
        dist = _dist_to(topo, edge)
        for s in topo.switches():
            if s not in dist:
                continue
            if s == edge:
                out[s][h] = [hport]
                continue
            out[s][h] = sorted(p for p, (n, _) in topo.ports(s).items()
                               if topo.isSwitch(n) and dist.get(n) == dist[s] - 1)
    return out


def tier_fanouts(topo, hops=None) -> dict:
    """Largest number of equal-cost next hops per tier (1 if none)."""
    hops = hops or next_hops(topo)
    fan = {}
    for s, per in hops.items():
        t = topo.switch_info[s].tier
        fan[t] = max([fan.get(t, 1)] + [len(p) for p in per.values()])
    return fan


def tier_bases(fan: dict) -> dict:
    base, acc = {}, 1
    for t in sorted(fan):
        base[t] = acc
        acc *= fan[t]
    return base


def multipath_bits(topo, hops=None) -> int:
    """Port bits matched: enough for every path, plus 2 bits for evenness."""
    fan = tier_fanouts(topo, hops)
    paths = math.prod(fan.values())
    if paths <= 1:
        return 0
    return min(8, math.ceil(math.log2(paths)) + 2)


def compute_rules(topo) -> dict:
    """{switch name: [FlowRule, ...]} routing every host from every switch."""
    hops = next_hops(topo)
    fan = tier_fanouts(topo, hops)
    base = tier_bases(fan)
    m = multipath_bits(topo, hops)
    mask = (1 << m) - 1
    host_index = {h: i for i, h in enumerate(topo.hosts())}
    rules = {}
    for s, per in hops.items():
        t = topo.switch_info[s].tier
        out = []
        groups = {}
        for h, ports in per.items():
            ip = topo.host_info[h].ip
            if len(ports) == 1:
                out.append(FlowRule(PRIO_DIRECT, _m(eth_type=ETH_IP, ipv4_dst=ip), ports[0]))
                out.append(FlowRule(PRIO_DIRECT, _m(eth_type=ETH_ARP, arp_tpa=ip), ports[0], "arp"))
                continue
            groups.setdefault(tuple(ports), []).append(h)
            pick = ports[(host_index[h] // base[t]) % len(ports)]
            out.append(FlowRule(PRIO_FALLBACK, _m(eth_type=ETH_IP, ipv4_dst=ip), pick, "fallback"))
            out.append(FlowRule(PRIO_DIRECT, _m(eth_type=ETH_ARP, arp_tpa=ip), pick, "arp"))
        for ports, dests in groups.items():
            # One group (fat-tree, leaf-spine): port rules need no destination
            # match, because every direct route has a higher priority.
            dst_fields = [{}] if len(groups) == 1 else [
                {"ipv4_dst": topo.host_info[h].ip} for h in dests]
            for extra in dst_fields:
                for proto, num in PROTO.items():
                    for v in range(1 << m):
                        port = ports[(v // base[t]) % len(ports)]
                        out.append(FlowRule(PRIO_MULTIPATH, _m(
                            eth_type=ETH_IP, ip_proto=num, **{f"{proto}_src": (v, mask)},
                            **extra), port, "multipath"))
        rules[s] = out
    return rules


def lookup(rules, pkt: dict):
    """Highest-priority matching rule (OpenFlow semantics) or None."""
    best = None
    for r in rules:
        if r.matches(pkt) and (best is None or r.priority > best.priority):
            best = r
    return best


def packet(topo, src, dst, proto="udp", sport=40000, dport=47474, arp=False) -> dict:
    si, di = topo.host_info[src], topo.host_info[dst]
    if arp:
        return {"eth_type": ETH_ARP, "arp_spa": si.ip, "arp_tpa": di.ip}
    pkt = {"eth_type": ETH_IP, "ipv4_src": si.ip, "ipv4_dst": di.ip}
    if proto in PROTO:
        pkt.update(ip_proto=PROTO[proto], **{f"{proto}_src": sport, f"{proto}_dst": dport})
    else:
        pkt["ip_proto"] = 1
    return pkt


def trace_path(topo, rules, src, dst, **pkt_kw):
    """[(switch, out_port), ...] from host src to host dst; raises on loops/drops."""
    pkt = packet(topo, src, dst, **pkt_kw)
    node, _ = topo.host_switch(src)
    seen, path = set(), []
    while True:
        if node in seen:
            raise RuntimeError(f"routing loop {src}->{dst} at {node}: {path}")
        seen.add(node)
        r = lookup(rules[node], pkt)
        if r is None:
            raise RuntimeError(f"no route {src}->{dst} at {node} for {pkt}")
        path.append((node, r.out_port))
        nxt, _ = topo.ports(node)[r.out_port]
        if nxt == dst:
            return path
        if not topo.isSwitch(nxt):
            raise RuntimeError(f"{src}->{dst} delivered to wrong host {nxt}")
        node = nxt
