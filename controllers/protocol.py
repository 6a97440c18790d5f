"""The controller's control socket, declared once: every request, its reply, and the one client.

Transport: a UNIX stream socket (mode 0600, in the run directory, so every
emulated host reaches it through the shared file system), one JSON object
per line each way, one reply per request, in order. Every object carries
``"v": PROTOCOL_VERSION``; each side refuses a version it does not know, and
a field that is not declared here. The controller's server
(``controllers.control_server``) decodes with these classes; the workloads'
round announcer, the fabric and the ``burst`` command send with
``ControlClient``. No os-ken import: clients run without it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import socket
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controllers.bursts import NAME_RE, BurstError, BurstSchedule, BurstSpec

# History: 1 first declared; 2 a round announcement names its unit's seed
# (RoundRequest.seed), so an arm repeated over seeds is burst afresh per seed.
PROTOCOL_VERSION = 2
MAX_LINE = 1 << 20  # a request or reply line longer than this is refused


class ProtocolError(ValueError):
    """A message that does not follow this declaration (one line, says what is wrong)."""


# -- typed fields: decoded from JSON against the dataclass annotations ----------

_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a finite number",
          dict: "an object", list: "a list"}


def _decode(where: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(where, value, inner)
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, got {value!r:.60}")
        (inner,) = typing.get_args(tp)
        return [_decode(f"{where}[{i}]", v, inner) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, got {value!r:.60}")
        _, inner = typing.get_args(tp)
        return {k: _decode(f"{where}.{k}", v, inner) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _from_fields(tp, value, where)
    ok = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        dict: isinstance(value, dict),
        list: isinstance(value, list),
    }[tp]
    if not ok:
        raise ProtocolError(f"{where} must be {_NAMES[tp]}, got {value!r:.60}")
    return value


def _from_fields(cls: Any, obj: Any, where: str, skip: tuple = ()) -> Any:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where} must be a JSON object, got {type(obj).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in obj if k not in fields and k not in skip]
    if unknown:
        raise ProtocolError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(fields) or 'none'}")
    args = {}
    for name, f in fields.items():
        if name in obj:
            args[name] = _decode(f"{where}.{name}", obj[name], hints[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {name!r}")
    try:
        return cls(**args)
    except BurstError as exc:
        raise ProtocolError(str(exc.under(where))) from None
    except ValueError as exc:
        raise ProtocolError(f"{where}: {exc}") from None


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_wire(v) for v in value]
    return value


# -- replies --------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    ok: ClassVar[bool] = True

    def to_dict(self) -> dict:
        return {"v": PROTOCOL_VERSION, "ok": self.ok, **_to_wire(self)}


@dataclass(frozen=True)
class ErrorReply(Reply):
    """Any request refused: malformed, unknown version, bad burst, failed mechanism."""

    ok: ClassVar[bool] = False
    error: str
    id: str | None = None


@dataclass(frozen=True)
class SwitchStatus:
    name: str
    connected: bool
    routed: bool           # flows installed and confirmed by a barrier
    flows: int
    connects: int


@dataclass(frozen=True)
class StatusReply(Reply):
    topology: str
    switches: dict[str, SwitchStatus]   # by str(DPID)
    routed: int
    expected: int
    ready: bool                         # every switch of the topology routed
    multipath_bits: int
    pid: int
    active_bursts: list[str] = field(default_factory=list)
    bursts_done: int = 0
    scheduled: int = 0
    monitor_s: float = 0.0


@dataclass(frozen=True)
class RoundReply(Reply):
    """Sent once every burst the round event starts is on: the round then runs under it."""

    active_bursts: list[str]


@dataclass(frozen=True)
class BurstReply(Reply):
    id: str
    actual_start_ns: int
    requested_start_ns: int
    requested_end_ns: int | None = None


@dataclass(frozen=True)
class ScheduleReply(Reply):
    scheduled: int


# -- requests -------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    op: ClassVar[str]
    reply: ClassVar[type[Reply]]

    def to_dict(self) -> dict:
        return {"v": PROTOCOL_VERSION, "op": self.op, **_to_wire(self)}


@dataclass(frozen=True)
class StatusRequest(Request):
    """Switches connected and routed, bursts active and done: the fabric waits on ``ready``."""

    op: ClassVar[str] = "status"
    reply: ClassVar[type[Reply]] = StatusReply


def _arm(arm: str) -> None:
    if not NAME_RE.match(arm):
        raise ValueError(f"arm {arm!r} is not a plain name (letters, digits, '.', '_', '-')")


@dataclass(frozen=True)
class RoundRequest(Request):
    """A round of a unit (an arm trained with one seed) starts or ends (``t_ns``
    when it did; now if absent).

    The controller keeps its burst state per unit (arm, seed): each seed of
    an arm is hit by the whole schedule again, and its records go to that
    unit's directory. ``seed`` None: a client that trains no seeded unit.
    """

    op: ClassVar[str] = "round"
    reply: ClassVar[type[Reply]] = RoundReply
    event: str
    arm: str
    round: int
    t_ns: int | None = None
    seed: int | None = None

    def __post_init__(self):
        if self.event not in ("start", "end"):
            raise ValueError(f"event must be 'start' or 'end', got {self.event!r}")
        _arm(self.arm)
        if self.round < 0:
            raise ValueError(f"round must be >= 0, got {self.round}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class BurstRequest(Request):
    """A burst now, for ``duration_ms`` (``dblp-testbed burst``, the burst bench)."""

    op: ClassVar[str] = "burst"
    reply: ClassVar[type[Reply]] = BurstReply
    kind: str
    target: str
    duration_ms: float
    params: dict = field(default_factory=dict)
    id: str | None = None      # the controller names it m001, m002, ... if absent
    arm: str = "manual"        # its record goes to raw/ARM/bursts.jsonl

    def __post_init__(self):
        _arm(self.arm)
        self.burst(self.id or "m")

    def burst(self, default_id: str) -> BurstSpec:
        return BurstSpec(self.kind, self.target, self.params, duration_ms=self.duration_ms,
                         id=self.id or default_id)


@dataclass(frozen=True)
class ScheduleRequest(Request):
    """Replace the schedule (the burst bench drives round triggers with it)."""

    op: ClassVar[str] = "schedule"
    reply: ClassVar[type[Reply]] = ScheduleReply
    bursts: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.schedule()

    def schedule(self) -> BurstSchedule:
        return BurstSchedule.from_list(self.bursts)

    @classmethod
    def of(cls, schedule: BurstSchedule) -> ScheduleRequest:
        return cls(schedule.to_list())


REQUESTS: dict[str, type[Request]] = {r.op: r for r in (StatusRequest, RoundRequest, BurstRequest,
                                                         ScheduleRequest)}


def _load_line(line: bytes | str, what: str) -> dict:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{what} is not JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(obj).__name__}")
    if obj.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"{what} has protocol version {obj.get('v')!r:.20}; "
                            f"this side speaks {PROTOCOL_VERSION}")
    return obj


def parse_request(obj: dict) -> Request:
    """A request object (already JSON-decoded) checked against the declaration."""
    if obj.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"request has protocol version {obj.get('v')!r:.20}; "
                            f"this side speaks {PROTOCOL_VERSION}")
    op = obj.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise ProtocolError(f"unknown op {op!r:.40}; use {', '.join(REQUESTS)}")
    return _from_fields(REQUESTS[op], obj, op, skip=("v", "op"))


def parse_request_line(line: bytes | str) -> Request:
    return parse_request(_load_line(line, "request"))


def parse_reply_line(request: type[Request], line: bytes | str) -> Reply:
    obj = _load_line(line, "reply")
    ok = obj.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError(f"reply to {request.op} has no ok field")
    cls = request.reply if ok else ErrorReply
    return _from_fields(cls, obj, f"{request.op} reply", skip=("v", "ok"))


def encode(message: Request | Reply) -> bytes:
    return json.dumps(message.to_dict()).encode() + b"\n"


class ControlClient:
    """The one client of the control socket; connects on first use, keeps the connection.

    Why keep it: a fresh connection per request costs an accept and a thread
    start in the controller, milliseconds on a loaded 2-core machine.
    Transport failures raise ``OSError`` (``ConnectionError`` when the
    controller hangs up); a reply that breaks the declaration raises
    ``ProtocolError``; a refusal is an ``ErrorReply`` (``reply.ok`` false).
    """

    def __init__(self, path: str, timeout: float = 10.0):
        self.path, self.timeout = path, timeout
        self._sock: socket.socket | None = None
        self._rfile: typing.BinaryIO | None = None

    def connect(self) -> None:
        if self._sock is not None:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self._sock, self._rfile = s, s.makefile("rb")

    def send(self, request: Request) -> Reply:
        self.connect()
        assert self._sock is not None and self._rfile is not None
        self._sock.sendall(encode(request))
        line = self._rfile.readline(MAX_LINE + 1)
        if not line:
            raise ConnectionError(f"controller closed {self.path} without a reply")
        if not line.endswith(b"\n"):
            raise ProtocolError(f"reply to {request.op} longer than {MAX_LINE} bytes or cut short")
        return parse_reply_line(type(request), line)

    def request(self, obj: dict) -> dict:
        """A request written as its JSON object (version optional), the reply as one."""
        return self.send(parse_request({"v": PROTOCOL_VERSION, **obj})).to_dict()

    def close(self) -> None:
        rfile, sock = self._rfile, self._sock
        self._sock = self._rfile = None
        if rfile is not None:
            rfile.close()
        if sock is not None:
            sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
