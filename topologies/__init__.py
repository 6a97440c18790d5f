"""Pure topology graphs and their routing; no root, no Mininet at import.

``TOPOLOGIES`` maps a name to a constructor (Mininet ``bin/mn`` style); the
CLI offers its keys as a ``click.Choice``.
"""
from .fattree import FatTreeTopo, make_dpid
from .graph import IFNAME_MAX, SWITCH_NAME_RE, SWITCH_PREFIX, TopoGraph
from .leafspine import LeafSpineTopo
from .routing import FlowRule, compute_rules, multipath_bits, trace_path
from .star import StarTopo

TOPOLOGIES = {
    "fattree": FatTreeTopo,
    "star": StarTopo,
    "leafspine": LeafSpineTopo,
}


def make_topology(name: str, **knobs) -> TopoGraph:
    """Build a registered topology; unknown names raise naming the knob."""
    if name not in TOPOLOGIES:
        raise ValueError(f"topology {name!r} unknown; choose one of {sorted(TOPOLOGIES)}")
    return TOPOLOGIES[name](**knobs)


__all__ = ["TopoGraph", "FatTreeTopo", "StarTopo", "LeafSpineTopo", "TOPOLOGIES",
           "make_topology", "make_dpid", "FlowRule", "compute_rules", "trace_path",
           "multipath_bits", "SWITCH_NAME_RE", "SWITCH_PREFIX", "IFNAME_MAX"]
