"""The raw-log format: one declaration of every JSON-line event, and its writer.

Every process of a run appends JSON objects, one per line, to
``RUN/raw/<arm>/seed-<seed>/<role>.jsonl`` (`unit_dir`: one directory per
unit, an arm trained with one seed): the worker and server entry points through
``RunLog`` below, the controller its ``burst`` lines. ``EVENTS`` is the only
place the fields are written down, the way ``dblp.wire.HEADER_FIELDS``
declares datagrams: ``RunLog.write`` refuses an event that does not match it,
and the analysis reads every line through ``check_event``, so a reader never
guesses a field and a writer cannot add one silently.

The version of this format is ``SCHEMA_VERSION``; the run's manifest records
it (``raw_log_schema``), and the analysis refuses a run directory written
with a version it does not know. History:

* 1: first declared version: ``start``, ``round``, ``eval`` and ``end`` from
  the workloads, ``burst`` from the controller; the controller's
  ``port_stats`` lines (``PORT_STATS_FIELDS``, fabric-wide, not an arm's
  event) were declared later as the controller already wrote them.
* 4: ``round`` gains ``compute_cpu_s`` and ``comm_cpu_s`` (optional): the
  process's CPU seconds in the round's compute and in its exchange, so a
  run can say where its CPU went (the README's CPU budget).
* 5: ``start`` gains ``pid`` (optional): the process that writes the log. A
  fork server (``workloads.forkserver``) starts workers and servers, so their
  command lines no longer say which is which; the log does.
* 6: a worker's ``start`` gains ``data_sha256`` (optional, nullable): the
  pinned digest of the data set it trained on (`workloads.data`), so a
  summary says which data made its figures.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

SCHEMA_VERSION = 6
KNOWN_VERSIONS = frozenset({1, 2, 3, 4, 5, 6})

#: The directory of one unit's logs under RUN/raw/<arm>/: ``seed-<seed>``.
SEED_DIR_PREFIX = "seed-"


def unit_dir(raw_dir: str | os.PathLike, arm: str, seed: int) -> str:
    """RUN/raw/<arm>/seed-<seed>: where every log, capture and config of one unit goes.

    A unit is one arm trained with one seed. The layout is the same for one
    seed as for many, so no reader has two cases. The controller, which
    imports nothing of the workloads, keeps a copy (controllers.bursts
    `record_dir`) that a unit test holds equal to this one.
    """
    return os.path.join(os.fspath(raw_dir), arm, f"{SEED_DIR_PREFIX}{int(seed)}")


def seed_of_dir(name: str) -> int | None:
    """The seed of a unit directory's name (``seed-3`` -> 3); None for any other name."""
    digits = name[len(SEED_DIR_PREFIX):] if name.startswith(SEED_DIR_PREFIX) else ""
    return int(digits) if digits.isdigit() and str(int(digits)) == digits else None

# Value kinds a field can hold; bool is never a number here.
_KINDS = {
    "int": (int,),
    "num": (int, float),
    "str": (str,),
    "dict": (dict,),
    "list": (list,),
    "bool": (bool,),
}


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of an event: its kind, whether it must be there, whether it may be null."""

    name: str
    kind: str
    required: bool = True
    nullable: bool = False
    doc: str = ""


def _f(name, kind, doc, required=True, nullable=False) -> Field:
    return Field(name, kind, required, nullable, doc)


# Every line a workload writes starts with these.
_HEAD = (
    _f("event", "str", "event name, a key of EVENTS"),
    _f("arm", "str", "the arm's label (spec arm name)"),
    _f("role", "str", "worker | server"),
    _f("rank", "int", "worker rank; the server is rank N (the number of workers)"),
)
_START = (
    _f("model", "str", "model registry name"),
    _f("params", "int", "trainable parameters"),
    _f("grad_bytes", "int", "gradient bytes one worker sends per round"),
    _f("world_size", "int", "number of workers"),
    _f("seed", "int", "seed of model init, shards and batch order"),
    _f("t_ns", "int", "time.time_ns() at start"),
    _f("rounds", "int", "rounds to train or serve"),
    _f("pid", "int", "the process's PID (what stops it)", required=False),
)

# THE declaration of the raw-log events: event name -> fields.
EVENTS: dict[str, tuple[Field, ...]] = {
    "start": _HEAD + _START + (
        # worker only
        _f("lr", "num", "initial learning rate", required=False),
        _f("lr_schedule", "str", "constant | cosine", required=False),
        _f("batch_size", "int", "per-worker batch", required=False),
        _f("data_sha256", "str", "the data's SHA-256: a data set's pinned digest, or of the "
           "bytes read (workloads.data.bytes_digest); null: the task does not say",
           required=False, nullable=True),
        # server only
        _f("port", "int", "UDP (and TCP) port the server listens on", required=False),
        _f("policy", "str", "loss-bound policy name", required=False),
        _f("knobs", "dict", "the policy's knobs", required=False),
        _f("control", "str", "control path: udp | tcp", required=False),
        _f("missing", "str", "missing-chunk policy", required=False),
        _f("rate_bps", "num", "pacing rate, bit/s", required=False, nullable=True),
        _f("transport", "dict", "every transport setting (dblp.TransportConfig.public_dict: "
           "the secret left out)", required=False),
    ),
    "round": _HEAD + (
        _f("round", "int", "training round, from 0"),
        _f("epoch", "int", "epoch the round belongs to"),
        _f("t_start_ns", "int", "time.time_ns() when the round started"),
        _f("t_end_ns", "int", "time.time_ns() when the round ended"),
        _f("compute_s", "num", "forward, backward and optimizer step, seconds"),
        _f("comm_s", "num", "gradient exchange, seconds (ends at t_end_ns minus the step)"),
        _f("compute_cpu_s", "num", "process CPU seconds in the compute (schema 4)", required=False),
        _f("comm_cpu_s", "num", "process CPU seconds in the exchange (schema 4)", required=False),
        _f("bound", "num", "loss bound the transport used (null: not a bounded transport)",
           nullable=True),
        _f("phase", "str", "critical | stable (null: no phase)", nullable=True),
        _f("loss", "num", "training loss (null on the server)", nullable=True),
        _f("stats", "dict", "the transport's counters for the round"),
    ),
    "eval": _HEAD + (
        _f("round", "int", "round after which the model was evaluated"),
        _f("epoch", "int", "epoch of that round"),
        _f("t_ns", "int", "time.time_ns() after the evaluation"),
        _f("test_accuracy", "num", "test accuracy, a fraction", nullable=True),
        _f("test_loss", "num", "test loss", nullable=True),
    ),
    "end": _HEAD + (
        _f("status", "str", "ok | error"),
        _f("train_time_s", "num", "training (worker) or serving (server) time, evaluation excluded"),
        _f("error", "str", "why the process stopped (status error)", required=False),
        _f("final_accuracy", "num", "last evaluation's accuracy (worker, status ok)",
           required=False, nullable=True),
        _f("final_loss", "num", "last evaluation's loss (worker, status ok)",
           required=False, nullable=True),
        _f("wall_s", "num", "process wall time (server, status ok)", required=False),
    ),
    # Written by the controller (controllers/bursts.py, BurstRecord.log_line)
    # into RUN/raw/<arm>/seed-<seed>/bursts.jsonl (a manual burst, which no
    # unit announced, into RUN/raw/<arm>/bursts.jsonl); the last line of an
    # id wins.
    "burst": (
        _f("event", "str", "burst"),
        _f("arm", "str", "the arm the burst hit"),
        _f("seed", "int", "seed of the unit the burst hit (absent: a manual burst)",
           required=False),
        _f("id", "str", "burst id, unique in the unit"),
        _f("kind", "str", "loss | police | congest"),
        _f("target", "str", "link the burst acts on, e.g. server-downlink"),
        _f("params", "dict", "the kind's knobs (loss: p, the drop probability)"),
        _f("trigger", "str", "round | time | manual"),
        _f("requested_start_ns", "int", "when the schedule asked for it"),
        _f("requested_end_ns", "int", "when it was asked to end", nullable=True),
        _f("actual_start_ns", "int", "when the mechanism was on", nullable=True),
        _f("actual_end_ns", "int", "when the mechanism was off", nullable=True),
        _f("dropped_packets", "int", "packets the mechanism dropped", nullable=True),
        _f("round", "int", "round that triggered it", required=False),
        _f("seen_packets", "int", "packets the loss rule saw", required=False),
        _f("error", "str", "why the burst failed", required=False),
        _f("detail", "dict", "mechanism details", required=False),
    ),
    # Written by the runner's bottleneck monitor (testbed/run/fidelity.py)
    # into RUN/raw/<arm>/seed-<seed>/queue.jsonl, one line per `tc -s qdisc` sample of
    # the switch port towards the server. The queue is the HTB root's
    # `pfifo limit N` child, the bounded drop-tail queue the links have.
    "queue": (
        _f("event", "str", "queue"),
        _f("arm", "str", "the arm during which the sample was taken"),
        _f("t_ns", "int", "time.time_ns() halfway through the tc call that read the sample"),
        _f("interface", "str", "the bottleneck interface (switch port towards the server)"),
    ) + tuple(_f(name, "int", doc) for name, doc in (
        ("backlog_bytes", "bytes waiting in the queue"),
        ("backlog_packets", "packets waiting in the queue"),
        ("dropped", "packets the queue dropped since it was set up (cumulative)"),
    )) + (
        _f("limit_packets", "int", "the queue's capacity (pfifo limit), null if tc shows none",
           nullable=True),
    ),
}


# Written by the controller's port monitor into RUN/raw/port_stats.jsonl: one
# line per switch and sampling period, from an OpenFlow port-stats reply.
# Not an arm's event (the fabric outlives the arms, so a line has no arm):
# readers place a sample in an arm by the manifest's arm windows. The
# counters are cumulative since the port came up, as OpenFlow reports them;
# they hold no queue length.
PORT_STATS_FIELDS = (
    _f("event", "str", "port_stats"),
    _f("t_ns", "int", "time.time_ns() when the switch's reply arrived"),
    _f("switch", "str", "switch name (its DPID in decimal if the switch is unknown)"),
    _f("dpid", "int", "OpenFlow datapath id"),
    _f("ports", "dict", "OpenFlow port number, as a string (a JSON key) -> PORT_COUNTER_FIELDS"),
)
PORT_COUNTER_FIELDS = tuple(_f(name, "int", doc) for name, doc in (
    ("rx_packets", "packets the port received"),
    ("tx_packets", "packets the port transmitted"),
    ("rx_bytes", "bytes the port received"),
    ("tx_bytes", "bytes the port transmitted"),
    ("rx_dropped", "received packets the switch dropped"),
    ("tx_dropped", "packets the switch dropped on transmit (not the link's qdisc drops)"),
    ("tx_errors", "transmit errors"),
))


class MalformedEvent(ValueError):
    """A record that does not match its declaration; the message says which field."""


def check_fields(obj, fields: tuple[Field, ...], where: str) -> dict:
    """Return ``obj`` if its fields are exactly ``fields``' (kinds, presence), else raise.

    Checks: a JSON object, every required field present, no undeclared
    field, every value of its declared kind (null only where declared
    nullable). ``where`` starts the message ("round event", "manifest").
    """
    if not isinstance(obj, dict):
        raise MalformedEvent(f"{where}: not a JSON object but {type(obj).__name__}")
    declared = {f.name for f in fields}
    extra = sorted(set(obj) - declared)
    if extra:
        raise MalformedEvent(f"{where}: undeclared field(s) {', '.join(map(str, extra))}")
    for f in fields:
        if f.name not in obj:
            if f.required:
                raise MalformedEvent(f"{where}: field '{f.name}' missing")
            continue
        v = obj[f.name]
        if v is None:
            if not f.nullable:
                raise MalformedEvent(f"{where}: field '{f.name}' is null")
            continue
        if (isinstance(v, bool) != (f.kind == "bool")) or not isinstance(v, _KINDS[f.kind]):
            raise MalformedEvent(f"{where}: field '{f.name}' must be {f.kind}, "
                                 f"got {type(v).__name__} {v!r:.40}")
    return obj


def check_event(obj) -> dict:
    """Return ``obj`` if it is a well-formed event of ``EVENTS``, else raise MalformedEvent."""
    name = obj.get("event") if isinstance(obj, dict) else None
    if name not in EVENTS:
        raise MalformedEvent(f"unknown event {name!r}" if isinstance(obj, dict)
                             else f"not a JSON object but {type(obj).__name__}")
    return check_fields(obj, EVENTS[name], f"{name} event")


def check_port_stats(obj) -> dict:
    """Return ``obj`` if it is a well-formed ``port_stats`` line, else raise MalformedEvent."""
    check_fields(obj, PORT_STATS_FIELDS, "port_stats line")
    if obj["event"] != "port_stats":
        raise MalformedEvent(f"port_stats line: event is {obj['event']!r}, not 'port_stats'")
    for port, counters in obj["ports"].items():
        if not port.isdigit():
            raise MalformedEvent(f"port_stats line: port {port!r} is not a port number")
        check_fields(counters, PORT_COUNTER_FIELDS, f"port_stats line port {port}")
    return obj


def _clean(v):
    """JSON has no NaN/inf: write them as null so every reader can parse the line."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class RunLog:
    """Appends events for one (arm, role, rank), each checked against ``EVENTS``.

    A writer that is no process of the training (the bottleneck monitor)
    passes no role and rank: its events declare neither.
    """

    def __init__(self, path: str | None, arm: str, role: str | None = None,
                 rank: int | None = None):
        self.arm, self.role, self.rank = arm, role, rank
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fh = open(path, "a", buffering=1)
        else:
            self._fh = sys.stdout
        self.path = path

    def write(self, event: str, **fields) -> dict:
        """Write one event; a field the declaration lacks is a bug and raises here."""
        head: dict[str, object] = {"event": event, "arm": self.arm}
        if self.role is not None:
            head.update(role=self.role, rank=self.rank)
        rec = _clean({**head, **fields})
        check_event(rec)
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        return rec

    def close(self) -> None:
        if self._fh is not sys.stdout:
            self._fh.close()
