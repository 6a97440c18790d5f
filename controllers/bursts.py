"""Burst requests and schedules as plain objects (no switch, no clock needed).

A ``BurstSpec`` is one request; a ``BurstSchedule`` answers "which bursts
start/end at this round event or at this time" for one arm, so the
controller's handlers stay thin and tests can drive a schedule directly.
Times are ``time.time_ns()`` (the emulated hosts share the kernel clock).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

KINDS = ("loss", "police", "congest")


class BurstError(ValueError):
    pass


def _num(d, key, lo, hi, where, integer=False, required=True, default=None):
    v = d.get(key, default)
    if v is None:
        if required:
            raise BurstError(f"{where}.{key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise BurstError(f"{where}.{key} must be a{'n integer' if integer else ' number'}, got {v!r}")
    if not lo <= v <= hi:
        raise BurstError(f"{where}.{key} must be in [{lo}, {hi}], got {v!r}")
    return v


def validate_params(kind: str, params: dict, where: str = "params") -> dict:
    """Kind-specific knobs, checked before anything touches the fabric."""
    if not isinstance(params, dict):
        raise BurstError(f"{where} must be an object, got {type(params).__name__}")
    out = dict(params)
    if kind == "loss":
        _num(out, "p", 0.0, 1.0, where)
    elif kind == "police":
        _num(out, "rate_mbps", 0.001, 100000, where, required=False)
        _num(out, "burst_kb", 1, 1_000_000, where, required=False)
    elif kind == "congest":
        _num(out, "rate_mbps", 0.01, 100000, where, required=False)
        _num(out, "pkt_bytes", 64, 1472, where, integer=True, required=False)
    return out


@dataclass
class BurstSpec:
    """One burst: what, where, and when (a round, a time, or now)."""
    id: str
    kind: str
    target: str
    params: dict = field(default_factory=dict)
    trigger: str = "manual"              # round | time | manual
    at_round: int | None = None
    at_s: float | None = None            # seconds after the arm's first round event
    rounds: int | None = None            # on until round at_round+rounds-1 ends
    duration_ms: float | None = None
    # With `rounds`: end after this long even if the round has not ended. A
    # transport that cannot finish a round under the burst (TCP backing off
    # under 80 % loss) then sees a long burst instead of an endless outage.
    max_ms: float | None = None

    @classmethod
    def from_dict(cls, d: dict, default_id: str = "b", where: str = "burst") -> "BurstSpec":
        if not isinstance(d, dict):
            raise BurstError(f"{where} must be an object, got {type(d).__name__}")
        kind = d.get("kind")
        if kind not in KINDS:
            raise BurstError(f"{where}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
        target = d.get("target")
        if not isinstance(target, str) or not target:
            raise BurstError(f"{where}.target must be a target name, got {target!r}")
        trigger = d.get("trigger") or ("round" if "at_round" in d else "time" if "at_s" in d else "manual")
        if trigger not in ("round", "time", "manual"):
            raise BurstError(f"{where}.trigger must be round, time or manual, got {trigger!r}")
        at_round = _num(d, "at_round", 0, 10**7, where, integer=True, required=trigger == "round")
        at_s = _num(d, "at_s", 0, 86400, where, required=trigger == "time")
        rounds = _num(d, "rounds", 1, 100000, where, integer=True, required=False)
        duration = _num(d, "duration_ms", 0.001, 3.6e6, where, required=False)
        max_ms = _num(d, "max_ms", 0.001, 3.6e6, where, required=False)
        if max_ms is not None and rounds is None:
            raise BurstError(f"{where}.max_ms only goes with rounds; give duration_ms instead")
        if (rounds is None) == (duration is None):
            raise BurstError(f"{where} needs exactly one of duration_ms and rounds")
        if rounds is not None and trigger != "round":
            raise BurstError(f"{where}.rounds only works with a round trigger; give duration_ms")
        return cls(id=str(d.get("id", default_id)), kind=kind, target=target,
                   params=validate_params(kind, d.get("params", {}) or {}, f"{where}.params"),
                   trigger=trigger, at_round=at_round, at_s=at_s, rounds=rounds,
                   duration_ms=duration, max_ms=max_ms)

    @property
    def last_round(self):
        return None if self.rounds is None else self.at_round + self.rounds - 1


def every_n_rounds(n: int, *, start_round: int, total_rounds: int, kind="loss",
                   target="server-downlink", params=None, rounds=1, prefix="g") -> list:
    """Generator: a burst every n rounds (the paper: 2-3 per ~1,000 iterations)."""
    if not isinstance(n, int) or n < 1:
        raise BurstError(f"every must be an integer >= 1, got {n!r}")
    return [BurstSpec(f"{prefix}{i:03d}", kind, target, validate_params(kind, params or {"p": 0.8}),
                      "round", r, None, rounds, None)
            for i, r in enumerate(range(start_round, total_rounds, n))]


def seeded_random(count: int, *, seed: int, first_round: int, last_round: int, kind="loss",
                  target="server-downlink", params=None, rounds=1, prefix="r") -> list:
    """Generator: ``count`` non-overlapping bursts at seeded random rounds."""
    span = list(range(first_round, last_round - rounds + 2, rounds))
    if count > len(span):
        raise BurstError(f"count={count} bursts of {rounds} rounds do not fit in rounds "
                         f"{first_round}..{last_round}")
    picks = sorted(random.Random(seed).sample(span, count))
    return [BurstSpec(f"{prefix}{i:03d}", kind, target, validate_params(kind, params or {"p": 0.8}),
                      "round", r, None, rounds, None) for i, r in enumerate(picks)]


class BurstSchedule:
    """The bursts of an experiment, applied to every arm alike."""

    def __init__(self, specs=()):
        self.specs = []
        ids = set()
        for i, s in enumerate(specs):
            spec = s if isinstance(s, BurstSpec) else BurstSpec.from_dict(s, f"b{i:03d}", f"bursts[{i}]")
            if spec.id in ids:
                raise BurstError(f"bursts[{i}].id {spec.id!r} is used twice")
            ids.add(spec.id)
            self.specs.append(spec)

    def __len__(self):
        return len(self.specs)

    def __iter__(self):
        return iter(self.specs)

    def starting_at_round(self, round_: int) -> list:
        return [s for s in self.specs if s.trigger == "round" and s.at_round == round_]

    def ending_after_round(self, round_: int) -> list:
        """Round-length bursts whose last round is ``round_`` (end at its end event)."""
        return [s for s in self.specs if s.trigger == "round" and s.rounds is not None
                and s.last_round == round_]

    def timed(self) -> list:
        return sorted((s for s in self.specs if s.trigger == "time"), key=lambda s: s.at_s)


@dataclass
class BurstRecord:
    """What actually happened; becomes one ``burst`` JSON line."""
    spec: BurstSpec
    arm: str
    requested_start_ns: int
    requested_end_ns: int | None = None
    actual_start_ns: int | None = None
    actual_end_ns: int | None = None
    dropped_packets: int | None = None
    seen_packets: int | None = None
    round: int | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)

    def log_line(self) -> dict:
        d = {"event": "burst", "arm": self.arm, "id": self.spec.id, "kind": self.spec.kind,
             "target": self.spec.target, "params": self.spec.params, "trigger": self.spec.trigger,
             "requested_start_ns": self.requested_start_ns, "requested_end_ns": self.requested_end_ns,
             "actual_start_ns": self.actual_start_ns, "actual_end_ns": self.actual_end_ns,
             "dropped_packets": self.dropped_packets}
        if self.round is not None:
            d["round"] = self.round
        if self.seen_packets is not None:
            d["seen_packets"] = self.seen_packets
        if self.error:
            d["error"] = self.error
        if self.detail:
            d["detail"] = self.detail
        return d
