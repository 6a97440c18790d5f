"""Pure topology graphs and their routing; no root, no Mininet at import.

``TOPOLOGIES`` maps a name to a `TopoGraph` subclass (Mininet ``bin/mn``
style); the CLI offers its keys as a ``click.Choice`` and the experiment spec
reads each class's knobs from it. A new topology is one module with its class
plus ``register_topology(MyTopo, "name")``.
"""
from .fattree import FatTreeTopo, make_dpid
from .graph import IFNAME_MAX, SWITCH_NAME_RE, SWITCH_PREFIX, Knob, TopoGraph
from .leafspine import LeafSpineTopo
from .routing import FlowRule, compute_rules, multipath_bits, trace_path
from .star import StarTopo

TOPOLOGIES: dict[str, type[TopoGraph]] = {}


def register_topology(cls: type[TopoGraph], name: str) -> type[TopoGraph]:
    """Add a topology kind under ``name``.

    Its knobs join the spec's ``[topology]`` fields; a knob name another kind
    declares already must mean the same (same default and range), because
    the spec has one field of that name.
    """
    if not (isinstance(cls, type) and issubclass(cls, TopoGraph)):
        raise TypeError(f"topology {name!r} must be a TopoGraph subclass, got {cls!r}")
    old = TOPOLOGIES.get(name)
    if old is not None and old is not cls:
        raise ValueError(f"topology {name!r} is already registered as {old.__name__}")
    for other_name, other in TOPOLOGIES.items():
        for knob, decl in cls.KNOBS.items():
            if other is not cls and knob in other.KNOBS and other.KNOBS[knob] != decl:
                raise ValueError(f"topology {name!r}: knob {knob!r} differs from "
                                 f"{other_name}'s ({other.KNOBS[knob]} vs {decl})")
    TOPOLOGIES[name] = cls
    return cls


register_topology(FatTreeTopo, "fattree")
register_topology(StarTopo, "star")
register_topology(LeafSpineTopo, "leafspine")


def make_topology(name: str, **knobs) -> TopoGraph:
    """Build a registered topology; unknown names raise naming the knob."""
    if name not in TOPOLOGIES:
        raise ValueError(f"topology {name!r} unknown; choose one of {sorted(TOPOLOGIES)}")
    return TOPOLOGIES[name](**knobs)


__all__ = ["TopoGraph", "Knob", "register_topology", "FatTreeTopo", "StarTopo", "LeafSpineTopo", "TOPOLOGIES",
           "make_topology", "make_dpid", "FlowRule", "compute_rules", "trace_path",
           "multipath_bits", "SWITCH_NAME_RE", "SWITCH_PREFIX", "IFNAME_MAX"]
