"""The pipeline's tables stage: a `RawRun` -> pandas tables (rounds, bursts, evals).

A run trains every arm once per seed; one arm with one seed is a unit, whose
logs are under RUN/raw/<arm>/seed-<seed>/. Every table has a `seed` column
beside `arm`; the summary stage (`testbed.analysis.summary`) pools the valid
seeds of an arm into summary.json's per-arm figures.

A unit whose fidelity record (manifest ``units[].fidelity``) breaks one of
the emulator's invariants (`testbed.invariants`) is invalid: its rows stay in
the rounds and evals tables, marked (``valid`` False, ``invalid_reasons``),
and the summary and the claims leave it out of every per-arm figure,
speedup, interval and verdict (`invalid_units` says which units, `valid_rows`
keeps the others' rows).

Every number here is recomputed from RUN/raw/ (the JSON-line events that
`workloads.runlog.EVENTS` declares), so a report can always be regenerated;
the settings it is judged against (loss bounds, which arm is whose baseline)
come from RUN/spec.toml and the arms registry, never from the data. All
timestamps share one clock (the emulated hosts share the kernel), which is
what lets rounds be joined to burst windows exactly, by timestamps, with no
tolerance.

Definitions (also written into summary.json under "definitions"):
- A round's window is [min over workers of t_start_ns, max of t_end_ns].
- A round's latency is its communication time on the critical path: from the
  moment the last worker started communicating (t_end_ns - comm_s) until the
  last worker finished. The wait of an early worker for a slow worker's
  compute is not communication.
- A round is a burst round when its window and a burst's actual window (same
  unit: arm and seed) overlap by at least half of the shorter of the two: exact, by
  timestamps, and blind to the millisecond by which a round-triggered burst
  touches the end of the previous round (burst_touch records any overlap).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from testbed import physics as phys
from testbed.analysis import datasets
from testbed.analysis.arms import arm_mode, arm_transport
from testbed.analysis.raw import RawRun
from testbed.invariants import broken
from testbed.rundir import unit_records

# Transport stats summed over workers (counters); every other numeric stat is
# per-worker state (bound, phase norm, passes, fractions) and is reported as
# the maximum over workers. Identity fields are dropped.
SUM_STATS = ("bytes_sent", "chunks_sent", "chunks", "retransmitted", "payload_bytes",
             "packets_sent", "dropped")
SKIP_STATS = {"rank", "round"}


def requested_loss(kind: str, params: dict) -> float:
    """The drop probability a burst asked for: a loss burst's `p`; other kinds ask none."""
    p = params.get("p") if kind == "loss" else None
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1
    return float(p) if ok else math.nan


BURST_COLUMNS = datasets.BURSTS.names()


#: A round-locked burst whose actual window is within this of its cap lasted the whole cap.
CAP_SLACK_MS = 5.0


def burst_models(schedule) -> dict[str, tuple[str, float]]:
    """burst id -> (model, cap in ms), from the schedule the run recorded and ran
    (`RawRun.schedule`, read by `testbed.rundir.read_burst_schedule`)."""
    out = {}
    for b in schedule:
        if b.rounds is not None:
            out[b.id] = ("round-locked", float(b.max_ms) if b.max_ms is not None else math.nan)
        else:
            out[b.id] = ("fixed", math.nan)
    return out


def bursts_table(raw: RawRun) -> pd.DataFrame:
    rows = []
    models = burst_models(raw.schedule or [])
    for arm in raw.arms:
        # A burst may be logged twice (a failed start, then its end): the last line wins.
        last = {(b["seed"], b["id"]): b for b in raw.bursts[arm]}
        for b in last.values():
            rs, re_ = b["requested_start_ns"], b["requested_end_ns"]
            as_, ae = b["actual_start_ns"], b["actual_end_ns"]
            rows.append({
                "arm": arm, "seed": b["seed"], "id": b["id"], "kind": b["kind"],
                "target": b["target"], "trigger": b["trigger"],
                "round": b.get("round"),
                "requested_start_ns": rs, "requested_end_ns": re_,
                "actual_start_ns": as_, "actual_end_ns": ae,
                "requested_ms": (re_ - rs) / 1e6 if re_ is not None else math.nan,
                "actual_ms": (ae - as_) / 1e6 if as_ is not None and ae is not None else math.nan,
                "start_delay_ms": (as_ - rs) / 1e6 if as_ is not None else math.nan,
                "requested_loss": requested_loss(b["kind"], b["params"]),
                "dropped_packets": b["dropped_packets"],
                "seen_packets": b.get("seen_packets"),
                "received_packets": math.nan, "measured_loss": math.nan,
                "measured_loss_source": None, "rounds_hit": 0, "error": b.get("error"),
                "params": json.dumps(b["params"], sort_keys=True),
                **_cap(models.get(b["id"], ("manual", math.nan)), as_, ae),
            })
    df = pd.DataFrame(rows, columns=BURST_COLUMNS)
    # A missing value would turn a column of ns timestamps into float64, which
    # rounds them to 128 ns at today's epoch: keep them exact integers.
    for col in ("requested_start_ns", "requested_end_ns", "actual_start_ns", "actual_end_ns"):
        df[col] = pd.array([r[col] for r in rows], dtype="Int64")
    # The controller's loss rule counts what it saw and what it dropped: exact loss.
    d = pd.to_numeric(df["dropped_packets"], errors="coerce")
    n = pd.to_numeric(df["seen_packets"], errors="coerce")
    ok = d.notna() & n.notna() & (n > 0)
    df.loc[ok, "measured_loss"] = d[ok] / n[ok]
    df.loc[ok, "measured_loss_source"] = "controller counters"
    if len(df):
        df = df.sort_values(["arm", "seed", "actual_start_ns", "id"],
                            kind="stable").reset_index(drop=True)
    return df


def _cap(model: tuple[str, float], start_ns, end_ns) -> dict:
    name, cap = model
    lasted = (end_ns - start_ns) / 1e6 if start_ns is not None and end_ns is not None else math.nan
    capped = name == "round-locked" and math.isfinite(cap) and lasted >= cap - CAP_SLACK_MS
    return {"model": name, "cap_ms": cap, "capped": bool(capped)}


def _stat_columns(stats_list: list[dict], prefix: str) -> dict:
    keys = sorted({k for s in stats_list for k, v in s.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)} - SKIP_STATS)
    out = {}
    for k in keys:
        vals = [s[k] for s in stats_list if isinstance(s.get(k), (int, float))
                and not isinstance(s.get(k), bool)]
        if not vals:
            continue
        out[prefix + k] = sum(vals) if k in SUM_STATS else max(vals)
    return out


ROUND_COLUMNS = datasets.ROUND_BASE_COLUMNS


def rounds_table(raw: RawRun) -> pd.DataFrame:
    """One row per arm x seed x round: its window, critical-path latency and transport stats.

    Built once per report; `join_bursts` adds the burst columns when the
    bursts' losses are known (the captures may fill some in).
    """
    rows = []
    for arm, seed in raw.units:
        by_round: dict[int, list[dict]] = {}
        server: dict[int, dict] = {}
        for e in raw.unit_events(arm, seed):
            if e["event"] != "round":
                continue
            if e["role"] == "server":
                server[e["round"]] = e
            else:
                by_round.setdefault(e["round"], []).append(e)
        for rnd in sorted(by_round):
            ws = sorted(by_round[rnd], key=lambda e: e["rank"])
            t0 = min(w["t_start_ns"] for w in ws)
            t1 = max(w["t_end_ns"] for w in ws)
            comm = [float(w["comm_s"]) for w in ws]
            cstart = [w["t_end_ns"] - int(round(c * 1e9)) for w, c in zip(ws, comm, strict=True)]
            lat_ns = max(w["t_end_ns"] for w in ws) - max(cstart)
            losses = [w["loss"] for w in ws if w["loss"] is not None]
            lead = ws[0]
            row = {
                "arm": arm, "seed": seed, "transport": arm_transport(arm), "mode": arm_mode(arm),
                "round": rnd,
                "epoch": lead["epoch"], "workers": len(ws),
                "t_start_ns": t0, "t_end_ns": t1, "duration_ms": (t1 - t0) / 1e6,
                "latency_ms": lat_ns / 1e6,
                "comm_ms_max": max(comm) * 1e3, "comm_ms_min": min(comm) * 1e3,
                "compute_ms_max": max(float(w["compute_s"]) for w in ws) * 1e3,
                "bound": lead["bound"], "phase": lead["phase"],
                "loss": float(np.mean(losses)) if losses else math.nan,
            }
            row.update(_stat_columns([w["stats"] for w in ws], "stats_"))
            if rnd in server:
                row.update(_stat_columns([server[rnd]["stats"]], "server_stats_"))
            rows.append(row)
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=ROUND_COLUMNS)
    df["bound"] = pd.to_numeric(df["bound"], errors="coerce")
    df = mark_validity(df, invalid_units(raw))
    return df.sort_values(["arm", "seed", "round"], kind="stable").reset_index(drop=True)


def join_bursts(rounds: pd.DataFrame, bursts: pd.DataFrame) -> pd.DataFrame:
    """The rounds table with each round joined to its unit's burst windows by timestamps.

    A burst "hits" a round when their overlap is at least half of the
    shorter of the two windows; any overlap at all is kept as burst_touch.
    Why not any overlap: consecutive rounds' windows overlap by the optimizer
    step (a worker logs t_end after the next round's announcement), so a
    round-triggered burst touches the previous round by a millisecond
    without hitting it.
    """
    df = rounds.copy()
    in_burst, touch, ids, overlap, bloss, capped = [], [], [], [], [], []
    for r in df.itertuples(index=False):
        hits, touched = [], False
        if len(bursts):
            b = bursts[(bursts["arm"] == r.arm) & (bursts["seed"] == r.seed)
                       & bursts["actual_start_ns"].notna()
                       & bursts["actual_end_ns"].notna()]
            for bb in b.itertuples(index=False):
                bs, be = int(bb.actual_start_ns), int(bb.actual_end_ns)
                ov = min(r.t_end_ns, be) - max(r.t_start_ns, bs)
                if ov <= 0:
                    continue
                touched = True
                if 2 * ov >= min(r.t_end_ns - r.t_start_ns, be - bs):
                    hits.append((bb.id, ov, bb.measured_loss, bb.requested_loss,
                                 bool(getattr(bb, "capped", False))))
        in_burst.append(bool(hits))
        touch.append(touched)
        ids.append(";".join(h[0] for h in hits))
        overlap.append(sum(h[1] for h in hits) / 1e6)
        losses = [h[2] if math.isfinite(h[2]) else h[3] for h in hits]
        losses = [x for x in losses if math.isfinite(x)]
        bloss.append(max(losses) if losses else math.nan)
        capped.append(any(h[4] for h in hits))
    df["in_burst"] = pd.Series(in_burst, index=df.index, dtype=bool)
    df["burst_touch"] = pd.Series(touch, index=df.index, dtype=bool)
    df["burst_id"] = pd.Series(ids, index=df.index, dtype=object)
    df["burst_overlap_ms"] = pd.Series(overlap, index=df.index, dtype=float)
    df["burst_loss"] = pd.Series(bloss, index=df.index, dtype=float)
    df["burst_capped"] = pd.Series(capped, index=df.index, dtype=bool)
    return df


def join(rounds: pd.DataFrame, bursts: pd.DataFrame, inputs: phys.PhysicsInputs | None
         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rounds, bursts) joined: each round's bursts (`join_bursts`), each burst's rounds hit
    (`count_rounds_hit`), and each round's physical bound (`add_physics`)."""
    rounds = join_bursts(rounds, bursts)
    bursts = count_rounds_hit(bursts, rounds)
    return add_physics(rounds, inputs), bursts


def count_rounds_hit(bursts: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """Fill bursts.rounds_hit from the same exact join the rounds table used."""
    bursts = bursts.copy()
    if not len(bursts) or not len(rounds):
        return bursts
    hit: dict[tuple, int] = {}
    for r in rounds[rounds["in_burst"]].itertuples(index=False):
        for i in r.burst_id.split(";"):
            hit[(r.arm, r.seed, i)] = hit.get((r.arm, r.seed, i), 0) + 1
    bursts["rounds_hit"] = [hit.get(k, 0) for k in zip(bursts["arm"], bursts["seed"], bursts["id"],
                                                       strict=True)]
    return bursts


def evals_table(raw: RawRun, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per evaluation; t_s counts from its unit's first round (time to a metric)."""
    rows = []
    for arm, seed in raw.units:
        r = rounds[(rounds["arm"] == arm) & (rounds["seed"] == seed)] if len(rounds) else rounds
        t0 = int(r["t_start_ns"].min()) if len(r) else None
        for e in raw.unit_events(arm, seed):
            if e["event"] == "eval" and e["test_accuracy"] is not None:
                rows.append({"arm": arm, "seed": seed, "round": e["round"], "rank": e["rank"],
                             "t_s": (e["t_ns"] - t0) / 1e9 if t0 is not None else math.nan,
                             "test_accuracy": e["test_accuracy"], "test_loss": e["test_loss"]})
    df = mark_validity(pd.DataFrame(rows, columns=datasets.EVALS.names()), invalid_units(raw))
    return df.sort_values(["arm", "seed", "round", "rank"], kind="stable").reset_index(drop=True)


def add_physics(rounds: pd.DataFrame, inputs: phys.PhysicsInputs | None) -> pd.DataFrame:
    """Per-round bound (ms) and how far above it each round came."""
    rounds = rounds.copy()
    if inputs is None or not len(rounds):
        rounds["phys_loss"] = math.nan
        rounds["phys_bound_ms"] = math.nan
        rounds["latency_over_bound"] = math.nan
        return rounds
    losses, bounds = [], []
    for r in rounds.itertuples(index=False):
        if r.in_burst:
            p = r.burst_loss if math.isfinite(r.burst_loss) else (
                inputs.burst_loss if inputs.burst_loss is not None else math.nan)
        else:
            p = inputs.base_loss
        P = r.bound if r.bound is not None and math.isfinite(r.bound) else math.nan
        losses.append(p)
        # gloo's ring receives at rank 0 what a sharded rank 0 does: same bound, P = 0.
        mode = "sharded" if r.transport == "gloo" else (r.mode or "ps")
        burst_s = r.burst_overlap_ms / 1e3 if r.in_burst and math.isfinite(r.burst_overlap_ms) else None
        if not math.isfinite(p) or not math.isfinite(P) or r.transport == "local":
            bounds.append(math.nan)
        else:
            bounds.append(phys.round_bound_s(P, p, inputs, mode=mode, burst_s=burst_s) * 1e3)
    rounds["phys_loss"] = losses
    rounds["phys_bound_ms"] = bounds
    rounds["latency_over_bound"] = rounds["latency_ms"] / rounds["phys_bound_ms"]
    return rounds


def invalid_units(raw: RawRun) -> dict[tuple[str, int], list[str]]:
    """(arm, seed) -> the invariants its fidelity record breaks, for every invalid unit of the
    spec, in run order (`testbed.invariants.broken`: one reason a line).

    A unit with no fidelity record, or without some of its fields, is not
    judged on what it lacks: a failed unit is its status's business.
    """
    records = {(u["arm"], u["seed"]): u for u in unit_records(raw.manifest)}
    out = {}
    for arm, seed in raw.units:
        reasons = broken(records.get((arm, seed), {}).get("fidelity"))
        if reasons:
            out[(arm, seed)] = reasons
    return out


def mark_validity(df: pd.DataFrame, invalid: dict[tuple[str, int], list[str]]) -> pd.DataFrame:
    """A rounds or evals table with its unit's ``valid`` and ``invalid_reasons`` on every row."""
    df = df.copy()
    keys = [(a, int(s)) for a, s in zip(df["arm"], df["seed"], strict=True)]
    df["valid"] = pd.Series([k not in invalid for k in keys], index=df.index, dtype=bool)
    df["invalid_reasons"] = pd.Series(["; ".join(invalid.get(k, ())) for k in keys],
                                      index=df.index, dtype=object)
    return df


def valid_rows(df: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of valid units only (a table without ``valid``: all of it)."""
    if df is None or "valid" not in df.columns:
        return df
    return df[df["valid"].astype(bool)]
