"""The derived tables of a run directory, declared once: columns, kinds, files, version.

Every table the analysis derives from raw/ is written as Parquet (typed,
fast, what `load_run` and notebooks read) and, where it stays small, as CSV
beside it (for spreadsheets and grep). Both are written from one conformed
frame by `write`, so they hold the same values; this module is the only place
their columns are written down, the way `workloads.runlog.EVENTS` declares
the raw logs. The builders (tables.py, packets.py, bottleneck.py) take their
column lists from here, `write` refuses a frame that does not match its
declaration (a bug, not a user error), and `read` refuses a file of a
version it does not know with one line.

The version, ``TABLES_SCHEMA``, is stored in each Parquet file's key-value
metadata (key ``dblp_testbed``: ``{"table": NAME, "schema": N}``), so a
Parquet file describes itself wherever it is copied. History:

* 1: first declared version. The per-round packet counts, formerly
  ``packets.csv``, are ``flows.csv``/``flows.parquet``; ``packets.parquet``
  is now every captured packet (formerly computed and dropped);
  ``bottleneck`` and ``evals`` are new; integer columns (timestamps in ns
  among them) stay integers where a value may be missing.
* 2: ``queue`` is new: the bottleneck queue's occupancy per sample (raw-log
  schema 2's ``queue`` events). The other tables are unchanged, so their
  version-1 files are still read; a version-1 run directory has no
  ``queue`` file until `dblp-testbed report DIR` rebuilds it (empty).
* 3: repeated seeds: every table has an int ``seed`` column right after
  ``arm`` (the seed of the unit, raw/<arm>/seed-<seed>/, a row belongs to;
  missing only in ``bottleneck`` rows outside every unit). Files of
  versions 1 and 2 are refused: their run directories have the old raw/
  layout, which `dblp-testbed report` no longer reads either.
* 4: invariants decide: ``rounds`` and ``evals`` have ``valid`` (the row's
  unit kept every invariant of `testbed.invariants`) and
  ``invalid_reasons`` (what it broke). The other tables are unchanged, so
  their version-3 files are still read; a version-3 ``rounds`` or
  ``evals`` file is refused with the command that rebuilds it from raw/.

Kinds: ``int`` (pandas ``Int64``: missing is <NA>, nanosecond timestamps
stay exact), ``float`` (missing is NaN), ``str`` (pandas ``string``; an
empty string is written as missing, since CSV cannot tell them apart) and
``bool`` (never missing).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import pandas as pd

from testbed.errors import InputError

TABLES_SCHEMA = 4
KNOWN_TABLES_SCHEMAS = frozenset({3, 4})
META_KEY = b"dblp_testbed"

_DTYPES = {"int": "Int64", "float": "float64", "str": "string", "bool": "bool"}


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its name (a prefix, for a family), kind and meaning."""

    name: str
    kind: str
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class Table:
    """One derived table: fixed columns in order, then families of columns by prefix.

    A family stands for columns whose names depend on the run (the
    transport's counters, one column per counter it reports); they follow
    the fixed columns, sorted by name, all of the family's kind.
    """

    name: str
    doc: str
    columns: tuple[Column, ...]
    families: tuple[Column, ...] = ()
    csv: bool = True

    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def files(self) -> list[str]:
        return [f"{self.name}.parquet"] + ([f"{self.name}.csv"] if self.csv else [])

    def kind_of(self, column: str) -> str | None:
        for c in self.columns:
            if c.name == column:
                return c.kind
        for f in self.families:
            if column.startswith(f.name):
                return f.kind
        return None


def _cols(*spec: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in spec)


# Whether a row's unit counts (tables.invalid_units): rounds and evals carry it.
_VALIDITY = _cols(
    ("valid", "bool", "the unit kept every invariant (testbed.invariants); an invalid unit's rows "
                      "stay here, left out of every per-arm figure, interval and verdict"),
    ("invalid_reasons", "str", "the invariants the unit broke, '; '-separated (missing: valid)"),
)
_ROUND_BASE = _cols(
    ("arm", "str", "spec arm name"),
    ("seed", "int", "the unit's seed: its logs are raw/<arm>/seed-<seed>/"),
    ("transport", "str", "the arm's transport (arms registry)"),
    ("mode", "str", "ps | sharded for the dblp transports, else missing"),
    ("round", "int", "training round, from 0"),
    ("epoch", "int", "epoch of the round"),
    ("workers", "int", "workers that logged the round"),
    ("t_start_ns", "int", "round window start: first worker's start, time.time_ns()"),
    ("t_end_ns", "int", "round window end: last worker's end"),
    ("duration_ms", "float", "window length"),
    ("latency_ms", "float", "critical-path communication time (summary definitions)"),
    ("comm_ms_max", "float", "longest worker comm_s"),
    ("comm_ms_min", "float", "shortest worker comm_s"),
    ("compute_ms_max", "float", "longest worker compute_s"),
    ("bound", "float", "loss bound the transport used (missing: not bounded)"),
    ("phase", "str", "critical | relaxed (missing: no phase)"),
    ("loss", "float", "mean training loss over workers"),
) + _VALIDITY
_ROUND_BURSTS = _cols(
    ("in_burst", "bool", "a burst window covers at least half of the shorter window"),
    ("burst_touch", "bool", "a burst window overlaps the round at all"),
    ("burst_id", "str", "ids of the bursts that hit the round, ';'-separated"),
    ("burst_overlap_ms", "float", "overlap with the bursts that hit it"),
    ("burst_loss", "float", "largest measured (else requested) loss of those bursts"),
    ("burst_capped", "bool", "one of those bursts lasted its whole cap (bursts.capped)"),
)
_ROUND_PHYSICS = _cols(
    ("phys_loss", "float", "loss probability the physical bound assumes for the round"),
    ("phys_bound_ms", "float", "physical lower bound on the round's latency (physics.py)"),
    ("latency_over_bound", "float", "latency_ms / phys_bound_ms"),
)
# The columns rounds_table builds before the burst join and the physics.
ROUND_BASE_COLUMNS = [c.name for c in _ROUND_BASE]
ROUNDS = Table(
    "rounds", "one row per arm x seed x round: window, latency, bursts, physical bound",
    _ROUND_BASE + _ROUND_BURSTS + _ROUND_PHYSICS,
    families=_cols(("stats_", "float", "workers' transport counters: summed (counts) or max"),
                   ("server_stats_", "float", "the server's transport counters")))

BURSTS = Table("bursts", "one row per burst: requested vs actual window, measured loss", _cols(
    ("arm", "str", "arm the burst hit"),
    ("seed", "int", "the unit's seed: its logs are raw/<arm>/seed-<seed>/"),
    ("id", "str", "burst id, unique in the unit (arm, seed)"),
    ("kind", "str", "loss | police | congest"),
    ("target", "str", "link the burst acted on"),
    ("trigger", "str", "round | time | manual"),
    ("round", "int", "round that triggered it"),
    ("requested_start_ns", "int", "when the schedule asked for it"),
    ("requested_end_ns", "int", "when it was asked to end"),
    ("actual_start_ns", "int", "when the mechanism was on"),
    ("actual_end_ns", "int", "when the mechanism was off"),
    ("requested_ms", "float", "requested duration"),
    ("actual_ms", "float", "actual duration"),
    ("start_delay_ms", "float", "actual minus requested start"),
    ("requested_loss", "float", "drop probability asked for (loss bursts)"),
    ("dropped_packets", "int", "packets the mechanism dropped"),
    ("seen_packets", "int", "packets the loss rule saw"),
    ("received_packets", "int", "packets the target's capture received in the window"),
    ("measured_loss", "float", "dropped / seen, else dropped / (dropped + received)"),
    ("measured_loss_source", "str", "controller counters | capture"),
    ("rounds_hit", "int", "rounds whose window it hit"),
    ("error", "str", "why the burst failed"),
    ("params", "str", "the kind's knobs, JSON"),
    ("model", "str", "round-locked (on for its rounds, cut at cap_ms) | fixed (on for "
                     "requested_ms from its trigger, every arm alike) | manual (not in the schedule)"),
    ("cap_ms", "float", "a round-locked burst's cap (max_ms); NaN for the other models"),
    ("capped", "bool", "a round-locked burst that lasted its whole cap: the cap, not the round, "
                       "ended it, so the rounds it hit measure the cap"),
))

FLOWS = Table("flows", "packets per arm x seed x round x flow (src, dst) from the captures", _cols(
    ("arm", "str", "spec arm name"),
    ("seed", "int", "the unit's seed: its logs are raw/<arm>/seed-<seed>/"),
    ("round", "int", "logged round the packets belong to (packets.py)"),
    ("direction", "str", "push (to the server) | pull (from it) | peer"),
    ("src", "str", "sender IPv4 address"),
    ("dst", "str", "receiver IPv4 address"),
    ("src_host", "str", "capture role of the sender (missing: not captured)"),
    ("dst_host", "str", "capture role of the receiver (missing: not captured)"),
    ("sent_packets", "int", "packets the sender's capture shows sent"),
    ("sent_bytes", "int", "their IP bytes"),
    ("recv_packets", "int", "packets the receiver's capture shows received"),
    ("recv_bytes", "int", "their IP bytes"),
    ("retransmissions", "int", "data packets sent again (same flow, round, sequence)"),
    ("drops", "int", "sent - received, only when both ends were captured"),
    ("control_packets", "int", "sent packets that carry no gradient data"),
))

_CAPTURE = _cols(
    ("arm", "str", "spec arm name"),
    ("seed", "int", "the unit's seed: its logs are raw/<arm>/seed-<seed>/"),
    ("host", "str", "capture role (the pcap's name: server, worker0, ...)"),
    ("t_ns", "int", "capture timestamp, same clock as the logs"),
    ("src", "str", "IPv4 source"),
    ("dst", "str", "IPv4 destination"),
    ("sport", "int", "UDP/TCP source port"),
    ("dport", "int", "UDP/TCP destination port"),
    ("proto", "str", "dblp | udp | tcp | ip"),
    ("kind", "str", "DBLP message type (data, probe, ...), tcp or tcp-control"),
    ("ip_bytes", "int", "IP total length"),
    ("hdr_round", "int", "DBLP header's round counter (raw, not offset-corrected)"),
    ("seq", "int", "DBLP chunk index"),
    ("stream", "str", "DBLP session:sender rank:part:pull bit"),
    ("pass_no", "int", "DBLP data pass (0: first send, >0: repair)"),
    ("tcp_seq", "int", "TCP sequence number"),
    ("payload", "int", "L4 payload bytes"),
    ("is_data", "bool", "carries gradient bytes"),
)
# What read_pcap gives for one capture, before packets are assigned to rounds.
CAPTURE_COLUMNS = [c.name for c in _CAPTURE]
PACKETS = Table("packets", "every captured IPv4 packet, one row each",
                _CAPTURE + _cols(("round", "int", "logged round the packet belongs to")),
                csv=False)  # 10^5-10^6 rows in a run: Parquet only

BOTTLENECK = Table(
    "bottleneck",
    "port counters of the bottleneck (the switch port facing the server) per sample; "
    "these are rates and drops, NOT queue occupancy (the queue table)",
    _cols(
        ("arm", "str", "arm whose window [started_ns, ended_ns] holds the sample (else missing)"),
        ("seed", "int", "seed of that unit (else missing)"),
        ("t_ns", "int", "when the switch's reply arrived"),
        ("interval_s", "float", "time since the previous sample of this port"),
        ("switch", "str", "switch name"),
        ("dpid", "int", "OpenFlow datapath id"),
        ("port", "int", "OpenFlow port number (towards the server)"),
        ("tx_packets", "int", "cumulative, towards the server"),
        ("tx_bytes", "int", "cumulative, towards the server"),
        ("tx_dropped", "int", "cumulative drops by the switch (not the link's qdisc drops)"),
        ("tx_errors", "int", "cumulative"),
        ("rx_packets", "int", "cumulative, from the server"),
        ("rx_bytes", "int", "cumulative, from the server"),
        ("rx_dropped", "int", "cumulative"),
        ("d_tx_packets", "int", "tx_packets since the previous sample"),
        ("d_tx_bytes", "int", "tx_bytes since the previous sample"),
        ("d_tx_dropped", "int", "tx_dropped since the previous sample"),
        ("tx_mbps", "float", "mean transmit rate over the interval, Mbit/s"),
        ("shaped_mbps", "float", "the link's shaped rate (spec topology.bw_mbps)"),
    ))

QUEUE = Table(
    "queue",
    "the bottleneck queue's occupancy (its pfifo child under HTB) per `tc -s qdisc` sample, "
    "raw/<arm>/seed-<seed>/queue.jsonl",
    _cols(
        ("arm", "str", "arm during which the sample was taken"),
        ("seed", "int", "seed of the unit during which the sample was taken"),
        ("t_ns", "int", "time.time_ns() of the sample, the clock of the burst windows"),
        ("interface", "str", "the switch port towards the server"),
        ("backlog_packets", "int", "packets queued"),
        ("backlog_bytes", "int", "bytes queued"),
        ("limit_packets", "int", "the queue's capacity (missing: tc showed none)"),
        ("dropped", "int", "packets the queue dropped, cumulative since it was set up"),
        ("d_dropped", "int", "drops since the previous sample (missing: first sample or reset)"),
        ("burst_id", "str", "ids of the unit's bursts whose actual window holds t_ns, "
                            "';'-separated (missing: none)"),
    ))

EVALS = Table("evals", "test accuracy and loss per evaluation", _cols(
    ("arm", "str", "spec arm name"),
    ("seed", "int", "the unit's seed: its logs are raw/<arm>/seed-<seed>/"),
    ("round", "int", "round after which the model was evaluated"),
    ("rank", "int", "worker rank that evaluated"),
    ("t_s", "float", "seconds since the arm's first round started"),
    ("test_accuracy", "float", "a fraction"),
    ("test_loss", "float", ""),
) + _VALIDITY)

TABLES = {t.name: t for t in (ROUNDS, BURSTS, FLOWS, PACKETS, BOTTLENECK, QUEUE, EVALS)}


def files() -> list[str]:
    """Every file the tables are written to, in a fixed order."""
    return [f for t in TABLES.values() for f in t.files()]


class TableError(InputError):
    """A derived table is missing, not ours, or of a version this code does not know."""


def _check_columns(table: Table, columns, where: str) -> list[str]:
    """The columns in their declared order; a message naming the first mismatch otherwise."""
    cols = list(columns)
    missing = [c for c in table.names() if c not in cols]
    extra = sorted(c for c in cols if table.kind_of(c) is None)
    if missing or extra:
        what = (f"column(s) {', '.join(missing)} missing" if missing
                else f"undeclared column(s) {', '.join(extra)}")
        raise TableError(f"{where}: {what} (table {table.name!r}, schema {TABLES_SCHEMA})")
    return table.names() + sorted(c for c in cols if c not in table.names())


def _dtypes(table: Table, columns) -> dict:
    return {c: _DTYPES[table.kind_of(c) or "str"] for c in columns}


def conform(table: Table, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with exactly the declared columns, in order, of the declared kinds.

    A frame off its declaration is a bug in the builder: ValueError.
    """
    try:
        order = _check_columns(table, df.columns, f"bug: the {table.name} table")
    except TableError as exc:
        raise ValueError(str(exc)) from None
    out = df[order].copy()
    for col, dtype in _dtypes(table, order).items():
        s = out[col]
        if dtype == "Int64":
            s = pd.to_numeric(s, errors="raise").astype("Int64")
        elif dtype == "string":
            s = s.astype("string").replace("", pd.NA)
        out[col] = s.astype(dtype)
    return out.reset_index(drop=True)


def write(run_dir, table: Table, df: pd.DataFrame) -> pd.DataFrame:
    """The one writer of a table's files; returns the frame as written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run_dir = pathlib.Path(run_dir)
    df = conform(table, df)
    arrow = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(arrow.schema.metadata or {})
    meta[META_KEY] = json.dumps({"table": table.name, "schema": TABLES_SCHEMA}).encode()
    pq.write_table(arrow.replace_schema_metadata(meta), run_dir / f"{table.name}.parquet")
    if table.csv:
        df.to_csv(run_dir / f"{table.name}.csv", index=False)
    return df


def read(run_dir, table: Table) -> pd.DataFrame:
    """RUN/<table>.parquet, version and columns checked; TableError (one line) otherwise."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = pathlib.Path(run_dir) / f"{table.name}.parquet"
    if not path.exists():
        raise TableError(f"{path}: not found (run `dblp-testbed report DIR` to build it)")
    try:
        arrow = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TableError(f"{path}: not a readable Parquet file ({exc})") from None
    raw = (arrow.schema.metadata or {}).get(META_KEY)
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("table") != table.name:
        raise TableError(f"{path}: no dblp-testbed {table.name!r} table metadata; "
                         "rebuild it with `dblp-testbed report DIR`")
    v = meta.get("schema")
    if v in (1, 2) and not isinstance(v, bool):
        raise TableError(f"{path}: table schema version {v} is from before repeated seeds (no "
                         f"seed column); this dblp-testbed reads {TABLES_SCHEMA} and cannot "
                         "re-analyse that run directory: run its spec.toml again")
    if v == 3 and _VALIDITY[0].name in table.names():
        raise TableError(f"{path}: table schema version 3 is from before the invariants decided "
                         f"(no valid column); rebuild it with `dblp-testbed report DIR`")
    if v not in KNOWN_TABLES_SCHEMAS or isinstance(v, bool):
        raise TableError(f"{path}: table schema version {v!r} is unknown (this dblp-testbed "
                         f"reads {', '.join(map(str, sorted(KNOWN_TABLES_SCHEMAS)))}); "
                         "rebuild it with this version")
    df = arrow.to_pandas()
    _check_columns(table, df.columns, str(path))
    return df


def read_csv(run_dir, table: Table) -> pd.DataFrame:
    """RUN/<table>.csv with the declared kinds: the same frame as `read` gives.

    CSV carries no version: use it where Parquet cannot go, and `read`
    (or `load_run`) wherever the version matters.
    """
    if not table.csv:
        raise TableError(f"table {table.name!r} is written as Parquet only")
    path = pathlib.Path(run_dir) / f"{table.name}.csv"
    if not path.exists():
        raise TableError(f"{path}: not found (run `dblp-testbed report DIR` to build it)")
    head = pd.read_csv(path, nrows=0).columns
    _check_columns(table, head, str(path))
    return pd.read_csv(path, dtype=_dtypes(table, head))
