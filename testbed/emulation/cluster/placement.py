"""Mininet's cluster edition places nodes with a class; this one places whole pods.

Which pods go where is `topologies.placement` (pure graphs, read by the spec's
check too); here is only the class ``MininetCluster`` takes.
"""
from __future__ import annotations

from topologies import TopoGraph
from topologies.placement import place_pods


def mininet_placer(topo: TopoGraph, local: str = "localhost"):
    """A placement class for Mininet's cluster edition (``MininetCluster(placement=...)``).

    The cluster edition calls ``placement(servers=..., nodes=..., hosts=...,
    switches=..., links=...)`` with its own server names, this machine being
    ``"localhost"``; the class answers ``place(node)`` from `place_pods` on
    ``topo`` (the graph the Mininet topology was built from, same names).
    """
    from mininet.examples.cluster import Placer

    class PodPlacer(Placer):
        """Whole pods per server (`place_pods`), for ``MininetCluster``."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            servers = [s if s else local for s in self.servers]
            self.placement = place_pods(topo, servers)

        def place(self, node):
            return self.placement[node]

    return PodPlacer
