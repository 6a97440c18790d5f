"""The pipeline's tables stage: a `RawRun` -> pandas tables (rounds, bursts) and the summary.

A run trains every arm once per seed; one arm with one seed is a unit, whose
logs are under RUN/raw/<arm>/seed-<seed>/. Every table has a `seed` column
beside `arm`; the per-arm figures of summary.json pool the valid seeds of an
arm (`summarize`), and `unit_summary` keeps the per-seed figures for intervals.

A unit whose fidelity record (manifest ``units[].fidelity``) breaks one of
the emulator's invariants (`testbed.invariants`) is invalid: its rows stay in
the rounds and evals tables, marked (``valid`` False, ``invalid_reasons``),
and it is left out of every per-arm figure, speedup, interval and verdict,
so the summary's medians are those the verdicts rest on; summary.json lists
it under ``invalid_units``.

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
- Speedup of arm A against baseline B = B's figure / A's figure (> 1: A is
  faster). Baselines are every arm whose transport is not dblp.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from testbed import physics as phys
from testbed.analysis import datasets
from testbed.analysis.arms import arm_mode, arm_transport, is_dblp_arm, static_partner
from testbed.analysis.claims import PAPER_FIGURES
from testbed.analysis.formats import SUMMARY_SCHEMA
from testbed.analysis.provenance import environment_of
from testbed.analysis.raw import RawRun
from testbed.invariants import broken
from testbed.rundir import unit_records

# A ratio of two medians whose quartile range spans more than this factor is
# flagged: its value depends on which rounds happened to be sampled.
SPREAD_WARN = 1.5
# Fewer burst rounds than this on either side make a burst-round ratio anecdotal.
MIN_SAMPLES = 3
# Transport stats summed over workers (counters); every other numeric stat is
# per-worker state (bound, phase norm, passes, fractions) and is reported as
# the maximum over workers. Identity fields are dropped.
SUM_STATS = ("bytes_sent", "chunks_sent", "chunks", "retransmitted", "payload_bytes",
             "packets_sent", "dropped")
SKIP_STATS = {"rank", "round"}

DEFINITIONS = {
    "round_window": "[min worker t_start_ns, max worker t_end_ns]",
    "latency": "critical-path communication time: max worker comm end - max worker comm start",
    "burst_round": "overlap of round window and burst actual window (same arm and seed) "
                   ">= half the shorter window",
    "seeds": "per-arm figures pool every valid seed of the arm: percentiles over the rounds of "
             "those seeds; train_time_s, final_accuracy and phase_switches are means over them "
             "(phase_switches rounded to a whole switch)",
    "invalid_unit": "an (arm, seed) whose manifest fidelity record breaks an invariant of "
                    "testbed.invariants.INVARIANTS; its rows stay in rounds and evals (valid "
                    "false) and it is left out of every per-arm figure, speedup, interval and "
                    "verdict (invalid_units lists it with its reasons)",
    "speedup": "baseline figure / arm figure (> 1: the arm is faster)",
    "baselines": "every arm whose transport is not dblp",
    "train_time_reduction_pct": "100 * (1 - arm train time / baseline train time)",
    "spread": "(q75 arm / q25 arm) * (q75 baseline / q25 baseline): the factor by which "
              "the ratio could move with other rounds; warned above " + f"{SPREAD_WARN:.2f}",
}


def phase_switches(rounds: pd.DataFrame) -> int:
    """How often one arm's phase changed from one logged round to the next.

    Rounds without a phase are skipped, not counted as a change: a missing
    event must not look like the detector flapping.
    """
    phases = [p for p in rounds.sort_values("round")["phase"] if isinstance(p, str) and p]
    return sum(a != b for a, b in zip(phases[:-1], phases[1:], strict=True))


def _q(values, q) -> float:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    return float(np.percentile(v, q)) if v.size else math.nan


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


# ---------------------------------------------------------------- summary --

def _finite(x):
    """JSON has no NaN: NaN/inf become null, numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _arm_status(evs: list[dict]) -> tuple[str, float]:
    workers = {e["rank"] for e in evs if e["role"] == "worker" and e["event"] in ("start", "round")}
    ends = [e for e in evs if e["event"] == "end" and e["role"] == "worker"]
    train = [float(e["train_time_s"]) for e in ends]
    if any(e["status"] != "ok" for e in ends):
        status = "error"
    elif not workers:
        status = "no data"
    elif {e["rank"] for e in ends} >= workers:
        status = "ok"
    else:
        status = "incomplete"
    return status, (max(train) if train else math.nan)


def _final_accuracy(evs: list[dict]) -> float:
    ev = [e for e in evs if e["event"] == "eval" and e["test_accuracy"] is not None]
    if not ev:
        return math.nan
    last = max(e["round"] for e in ev)
    return float(np.mean([e["test_accuracy"] for e in ev if e["round"] == last]))


def _latencies(rounds: pd.DataFrame, burst: bool) -> np.ndarray:
    if not len(rounds):
        return np.array([])
    return rounds[rounds["in_burst"] == burst]["latency_ms"].to_numpy(dtype=float)


def _capped_rounds(rounds: pd.DataFrame) -> int:
    """Burst rounds of one arm that a round-locked burst's cap ended (bursts.capped)."""
    if "burst_capped" not in rounds.columns:
        return 0
    return int((rounds["in_burst"].astype(bool) & rounds["burst_capped"].astype(bool)).sum())


def _ratio(base: np.ndarray, arm: np.ndarray, what: str, pair: str) -> dict:
    """Median ratio base/arm with a quartile-based spread and its warning."""
    out = {"ratio": math.nan, "low": math.nan, "high": math.nan, "spread": math.nan,
           "n_arm": int(arm.size), "n_baseline": int(base.size), "warning": None}
    if not arm.size or not base.size:
        out["warning"] = f"{pair}: no {what} rounds on one side, no ratio"
        return out
    a25, a50, a75 = np.percentile(arm, [25, 50, 75])
    b25, b50, b75 = np.percentile(base, [25, 50, 75])
    out["ratio"] = b50 / a50 if a50 > 0 else math.nan
    out["low"] = b25 / a75 if a75 > 0 else math.nan
    out["high"] = b75 / a25 if a25 > 0 else math.nan
    out["spread"] = out["high"] / out["low"] if out["low"] and out["low"] > 0 else math.nan
    if min(arm.size, base.size) < MIN_SAMPLES:
        out["warning"] = (f"{pair}: {what} ratio from only {min(arm.size, base.size)} "
                          f"round(s) on one side; anecdotal")
    elif math.isfinite(out["spread"]) and out["spread"] > SPREAD_WARN:
        out["warning"] = (f"{pair}: {what} ratio {out['ratio']:.2f} has spread "
                          f"{out['spread']:.2f} (> {SPREAD_WARN}); too wide to trust")
    return out


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


def invalid_units_section(invalid: dict[tuple[str, int], list[str]]) -> list[dict]:
    """summary.json's ``invalid_units``: one entry per invalid unit, in run order."""
    return [{"arm": arm, "seed": seed, "reasons": list(reasons)}
            for (arm, seed), reasons in invalid.items()]


UNIT_COLUMNS = ["arm", "seed", "status", "valid", "rounds", "burst_rounds", "train_time_s",
                "final_accuracy", "phase_switches"]


def unit_summary(raw: RawRun, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per unit (arm, seed), in run order: the figures that exist once per
    training run rather than once per round, for `summarize` to pool and for
    intervals over seeds.

    status: ok | error | incomplete | no data (from the workers' end events).
    valid: the unit kept every invariant (`invalid_units`).
    train_time_s: the slowest worker's training time, else the unit's span of
    rounds. final_accuracy: the mean over workers of the last evaluation (a
    fraction). phase_switches: NaN for an arm without a phase.
    """
    rows = []
    invalid = invalid_units(raw)
    for arm, seed in raw.units:
        r = rounds[(rounds["arm"] == arm) & (rounds["seed"] == seed)] if len(rounds) else rounds
        evs = raw.unit_events(arm, seed)
        status, train = _arm_status(evs)
        if not math.isfinite(train) and len(r):
            train = (r["t_end_ns"].max() - r["t_start_ns"].min()) / 1e9
        rows.append({"arm": arm, "seed": seed, "status": status,
                     "valid": (arm, seed) not in invalid, "rounds": int(len(r)),
                     "burst_rounds": int(r["in_burst"].sum()) if "in_burst" in r else 0,
                     "train_time_s": float(train), "final_accuracy": _final_accuracy(evs),
                     "phase_switches": float(phase_switches(r)) if is_dblp_arm(arm)
                     else math.nan})
    return pd.DataFrame(rows, columns=UNIT_COLUMNS)


def _mean(values) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _pooled_status(statuses: list[str]) -> str:
    """An arm is ok when every seed is; else the first seed's trouble, in run order."""
    bad = [s for s in statuses if s != "ok"]
    return bad[0] if bad else ("ok" if statuses else "no data")


def unit_fidelity(manifest: dict, arm: str) -> dict:
    """arm's manifest unit records by seed (a string, a JSON key), arm/seed/status left out."""
    return {str(u["seed"]): {k: v for k, v in u.items() if k not in ("arm", "seed", "status")}
            for u in unit_records(manifest, arm)}


def packet_summary(table: pd.DataFrame | None, arms) -> dict:
    """arm -> direction -> capture counts (summed over rounds and flows)."""
    out: dict = {}
    if table is None:
        return out
    for arm in arms:
        t = table[table["arm"] == arm]
        if not len(t):
            continue
        out[arm] = {}
        for d, g in t.groupby("direction"):
            out[arm][d] = {c: float(g[c].sum(min_count=1)) if g[c].notna().any() else None
                           for c in ("sent_packets", "sent_bytes", "recv_packets", "retransmissions",
                                     "drops", "control_packets")}
    return out


def summarize(raw: RawRun, rounds: pd.DataFrame, bursts: pd.DataFrame,
              inputs: phys.PhysicsInputs | None, physics_missing: list[str],
              packets: pd.DataFrame | None = None, notes: list[str] = ()) -> dict:
    """summary.json (declared in testbed.analysis.formats) but for the claims' sections.

    `packets` is the per-round packet table (None: no captures read) and
    `notes` what reading the captures had to say. The intervals and the
    verdicts on the paper's claims are `testbed.analysis.claims`'s, which the
    pipeline's summary stage (`testbed.analysis.pipeline.summarize`) adds.
    """
    tr = raw.spec["transport"]
    arms, warnings = {}, list(raw.problems) + list(notes)
    units = unit_summary(raw, rounds)
    invalid = invalid_units(raw)
    warnings += [f"arm {a} seed {s}: invalid, left out of every figure, interval and verdict "
                 f"({'; '.join(why)})" for (a, s), why in invalid.items()]
    # From here on, every figure pools the valid units only (the verdicts' data).
    rounds = valid_rows(rounds)
    for arm in raw.arms:
        # Every valid seed's rounds pooled: the percentiles are over all of them.
        r = rounds[rounds["arm"] == arm]
        every = units[units["arm"] == arm]
        u = every[every["valid"].astype(bool)]
        lat = r["latency_ms"].to_numpy(dtype=float)
        burst = r[r["in_burst"]]["latency_ms"].to_numpy(dtype=float)
        normal = r[~r["in_burst"]]["latency_ms"].to_numpy(dtype=float)
        status, train = _pooled_status(list(every["status"])), _mean(u["train_time_s"])
        switches = _mean(u["phase_switches"])
        bb_p50 = _q(r[r["in_burst"]]["phys_bound_ms"].to_numpy(dtype=float), 50)
        nb_p50 = _q(r[~r["in_burst"]]["phys_bound_ms"].to_numpy(dtype=float), 50)
        burst_p50, normal_p50 = _q(burst, 50), _q(normal, 50)
        arms[arm] = {
            "transport": arm_transport(arm), "status": status,
            "rounds": int(len(r)), "burst_rounds": int(burst.size),
            "round_ms_p50": _q(lat, 50), "round_ms_p99": _q(lat, 99),
            "burst_round_ms_p50": burst_p50, "burst_round_ms_max": _q(burst, 100),
            "normal_round_ms_p50": normal_p50,
            "round_duration_ms_p50": _q(r["duration_ms"].to_numpy(dtype=float), 50),
            "train_time_s": train, "final_accuracy": _mean(u["final_accuracy"]),
            "bound_p50": _q(r["bound"].to_numpy(dtype=float), 50),
            "burst_round_bound_p50": _q(r[r["in_burst"]]["bound"].to_numpy(dtype=float), 50),
            "burst_round_phys_bound_ms_p50": bb_p50,
            "burst_round_over_phys_bound": burst_p50 / bb_p50 if bb_p50 and math.isfinite(bb_p50)
            else math.nan,
            "normal_round_phys_bound_ms_p50": nb_p50,
            "normal_round_over_phys_bound": normal_p50 / nb_p50
            if nb_p50 and math.isfinite(nb_p50) else math.nan,
            "bytes_per_round_p50": _q(r["stats_bytes_sent"].to_numpy(dtype=float), 50)
            if "stats_bytes_sent" in r else math.nan,
            # summary.json declares an int: the mean over seeds, rounded.
            "phase_switches": int(round(switches)) if math.isfinite(switches) else None,
            "relaxed_share": _relaxed_share(r), "comm_share": _comm_share(r),
        }
        if status != "ok":
            warnings.append(f"arm {arm}: status {status}")
        if len(raw.seeds) > 1:
            warnings += [f"arm {arm} seed {x.seed}: status {x.status}"
                         for x in every.itertuples(index=False) if x.status != "ok"]
    baselines = [a for a in raw.arms if not is_dblp_arm(a)]
    speedups = {}
    for arm in raw.arms:
        ra = rounds[rounds["arm"] == arm]
        for base in baselines:
            if base == arm:
                continue
            pair = f"{arm}_vs_{base}"
            rb = rounds[rounds["arm"] == base]
            br = _ratio(_latencies(rb, True), _latencies(ra, True), "burst-round", pair)
            n_capped = _capped_rounds(ra) + _capped_rounds(rb)
            if n_capped:
                # The cap, not the transports, set those rounds: never a speedup.
                br = {**br, "ratio": math.nan, "low": math.nan, "high": math.nan,
                      "spread": math.nan,
                      "warning": f"{pair}: burst-round ratio not reported: {n_capped} burst "
                                 "round(s) hit a round-locked burst's cap, which set them"}
            nr = _ratio(_latencies(rb, False), _latencies(ra, False), "normal-round", pair)
            ta, tb = arms[arm]["train_time_s"], arms[base]["train_time_s"]
            entry = {
                "arm": arm, "baseline": base,
                "burst_round": br["ratio"], "burst_round_low": br["low"],
                "burst_round_high": br["high"], "burst_round_spread": br["spread"],
                "burst_round_n": [br["n_arm"], br["n_baseline"]],
                "normal_round": nr["ratio"], "normal_round_spread": nr["spread"],
                "train_time": tb / ta if ta and math.isfinite(ta) and ta > 0 else math.nan,
                "train_time_reduction_pct": 100 * (1 - ta / tb) if tb and math.isfinite(tb) and tb > 0
                else math.nan,
                "accuracy_delta": arms[arm]["final_accuracy"] - arms[base]["final_accuracy"],
                "warnings": [w for w in (br["warning"], nr["warning"]) if w],
            }
            speedups[pair] = entry
            # The claims are DBLP's burst-round speedups; the other ratios are
            # context (normal rounds mix DBLP's two phases, so their spread is wide
            # by construction) and keep their warnings in their own entry.
            if is_dblp_arm(arm) and br["warning"]:
                warnings.append(br["warning"])
    measured = bursts["measured_loss"].to_numpy(dtype=float)
    req = bursts["requested_loss"].to_numpy(dtype=float)
    bsum = {
        "count": int(len(bursts)),
        "per_arm": {a: int((bursts["arm"] == a).sum()) for a in raw.arms},
        "rounds_hit": int(bursts["rounds_hit"].sum()),
        "requested_loss": _q(req, 50),
        "measured_loss": float(np.mean(measured[np.isfinite(measured)]))
        if np.isfinite(measured).any() else math.nan,
        "measured_loss_min": _q(measured, 0), "measured_loss_max": _q(measured, 100),
        "dropped_packets": int(np.nansum(pd.to_numeric(bursts["dropped_packets"], errors="coerce"))),
        "actual_ms_p50": _q(bursts["actual_ms"].to_numpy(dtype=float), 50),
        "start_delay_ms_p50": _q(bursts["start_delay_ms"].to_numpy(dtype=float), 50),
    }
    for a in raw.arms:
        if bsum["per_arm"][a] and arms[a]["burst_rounds"] == 0:
            warnings.append(f"arm {a}: {bsum['per_arm'][a]} burst(s) logged but no round overlaps one")
    physics = {"inputs": inputs.as_dict() if inputs else None,
               "missing_inputs": physics_missing, "pairs": {}}
    if physics_missing:
        warnings.append("physics bound not computed: missing " + ", ".join(physics_missing)
                        + " (rtt_s: manifest rtt_ms, or `report --rtt-ms`)")
    partners = {arm: static_partner(arm, raw.arms) for arm in raw.arms if is_dblp_arm(arm)}
    for arm, static in partners.items():
        if static is None:
            continue
        # The bounds each arm was configured with (spec transport section):
        # the static arm's P, and DBLP's relaxed P_high.
        p_static, p_high = float(tr["p_static"]), float(tr["p_high"])
        s = speedups[f"{arm}_vs_{static}"]["burst_round"]
        pl = phys.place_speedup(s, p_static, p_high)
        # The same ratio over only the burst rounds DBLP met in its relaxed
        # phase (bound above its critical P_low): what the phase-aware bound itself buys.
        rd = rounds[(rounds["arm"] == arm) & rounds["in_burst"] & (rounds["bound"] > tr["p_low"])]
        rs = rounds[(rounds["arm"] == static) & rounds["in_burst"]]
        relaxed = _ratio(rs["latency_ms"].to_numpy(dtype=float),
                         rd["latency_ms"].to_numpy(dtype=float), "relaxed burst-round",
                         f"{arm}_vs_{static}")
        pl["speedup_relaxed_rounds"] = relaxed["ratio"]
        pl["relaxed_rounds"] = relaxed["n_arm"]
        physics["pairs"][f"{arm}_vs_{static}"] = pl
    # Per arm, its units' manifest records by seed (the invariants judge their fidelity).
    fidelity = {a: unit_fidelity(raw.manifest, a) for a in raw.arms}
    ok = [a for a in raw.arms if arms[a]["status"] == "ok"]
    status = "ok" if raw.arms and len(ok) == len(raw.arms) else ("partial" if ok else "failed")
    summary = _finite({
        "schema": SUMMARY_SCHEMA,
        "status": status,
        "name": raw.spec.name,
        "arms_order": raw.arms,
        "arms": arms,
        "baselines": baselines,
        "speedups": speedups,
        "bursts": bsum,
        "physics": physics,
        "packets": packet_summary(packets, raw.arms),
        "fidelity": fidelity,
        "invalid_units": invalid_units_section(invalid),
        "paper": dict(PAPER_FIGURES),
        "targets": _targets(arms, speedups, physics, partners),
        "warnings": warnings,
        "definitions": DEFINITIONS,
        "data": raw.data,
        "environment": environment_of(raw.manifest),
    })
    return summary


def _relaxed_share(r: pd.DataFrame) -> float | None:
    """Share of the rounds a phase-aware bound ran relaxed; None for an arm without phases.

    Why beside every verdict: a phase-aware bound can only save time in its
    relaxed rounds, so the training-time cut is about this share times the
    saving per relaxed round; a run that ends soon after the detector relaxes
    measures its horizon, not the transport.
    """
    ph = r["phase"].dropna() if "phase" in r.columns else pd.Series(dtype=object)
    ph = ph[ph.isin(["critical", "relaxed"])]
    return float((ph == "relaxed").mean()) if len(ph) else None


def _comm_share(r: pd.DataFrame) -> float | None:
    """The rounds' exchange time over their windows (the slowest worker's), summed: how much
    of training the transport can change at all."""
    if "comm_ms_max" not in r.columns or not len(r):
        return None
    comm = pd.to_numeric(r["comm_ms_max"], errors="coerce")
    dur = pd.to_numeric(r["duration_ms"], errors="coerce")
    ok = comm.notna() & dur.notna()
    total = float(dur[ok].sum())
    return float(comm[ok].sum()) / total if total > 0 else None


# The default run's acceptance figures.
BOUND_FACTOR_TARGET = 1.5
ACCURACY_POINTS_TARGET = 1.0


def _met(value, ok):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else bool(ok)


def _targets(arms: dict, speedups: dict, physics: dict, partners: dict) -> list[dict]:
    """The run's figures against the default run's targets: met True/False, None when not measurable."""
    out = []
    for arm, a in arms.items():
        if a["transport"] in ("static", "dblp"):
            v = a["burst_round_over_phys_bound"]
            out.append({"target": f"{arm}: burst-round p50 within {BOUND_FACTOR_TARGET}x of its bound",
                        "value": v, "met": _met(v, v <= BOUND_FACTOR_TARGET)})
    for arm, static in partners.items():
        if static is not None:
            pair = physics["pairs"].get(f"{arm}_vs_{static}") or {}
            need = pair.get("bandwidth_ratio", math.nan)
            v = speedups[f"{arm}_vs_{static}"]["burst_round"]
            out.append({"target": f"{arm} vs {static}: burst-round speedup >= bandwidth-bound "
                                  f"ratio {need:.2f}x", "value": v,
                        "met": _met(v * need, math.isfinite(need) and v >= need)})
            v = speedups[f"{arm}_vs_{static}"]["train_time"]
            out.append({"target": f"{arm} vs {static}: shorter end-to-end training", "value": v,
                        "met": _met(v, v > 1)})
            # Accuracies are fractions (the raw-log declaration): points = 100 x.
            v = (arms[arm]["final_accuracy"] - arms[static]["final_accuracy"]) * 100.0
            out.append({"target": f"{arm} vs {static}: final accuracy within "
                                  f"{ACCURACY_POINTS_TARGET:g} point", "value": v,
                        "met": _met(v, abs(v) <= ACCURACY_POINTS_TARGET + 1e-9)})
        for base in arms:
            if arms[base]["transport"] == "gloo":
                v = speedups[f"{arm}_vs_{base}"]["burst_round"]
                out.append({"target": f"{arm} vs {base}: lower burst-round p50", "value": v,
                            "met": _met(v, v > 1)})
    return out
