"""A loss-bound policy defined outside the project, in this one file: ``ramp``.

The bound relaxes linearly from P_low to P_high over the first
``RAMP_ROUNDS`` rounds: tight while the model is fresh, loose afterwards.
Registered by the test that uses it (``dblp.POLICIES["ramp"] = RampBound``
and ``testbed.config.arms.register_policy("ramp")``), after which it is an
arm of a spec and an ``--arm`` of the worker and the server.
"""
from __future__ import annotations

from dblp.config import check_setting, default_of


class RampBound:
    """P = P_low + (P_high - P_low) * min(1, round / RAMP_ROUNDS)."""

    name = "ramp"
    KNOBS = ("p_low", "p_high")   # dblp.TransportConfig settings it takes
    READS_NORM = False
    RAMP_ROUNDS = 100

    def __init__(self, p_low: float = default_of("p_low"), p_high: float | None = None):
        self.p_low = check_setting("p_low", p_low)
        self.p_high = check_setting("p_high", self.p_low if p_high is None else p_high)
        if self.p_high < self.p_low:
            raise ValueError(f"p_high ({self.p_high}) must be >= p_low ({self.p_low})")
        self.phase = "ramp"

    def bound(self, round: int) -> float:
        return self.p_low + (self.p_high - self.p_low) * min(1.0, round / self.RAMP_ROUNDS)

    def observe(self, round: int, grad_norm: float) -> None:
        """The ramp follows the round number, not the training phase."""

    def knobs(self) -> dict:
        return {"p_low": self.p_low, "p_high": self.p_high}
