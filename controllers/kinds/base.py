"""A burst kind: its knobs (what the spec checks) and its mechanism (what the controller runs).

One class per kind, registered in ``KINDS`` (`register_kind`). The harness
uses only the declaration side (``params``, `check_params`, `every_params`)
and never imports os-ken; the controller's bursts app
(``controllers.bursts_app``) uses only the mechanism side (`open`, `start`,
`stop`, `switch_reconnected`, `close`) and never asks which kind it runs. So a
new kind is one module with its class plus its registration, and every spec,
schedule, manual trigger and record takes it as it takes the built-in ones.
Standard library only.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from controllers.targets import TargetPort


class BurstOutcome(Protocol):
    """What a mechanism reads and writes of its burst's record.

    The record itself (``controllers.bursts.BurstRecord``, one ``burst``
    raw-log line) lives with the schedule, above the kinds; a mechanism needs
    only these fields of it, so the kinds import nothing from above them.
    """

    spec: Any                      # the burst as specified (controllers.bursts.BurstSpec)
    arm: str
    seed: int | None
    actual_end_ns: int | None
    dropped_packets: int | None
    seen_packets: int | None
    detail: dict


class BurstError(ValueError):
    """A burst knob is wrong. ``field`` is relative ("params.p"); ``under`` prefixes it.

    Why a ValueError carrying (field, problem, fix): the spec turns it into
    its own one-line error naming the spec field, the controller into an
    error reply, and neither has to parse a message.
    """

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}; {fix}")

    def under(self, where: str) -> BurstError:
        return BurstError(f"{where}.{self.field}" if self.field else where, self.problem, self.fix)


@dataclass(frozen=True)
class Range:
    """A number's type and bounds, checked in one place with one wording."""

    lo: float
    hi: float
    fix: str
    integer: bool = False
    lo_open: bool = False

    def check(self, field: str, value: Any) -> Any:
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            raise BurstError(field, f"expected {kind}, got {value!r}", self.fix)
        if isinstance(value, float) and not math.isfinite(value):
            raise BurstError(field, f"{value!r} is not a finite number", self.fix)
        if (value <= self.lo if self.lo_open else value < self.lo) or value > self.hi:
            lb = "(" if self.lo_open else "["
            raise BurstError(field, f"{value!r} is out of range {lb}{_num(self.lo)}, {_num(self.hi)}]",
                             self.fix)
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


#: A loss probability (the loss kind's p, the generator's p).
P = Range(0, 1, "use a loss probability in [0, 1]")


@dataclass(frozen=True)
class Choice:
    """A word from a fixed list, checked with the same wording as a number's range."""

    words: tuple[str, ...]

    def check(self, field: str, value: Any) -> Any:
        if value not in self.words:
            raise BurstError(field, f"{value!r} is not one of {', '.join(self.words)}",
                             f"use one of {', '.join(self.words)}")
        return value


@dataclass(frozen=True)
class Param:
    """One kind-specific knob. ``default=None``: the mechanism picks it (from the link rate,
    or its documented default), and the burst's record keeps only what was asked."""

    range: Range | Choice
    default: float | None
    doc: str


class BurstKind(abc.ABC):
    """The interface of a burst kind; one instance is one burst switched on in the fabric.

    Declaration (class attributes and class methods, used by spec checks and
    the command line): ``name``, ``params`` (the knobs a burst's ``params``
    table may hold; anything else is refused), ``doc``.

    Mechanism (used by the controller's bursts app): `open` once per
    controller for what all bursts of the kind share, the constructor with one
    burst's record and resolved target ports, `start`, `stop`, and
    `switch_reconnected`. ``app`` is the running controller app: its
    topology (``topo``, ``roles``, ``rules``), configuration (``cfg``),
    switches (``datapaths``, ``add_flow``, ``_barrier_wait``, ``_request``),
    ``logger`` and ``spawn``.
    """

    name: ClassVar[str]
    params: ClassVar[dict[str, Param]] = {}
    doc: ClassVar[str] = ""

    # ------------------------------------------------------------------ declaration
    @classmethod
    def check_params(cls, params: Any) -> dict:
        """``params`` checked against ``cls.params`` and completed with their defaults."""
        if not isinstance(params, dict):
            raise BurstError("params", f"expected a table, got {params!r}",
                             f"write e.g. params = {{{', '.join(cls.params)}}}")
        out = {}
        for key, value in params.items():
            if key not in cls.params:
                raise BurstError(f"params.{key}", f"unknown knob for a {cls.name} burst",
                                 f"remove it; {cls.name} takes: {', '.join(cls.params) or 'nothing'}")
            out[key] = cls.params[key].range.check(f"params.{key}", value)
        for key, p in cls.params.items():
            if key not in out and p.default is not None:
                out[key] = p.default
        return out

    @classmethod
    def every_params(cls, p: float) -> dict:
        """The params of the generator's bursts (``[burst_every]``), whose one knob is ``p``.

        A kind with a loss probability takes it; any other runs at its defaults.
        """
        return {"p": p} if "p" in cls.params else {}

    # ------------------------------------------------------------------ mechanism
    @classmethod
    def open(cls, app) -> Any:
        """What every burst of this kind in one controller shares (None: nothing)."""
        return None

    @classmethod
    def close(cls, app, shared: Any) -> None:
        """Release what `open` made, when the controller stops (by default nothing to release)."""
        return None

    def __init__(self, app, rec: BurstOutcome, ports: list[TargetPort], shared: Any = None):
        self.app, self.rec, self.ports, self.shared = app, rec, list(ports), shared

    @property
    def spec(self):
        return self.rec.spec

    def tag(self, sep: str = "_") -> str:
        """``ARM<sep>[s<seed>_]ID``: names this burst's pieces in the fabric, unique per unit."""
        seed = "" if self.rec.seed is None else f"s{self.rec.seed}_"
        return f"{self.rec.arm}{sep}{seed}{self.spec.id}"

    @abc.abstractmethod
    def start(self) -> int | None:
        """Switch the burst on; return when it took effect (ns) if the mechanism knows, else None."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Switch it off and write into ``self.rec`` its actual end and what it dropped."""

    def switch_reconnected(self, dpid: int) -> None:
        """A switch came back (its flows and meters are gone): reinstall what this burst needs
        (by default nothing: a kind whose state lives outside the switches)."""
        return None


KINDS: dict[str, type[BurstKind]] = {}


def register_kind(cls: type[BurstKind]) -> type[BurstKind]:
    """Add a kind (a class decorator); a different class under a taken name is refused."""
    if not (isinstance(cls, type) and issubclass(cls, BurstKind)) or not getattr(cls, "name", ""):
        raise TypeError(f"{cls!r} is not a named BurstKind subclass")
    old = KINDS.get(cls.name)
    if old is not None and old is not cls:
        raise ValueError(f"burst kind {cls.name!r} is already registered as {old.__name__}")
    KINDS[cls.name] = cls
    return cls
