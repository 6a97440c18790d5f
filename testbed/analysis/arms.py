"""What the analysis asks of the arms registry: an arm's transport, mode and baseline.

Why its own module: the tables (per-round transport and mode columns), the
packet reader (which port a transport speaks) and the claims (which pairs of
arms a claim compares) all ask the same questions of `testbed.config.arms.ARMS`.
Answered in one place that imports nothing else of the analysis, none of
them has to import another for it (the claims once imported the tables for
it while the tables imported the claims: a circle).
"""
from __future__ import annotations

from testbed.config.arms import ARMS


def arm_kind(arm: str) -> tuple[str, str | None, str | None]:
    """(transport, control path, mode) of an arm, from the arms registry."""
    a = ARMS[arm]
    return a.transport, a.control, a.mode


def arm_transport(arm: str) -> str:
    return arm_kind(arm)[0]


def arm_mode(arm: str) -> str | None:
    """"ps" or "sharded" for the dblp transports, else None."""
    return arm_kind(arm)[2]


def is_dblp_arm(arm: str) -> bool:
    return arm_transport(arm) == "dblp"


def is_command_arm(arm: str) -> bool:
    """A user's own transport, run as a command (a spec's ``[commands.NAME]``)."""
    return ARMS[arm].command is not None


def is_reliable_arm(arm: str) -> bool:
    """An arm that delivers every gradient byte: gloo's all-reduce, or dblp's reliable policy
    (what a target accuracy is taken from: the accuracy no drop has touched). A label no
    registry knows (an ablation's point, ``dblp@p_high=0.208``) is not one."""
    return arm in ARMS and arm_transport(arm) in ("gloo", "reliable")


def paper_baselines(arms) -> list[str]:
    """The static-bound arms at the spec's p_static among ``arms``: the paper's baseline,
    whatever their control path and mode (a command arm is measured against each)."""
    return [a for a in arms if arm_transport(a) == "static" and ARMS[a].bound_from is None]


def static_partner(arm: str, arms, bound_from: str | None = None) -> str | None:
    """The static-bound arm among ``arms`` that differs from dblp arm ``arm`` only in
    its transport (same control path, same mode): DBLP's like-for-like baseline.

    ``bound_from`` picks which of the registry's static arms: None, the one at
    the spec's p_static (what DBLP is measured against); "p_high", the one at
    DBLP's relaxed bound (what phase-awareness is measured against).
    """
    _, control, mode = arm_kind(arm)
    for other in arms:
        if arm_kind(other) == ("static", control, mode) and ARMS[other].bound_from == bound_from:
            return other
    return None
