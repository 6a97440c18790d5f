"""Which server runs which node: a pod stays on one server, so only core links cross machines.

Why pods: inside a pod every packet between its hosts stays on one machine,
and a link between machines is a tunnel whose rate and delay are the
machines' network's, not the emulator's. Keeping each pod whole leaves the
top tier's links (a fat-tree's core, a leaf-spine's spine) as the only
tunnels, and every one of them carries the same kind of traffic.

A pod is found from the graph itself, not from names: remove the top tier's
switches and each connected piece that remains is a pod (a fat-tree's edge
and aggregation switches with their hosts; a leaf with its hosts). Pods go
to servers in contiguous, even blocks, the pod holding the aggregation
server (role ``server``) first, so it lands on this machine with the
controller; the top tier's switches are spread evenly too.
"""
from __future__ import annotations

from collections.abc import Sequence

from topologies.graph import LinkInfo, TopoGraph


class PlacementError(ValueError):
    """The topology cannot be spread over these servers as asked."""


def top_tier(topo: TopoGraph) -> list[str]:
    """The switches of the highest tier: the ones whose links may cross machines."""
    if not topo.switch_info:
        return []
    tier = max(s.tier for s in topo.switch_info.values())
    tops = sorted(s.name for s in topo.switch_info.values() if s.tier == tier)
    # A one-tier graph (a star) has no layer above its pods: it is one pod.
    return tops if tier > min(s.tier for s in topo.switch_info.values()) else []


def pods(topo: TopoGraph) -> list[list[str]]:
    """The pods: connected pieces of the graph without its top tier, each sorted, in pod order.

    Pod order is the lowest ``pod`` attribute of a pod's hosts (then names),
    with the pod of the aggregation server first.
    """
    tops = set(top_tier(topo))
    nodes = [n for n in [*topo.hosts(), *topo.switches()] if n not in tops]
    adjacent: dict[str, list[str]] = {n: [] for n in nodes}
    for link in topo.links():
        if link.node1 in adjacent and link.node2 in adjacent:
            adjacent[link.node1].append(link.node2)
            adjacent[link.node2].append(link.node1)
    seen: set[str] = set()
    found = []
    for start in nodes:
        if start in seen:
            continue
        piece, todo = [], [start]
        seen.add(start)
        while todo:
            node = todo.pop()
            piece.append(node)
            for nxt in adjacent[node]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        found.append(sorted(piece))
    server = topo.roles.get("server")

    def order(piece: list[str]) -> tuple:
        hosts = [(topo.host_info[n].pod, n) for n in piece if n in topo.host_info] or [(0, piece[0])]
        return (server not in piece, min(hosts))
    return sorted(found, key=order)


def _blocks(items: Sequence, servers: Sequence[str]) -> dict[str, list]:
    """Contiguous blocks of ``items``, one per server, sizes differing by at most one (larger first)."""
    q, r = divmod(len(items), len(servers))
    out, i = {}, 0
    for n, server in enumerate(servers):
        size = q + (n < r)
        out[server] = list(items[i:i + size])
        i += size
    return out


def place_pods(topo: TopoGraph, servers: Sequence[str]) -> dict[str, str]:
    """Every host and switch of ``topo`` -> the name of the server that runs it.

    ``servers`` are the spec's names, this machine first. Each server gets
    whole pods (as even a share as the pod count allows) and an even share
    of the top tier's switches. Fewer pods than servers is a
    `PlacementError`: a server with no pod would only forward core traffic
    through tunnels, which measures the machines' network, not the fabric.
    """
    names = list(servers)
    if not names:
        raise PlacementError("no servers to place the fabric on")
    if len(set(names)) != len(names):
        raise PlacementError(f"a server is listed twice in {names}")
    found = pods(topo)
    if len(found) < len(names):
        raise PlacementError(f"topology {topo.name!r} has {len(found)} pod(s), fewer than the "
                             f"{len(names)} servers; each server needs at least one whole pod")
    placement: dict[str, str] = {}
    for server, block in _blocks(found, names).items():
        for pod in block:
            placement.update(dict.fromkeys(pod, server))
    for server, block in _blocks(top_tier(topo), names).items():
        placement.update(dict.fromkeys(block, server))
    return placement


def crossing_links(topo: TopoGraph, placement: dict[str, str]) -> list[LinkInfo]:
    """The links whose two ends run on different servers: the tunnels."""
    return [link for link in topo.links() if placement[link.node1] != placement[link.node2]]
