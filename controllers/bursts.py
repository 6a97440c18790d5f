"""Bursts, declared once: the typed request, the seeded schedule, the record.

The harness validates specs and resolves the schedule with this module; the
controller runs the same objects and logs the same record. It imports
nothing beyond the standard library (no os-ken), so both sides can use it.
Every number has its range beside it here, and nowhere else; the kinds and
their knobs are classes in ``controllers.kinds`` (``KINDS``), re-exported here.

Times are ``time.time_ns()``: the emulated hosts share the kernel clock.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controllers.kinds import KINDS, BurstError, BurstKind, P, Param, Range, register_kind

__all__ = ["KINDS", "P", "BurstError", "BurstKind", "Param", "Range", "register_kind",
           "SCHEDULE_VERSION", "BurstSpec", "BurstEvery", "BurstSchedule", "BurstRecord",
           "spec_bursts", "record_dir"]

SCHEDULE_VERSION = 1   # the `{"v": 1, "bursts": [...]}` document (burst_schedule.json, fabric.json)

TARGET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:.-]{0,63}$")
# Burst ids and arm names: they end up in nftables table names and run-directory paths.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# The one set of ranges (the spec, the generator, the socket and the controller share them;
# each kind's own knobs live with its class in controllers.kinds).
AT_ROUND = Range(0, 10_000_000, "aim at a round >= 0", integer=True)
AT_S = Range(0, 86_400, "use a time of 0..86400 s after the arm's first round")
ROUNDS = Range(1, 1000, "use 1..1000 rounds", integer=True)
DURATION_MS = Range(0, 600_000, "use a positive duration of at most 600000 ms", lo_open=True)
MAX_MS = Range(1, 600_000, "use a cap of 1..600000 ms")


def _kind(field_name: str, name: Any) -> type[BurstKind]:
    if name not in KINDS:
        raise BurstError(field_name, f"unknown kind {name!r}", f"choose from: {', '.join(KINDS)}")
    return KINDS[name]


def _target(field_name: str, target: Any) -> str:
    if not isinstance(target, str) or not TARGET_RE.match(target):
        raise BurstError(field_name, f"{target!r} is not a target name",
                         "use e.g. server-downlink, worker0-uplink, core-uplinks or SWITCH:NEIGHBOUR")
    return target


# What a user writes ([[bursts]], a manual burst); a schedule adds id and trigger.
#: A round-triggered burst hits its round when it starts in the round and covers at least
#: this share of it: what the controller's round trigger promises, which `bench bursts`
#: measures and the results pages quote.
HIT_COVER = 0.9

SPEC_KEYS = ("kind", "target", "params", "at_round", "at_s", "rounds", "duration_ms", "max_ms")
ALL_KEYS = SPEC_KEYS + ("id", "trigger")


@dataclass(frozen=True)
class BurstSpec:
    """One burst: what (kind, params), where (target), when (a round, a time or now), how long.

    Starts at round ``at_round`` or ``at_s`` seconds after the arm's first
    round event, or when asked (manual: neither). Lasts ``rounds`` rounds
    (round trigger only; then also ends after ``max_ms``, so a transport
    that cannot finish a round under the burst, TCP backing off under 80 %
    loss, sees a long burst instead of an endless outage) or ``duration_ms``.
    Validated on construction: an object that exists is a burst the
    controller can run, up to its target existing in the fabric.
    """

    kind: str = "loss"
    target: str = "server-downlink"
    params: dict = field(default_factory=dict)
    at_round: int | None = None
    at_s: float | None = None
    rounds: int | None = None
    duration_ms: float | None = None
    max_ms: float | None = None
    id: str = "b"

    def __post_init__(self):
        kind = _kind("kind", self.kind)
        _target("target", self.target)
        object.__setattr__(self, "params", kind.check_params(self.params))
        if not isinstance(self.id, str) or not NAME_RE.match(self.id):
            raise BurstError("id", f"{self.id!r} is not a burst id", "use letters, digits, '.', '_', '-'")
        if self.at_round is not None and self.at_s is not None:
            raise BurstError("", "needs at most one of at_round and at_s",
                             "give the round number or the time in seconds")
        for name, rng in (("at_round", AT_ROUND), ("at_s", AT_S), ("rounds", ROUNDS),
                          ("duration_ms", DURATION_MS), ("max_ms", MAX_MS)):
            if getattr(self, name) is not None:
                rng.check(name, getattr(self, name))
        if (self.rounds is None) == (self.duration_ms is None):
            raise BurstError("", "needs exactly one of duration_ms and rounds",
                             "give how many milliseconds or how many rounds")
        if self.rounds is not None and self.at_round is None:
            raise BurstError("rounds", "only works with a round trigger (at_round)",
                             "give duration_ms instead")
        if self.max_ms is not None and self.rounds is None:
            raise BurstError("max_ms", "only goes with rounds", "use duration_ms for a fixed-length burst")

    @property
    def trigger(self) -> str:
        return "round" if self.at_round is not None else "time" if self.at_s is not None else "manual"

    @property
    def last_round(self) -> int | None:
        return None if self.rounds is None or self.at_round is None else self.at_round + self.rounds - 1

    def to_dict(self, keys: Iterable[str] = ALL_KEYS) -> dict:
        d = {"id": self.id, "kind": self.kind, "target": self.target, "params": dict(self.params),
             "trigger": self.trigger}
        for name in ("at_round", "at_s", "rounds", "duration_ms", "max_ms"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return {k: v for k, v in d.items() if k in keys}

    @classmethod
    def from_dict(cls, d: Any, where: str = "burst", keys: tuple = ALL_KEYS) -> BurstSpec:
        """Parse one burst table; errors name ``where.FIELD``. ``trigger``, if given, must agree."""
        if not isinstance(d, dict):
            raise BurstError(where, f"expected a table, got {type(d).__name__}", "write it as a table")
        for k in d:
            if k not in keys:
                raise BurstError(f"{where}.{k}", "unknown field", f"remove it; known: {', '.join(keys)}")
        args = {k: v for k, v in d.items() if k != "trigger"}
        try:
            spec = cls(**args)
        except BurstError as exc:
            raise exc.under(where) from None
        if "trigger" in d and d["trigger"] != spec.trigger:
            raise BurstError(f"{where}.trigger", f"{d['trigger']!r} does not match the burst's start",
                             "round goes with at_round, time with at_s, manual with neither")
        return spec


def spec_bursts(tables: Any, total_rounds: int | None = None, where: str = "bursts") -> list[BurstSpec]:
    """The `[[bursts]]` of an experiment spec: each starts at a round it reaches, or at a time."""
    if not isinstance(tables, list):
        raise BurstError(where, "expected an array of tables ([[bursts]])",
                         "write each burst as a [[bursts]] table")
    out = []
    for i, table in enumerate(tables):
        spec = BurstSpec.from_dict(table, f"{where}[{i}]", keys=SPEC_KEYS)
        if spec.trigger == "manual":
            raise BurstError(f"{where}[{i}]", "needs exactly one of at_round and at_s",
                             "give the round number or the time in seconds")
        if total_rounds is not None and spec.at_round is not None and spec.at_round >= total_rounds:
            raise BurstError(f"{where}[{i}].at_round", f"{spec.at_round} is out of range "
                             f"[0, {total_rounds - 1}]", "aim at a round the experiment reaches")
        out.append(spec)
    return out


@dataclass(frozen=True)
class BurstEvery:
    """The generator: loss bursts at a seeded random ``fraction`` of rounds, or every ``every``.

    ``p`` is the loss probability of a kind that takes one (``loss``); the
    others run at their kind's defaults (`BurstKind.every_params`). A burst is round-locked
    (on for ``rounds`` rounds, capped at ``max_ms``) unless ``duration_ms``
    is set: then it starts with its round and lasts exactly that long for
    every arm, so a slower arm does not get a longer burst and no cap decides
    a figure.
    """

    enabled: bool = True
    fraction: float = 0.03
    every: int = 0          # > 0: every `every` rounds instead of a random fraction
    start_round: int = 10
    rounds: int = 1
    max_ms: float = 3000.0
    duration_ms: float = 0.0  # > 0: fixed-duration bursts starting with their round
    kind: str = "loss"
    target: str = "server-downlink"
    p: float = 0.8

    RANGES: ClassVar[dict[str, Range]] = {
        "fraction": Range(0, 1, "use a fraction of rounds in [0, 1]"),
        "every": Range(0, 100_000, "use 0 (off) or a period in rounds", integer=True),
        "start_round": Range(0, 100_000, "use a round >= 0", integer=True),
        "rounds": ROUNDS, "max_ms": MAX_MS, "p": P,
        "duration_ms": Range(0, 600_000, "use 0 (round-locked) or a duration of at most 600000 ms"),
    }

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise BurstError("enabled", f"expected true/false, got {self.enabled!r}", "write true or false")
        for name, rng in self.RANGES.items():
            rng.check(name, getattr(self, name))
        _kind("kind", self.kind)
        _target("target", self.target)

    @classmethod
    def schema(cls) -> dict[str, tuple[Any, Any]]:
        """``{field: (type, default)}``: the spec's `[burst_every]` section is this dataclass."""
        types = {"enabled": bool, "every": int, "start_round": int, "rounds": int,
                 "kind": str, "target": str}
        return {f.name: (types.get(f.name, (int, float)), f.default) for f in dataclasses.fields(cls)}

    def bursts(self, total_rounds: int, seed: int) -> list[BurstSpec]:
        """The generated bursts, non-overlapping; the same seed gives the same rounds."""
        if not self.enabled:
            return []
        first = self.start_round
        if self.every > 0:
            hit = list(range(first, total_rounds, self.every))
        else:
            candidates = list(range(first, total_rounds - self.rounds + 1))
            n = round(self.fraction * total_rounds)
            n = min(max(n, 1 if self.fraction > 0 else 0), len(candidates))
            hit = sorted(random.Random(seed).sample(candidates, n))
        params = KINDS[self.kind].every_params(self.p)
        out, taken = [], set()
        for r in hit:
            if any(r <= t < r + self.rounds for t in taken):
                continue
            taken.update(range(r, r + self.rounds))
            if self.duration_ms > 0:
                out.append(BurstSpec(self.kind, self.target, params, at_round=r,
                                     duration_ms=self.duration_ms))
            else:
                out.append(BurstSpec(self.kind, self.target, params, at_round=r, rounds=self.rounds,
                                     max_ms=self.max_ms))
        return out


class BurstSchedule:
    """The bursts of an experiment, applied to every arm alike; ids are unique."""

    def __init__(self, specs: Iterable[BurstSpec] = ()):
        self.specs: list[BurstSpec] = []
        ids = set()
        for i, spec in enumerate(specs):
            if spec.id in ids:
                raise BurstError(f"bursts[{i}].id", f"{spec.id!r} is used twice",
                                 "give each burst its own id")
            ids.add(spec.id)
            self.specs.append(spec)

    @classmethod
    def resolve(cls, explicit: Iterable[BurstSpec], every: BurstEvery | None, total_rounds: int,
                seed: int) -> BurstSchedule:
        """Explicit bursts plus the generator's, in start order, named b000, b001, ...

        Resolved once before the first arm starts, so every arm is hit at
        the same rounds by the same bursts.
        """
        out = list(explicit) + (every.bursts(total_rounds, seed) if every else [])
        out.sort(key=lambda b: (-1 if b.at_round is None else b.at_round, -1 if b.at_s is None else b.at_s))
        return cls(dataclasses.replace(b, id=f"b{i:03d}") for i, b in enumerate(out))

    @classmethod
    def from_list(cls, items: Any, where: str = "bursts") -> BurstSchedule:
        if not isinstance(items, list):
            raise BurstError(where, f"expected a list of bursts, got {type(items).__name__}",
                             "send a list of burst tables")
        # a burst without an id is named by its position, as the resolved schedule names them
        return cls(BurstSpec.from_dict({"id": f"b{i:03d}", **d} if isinstance(d, dict) else d,
                                       f"{where}[{i}]") for i, d in enumerate(items))

    def to_list(self) -> list[dict]:
        return [s.to_dict() for s in self.specs]

    def to_dict(self) -> dict:
        return {"v": SCHEDULE_VERSION, "bursts": self.to_list()}

    @classmethod
    def from_dict(cls, doc: Any) -> BurstSchedule:
        """Read the versioned document; ``None`` is no bursts. Refuses a version it does not know."""
        if doc is None:
            return cls()
        if not isinstance(doc, dict) or doc.get("v") != SCHEDULE_VERSION:
            got = doc.get("v") if isinstance(doc, dict) else type(doc).__name__
            raise BurstError("schedule", f"unknown schedule version {got!r}",
                             f"write it with this code (version {SCHEDULE_VERSION})")
        return cls.from_list(doc.get("bursts"))

    def __len__(self):
        return len(self.specs)

    def __iter__(self):
        return iter(self.specs)

    def starting_at_round(self, round_: int) -> list[BurstSpec]:
        return [s for s in self.specs if s.trigger == "round" and s.at_round == round_]

    def ending_after_round(self, round_: int) -> list[BurstSpec]:
        """Round-length bursts whose last round is ``round_`` (they end at its end event)."""
        return [s for s in self.specs if s.rounds is not None and s.last_round == round_]

    def timed(self) -> list[BurstSpec]:
        return sorted((s for s in self.specs if s.trigger == "time"), key=lambda s: s.at_s or 0.0)


@dataclass
class BurstRecord:
    """What actually happened to one burst in one arm: one ``burst`` JSON line.

    The line's fields are declared with the other raw-log events
    (``workloads.runlog.EVENTS["burst"]``; their version is the manifest's
    ``raw_log_schema``), and a unit test holds this writer to them."""

    spec: BurstSpec
    arm: str
    requested_start_ns: int
    seed: int | None = None    # the unit's seed (None: a manual burst, no unit announced it)
    requested_end_ns: int | None = None
    actual_start_ns: int | None = None
    actual_end_ns: int | None = None
    dropped_packets: int | None = None
    seen_packets: int | None = None
    round: int | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)

    def log_line(self) -> dict:
        d = {"event": "burst", "arm": self.arm, **({} if self.seed is None else {"seed": self.seed}),
             "id": self.spec.id,
             "kind": self.spec.kind, "target": self.spec.target, "params": self.spec.params,
             "trigger": self.spec.trigger,
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

    def log_dir(self, raw_dir: str) -> str:
        """Where this record's line goes: its unit's directory, or RUN/raw/<arm>/ for a manual burst."""
        return os.path.join(raw_dir, self.arm) if self.seed is None \
            else record_dir(raw_dir, self.arm, self.seed)


def record_dir(raw_dir: str, arm: str, seed: int) -> str:
    """RUN/raw/<arm>/seed-<seed>: a copy of ``workloads.runlog.unit_dir`` (the
    controller imports nothing of the workloads); a unit test holds them equal."""
    return os.path.join(raw_dir, arm, f"seed-{int(seed)}")
