"""Loss-bound policies: which fraction P of a round's chunks may go missing.

A policy is a small object with validated knobs (like PyTorch's
``PowerSGDState``). Only the aggregator consults it: it asks ``bound(round)``
before a round and reports the whole-model gradient norm with ``observe``
after it; the decision for the next round travels to every participant in the
FINAL message of the current round, so all peers use the same bound.
"""
from __future__ import annotations

import math

from .config import POLICIES, check_setting, default_of


class ReliablePolicy:
    """P = 0: every chunk must arrive (the transport's reliable mode)."""

    name = "reliable"
    KNOBS: tuple[str, ...] = ()  # TransportConfig fields this policy takes
    #: Whether ``observe`` uses the norm: a sharded round computes it only then.
    READS_NORM = False

    def __init__(self):
        self.phase = "reliable"

    def bound(self, round: int) -> float:
        return 0.0

    def observe(self, round: int, grad_norm: float) -> None:
        """Reliable delivery ignores the training phase."""

    def knobs(self) -> dict:
        return {}


class StaticBound:
    """A fixed bound P: the MLT-style baseline of the paper (default 0.8 %)."""

    name = "static"
    KNOBS = ("p",)
    READS_NORM = False

    def __init__(self, p: float = default_of("p")):
        self.p = check_setting("p", p)
        self.phase = "static"

    def bound(self, round: int) -> float:
        return self.p

    def observe(self, round: int, grad_norm: float) -> None:
        """A static bound ignores the training phase."""

    def knobs(self) -> dict:
        return {"p": self.p}


class PhaseAwareBound:
    """DBLP: P_low in critical phases, P_high otherwise.

    Training starts critical. At every check (after rounds ``check_every-1``,
    ``2*check_every-1``, ...) the aggregator compares the whole-model gradient
    norm with the one of the previous check: a relative change
    ``|prev - cur| / prev >= threshold`` is the critical-learning signal
    (Accordion) and selects P_low until the next check, otherwise P_high.
    ``check_every="epoch"`` checks once per epoch of ``rounds_per_epoch`` rounds.

    ``norm="mean"`` (default) compares the mean of the per-round norms over
    each check interval, as Accordion accumulates over its interval: one
    round's minibatch norm is noisy enough to flip the phase at random (seen
    on the digits CNN: spurious critical phases mid-training). ``norm="last"``
    compares only the check round's own norm, as the paper's prototype does.
    Which norm a round reports is the aggregator's ``signal`` setting
    (``dblp.rounds.detector_norm``): by default one the round's own drops
    cannot lower, so a relaxed bound cannot make its window look critical.
    """

    name = "dblp"
    KNOBS = ("p_low", "p_high", "threshold", "check_every", "rounds_per_epoch", "norm")
    READS_NORM = True

    def __init__(self, p_low: float = default_of("p_low"),
                 p_high: float | None = default_of("p_high"),
                 threshold: float = default_of("threshold"),
                 check_every: int | str = default_of("check_every"),
                 rounds_per_epoch: int | None = default_of("rounds_per_epoch"),
                 norm: str = default_of("norm")):
        self.p_low = check_setting("p_low", p_low)
        self.p_high = check_setting("p_high", round(self.p_low + 0.40, 12) if p_high is None
                                    else p_high)
        if self.p_high < self.p_low:
            raise ValueError(f"p_high ({self.p_high}) must be >= p_low ({self.p_low})")
        self.threshold = check_setting("threshold", threshold)
        check_every = check_setting("check_every", check_every)
        rounds_per_epoch = check_setting("rounds_per_epoch", rounds_per_epoch)
        if check_every == "epoch":
            if rounds_per_epoch is None:
                raise ValueError("rounds_per_epoch must be a positive int when check_every='epoch'"
                                 " (steps per epoch of one worker's shard)")
            self.interval = rounds_per_epoch
        else:
            self.interval = check_every
        check_setting("norm", norm)
        self.norm = norm
        self._window: list[float] = []
        self.check_every = check_every
        self.rounds_per_epoch = rounds_per_epoch
        self.critical = True
        self.prev_norm: float | None = None
        self.history: list[tuple[int, float, bool]] = []  # (round, norm, critical after)

    @property
    def phase(self) -> str:
        return "critical" if self.critical else "relaxed"

    def bound(self, round: int) -> float:
        return self.p_low if self.critical else self.p_high

    def observe(self, round: int, grad_norm: float) -> None:
        """Feed the norm of round ``round``'s aggregate; decides rounds after it."""
        if math.isfinite(float(grad_norm)):
            self._window.append(float(grad_norm))
        if (round + 1) % self.interval:
            return
        if self.norm == "mean" and self._window:
            cur = sum(self._window) / len(self._window)
        else:
            cur = float(grad_norm)
        self._window = []
        if self.prev_norm is not None and math.isfinite(cur):
            prev = self.prev_norm
            change = abs(prev - cur) / prev if prev > 0 else (0.0 if cur == 0 else math.inf)
            self.critical = change >= self.threshold
        if math.isfinite(cur):
            self.prev_norm = cur
        self.history.append((round, cur, self.critical))

    def knobs(self) -> dict:
        return {"p_low": self.p_low, "p_high": self.p_high, "threshold": self.threshold,
                "check_every": self.check_every, "rounds_per_epoch": self.rounds_per_epoch,
                "norm": self.norm}


# The registry lives with the settings (``dblp.config.POLICIES``); the built-in policies:
POLICIES.update({
    "reliable": ReliablePolicy,
    "static": StaticBound,
    "dblp": PhaseAwareBound,
})


def make_policy(name, **knobs):
    """Build a policy by registry name; an existing policy object passes through."""
    if not isinstance(name, str):
        if hasattr(name, "bound") and hasattr(name, "observe"):
            if knobs:
                raise ValueError("knobs given together with a policy object")
            return name
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {name!r}") from None
    try:
        return cls(**knobs)
    except TypeError as exc:
        raise ValueError(f"bad knob for policy {name!r}: {exc}") from None
