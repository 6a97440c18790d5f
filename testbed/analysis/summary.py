"""The pipeline's summary stage: the bundle of tables -> summary.json's figures (but the claims').

`summarize` takes the tables stage's bundle (`testbed.analysis.pipeline.Tables`)
and gives summary.json's content up to the claims: the per-arm figures, the
speedups between arms, the bursts, the physical bound's placing of each
speedup, and the run's status and warnings. The intervals and verdicts are
`testbed.analysis.claims`'s, which the pipeline adds after this stage.

The per-arm figures pool the valid seeds of an arm: percentiles over every
round of those seeds, means over their per-seed figures (`unit_summary`,
which keeps the per-seed figures for the intervals too). A unit that broke
one of the emulator's invariants (`testbed.analysis.tables.invalid_units`)
is left out of every figure here, so the summary's medians are those the
verdicts rest on; summary.json lists it under ``invalid_units``.

Definitions (also written into summary.json under "definitions", beside
the tables' own: round window, latency, burst round):
- Speedup of arm A against baseline B = B's figure / A's figure (> 1: A is
  faster). Baselines are every arm whose transport is not dblp.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from testbed import physics as phys
from testbed.analysis.arms import arm_transport, is_dblp_arm, static_partner
from testbed.analysis.claims import PAPER_FIGURES
from testbed.analysis.formats import SUMMARY_SCHEMA
from testbed.analysis.provenance import environment_of
from testbed.analysis.raw import RawRun
from testbed.analysis.tables import invalid_units, valid_rows
from testbed.rundir import unit_records

# A ratio of two medians whose quartile range spans more than this factor is
# flagged: its value depends on which rounds happened to be sampled.
SPREAD_WARN = 1.5
# Fewer burst rounds than this on either side make a burst-round ratio anecdotal.
MIN_SAMPLES = 3

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


def summarize(t) -> dict:
    """summary.json (declared in testbed.analysis.formats) but for the claims' sections.

    ``t`` is the tables stage's bundle (a `pipeline.Tables`): its ``flows``
    are the per-round packet table (None: no captures read) and its
    ``notes`` what reading the captures had to say. The intervals and the
    verdicts on the paper's claims are `testbed.analysis.claims`'s, which the
    pipeline's summary stage (`testbed.analysis.pipeline.summarize`) adds.
    """
    raw = t.raw
    units = unit_summary(raw, t.rounds)
    invalid = invalid_units(raw)
    warnings = list(raw.problems) + list(t.notes) + _invalid_warnings(invalid)
    # From here on, every figure pools the valid units only (the verdicts' data).
    rounds = valid_rows(t.rounds)
    arms = {}
    for arm in raw.arms:
        every = units[units["arm"] == arm]
        arms[arm] = _arm_figures(arm, rounds[rounds["arm"] == arm], every)
        warnings += _status_warnings(arm, arms[arm]["status"], every, len(raw.seeds) > 1)
    baselines = [a for a in raw.arms if not is_dblp_arm(a)]
    speedups, ratio_warnings = _speedups(raw.arms, baselines, rounds, arms)
    warnings += ratio_warnings
    bsum = _burst_figures(t.bursts, raw.arms)
    warnings += [f"arm {a}: {bsum['per_arm'][a]} burst(s) logged but no round overlaps one"
                 for a in raw.arms if bsum["per_arm"][a] and arms[a]["burst_rounds"] == 0]
    if t.physics_missing:
        warnings.append("physics bound not computed: missing " + ", ".join(t.physics_missing)
                        + " (rtt_s: manifest rtt_ms, or `report --rtt-ms`)")
    partners = {arm: static_partner(arm, raw.arms) for arm in raw.arms if is_dblp_arm(arm)}
    physics = _physics(raw.spec["transport"], rounds, speedups, partners, t.inputs,
                       t.physics_missing)
    return _finite({
        "schema": SUMMARY_SCHEMA,
        "status": _run_status(raw.arms, arms),
        "name": raw.spec.name,
        "arms_order": raw.arms,
        "arms": arms,
        "baselines": baselines,
        "speedups": speedups,
        "bursts": bsum,
        "physics": physics,
        "packets": packet_summary(t.flows, raw.arms),
        # Per arm, its units' manifest records by seed (the invariants judge their fidelity).
        "fidelity": {a: unit_fidelity(raw.manifest, a) for a in raw.arms},
        "invalid_units": invalid_units_section(invalid),
        "paper": dict(PAPER_FIGURES),
        "targets": _targets(arms, speedups, physics, partners),
        "warnings": warnings,
        "definitions": DEFINITIONS,
        "data": raw.data,
        "environment": environment_of(raw.manifest),
    })


def _invalid_warnings(invalid: dict[tuple[str, int], list[str]]) -> list[str]:
    """One warning per invalid unit, with the invariants it broke."""
    return [f"arm {a} seed {s}: invalid, left out of every figure, interval and verdict "
            f"({'; '.join(why)})" for (a, s), why in invalid.items()]


def _arm_figures(arm: str, r: pd.DataFrame, every: pd.DataFrame) -> dict:
    """summary.json's ``arms.<arm>``: the valid rounds ``r`` of every valid seed pooled (the
    percentiles are over all of them), the per-seed figures of its valid units (``every``:
    all its units) averaged, its status over all its units."""
    u = every[every["valid"].astype(bool)]
    lat = r["latency_ms"].to_numpy(dtype=float)
    burst = r[r["in_burst"]]["latency_ms"].to_numpy(dtype=float)
    normal = r[~r["in_burst"]]["latency_ms"].to_numpy(dtype=float)
    status, train = _pooled_status(list(every["status"])), _mean(u["train_time_s"])
    switches = _mean(u["phase_switches"])
    bb_p50 = _q(r[r["in_burst"]]["phys_bound_ms"].to_numpy(dtype=float), 50)
    nb_p50 = _q(r[~r["in_burst"]]["phys_bound_ms"].to_numpy(dtype=float), 50)
    burst_p50, normal_p50 = _q(burst, 50), _q(normal, 50)
    return {
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


def _status_warnings(arm: str, status: str, every: pd.DataFrame, seeds: bool) -> list[str]:
    """An arm's trouble: its pooled status, then (with several ``seeds``) each seed's."""
    out = [f"arm {arm}: status {status}"] if status != "ok" else []
    if seeds:
        out += [f"arm {arm} seed {x.seed}: status {x.status}"
                for x in every.itertuples(index=False) if x.status != "ok"]
    return out


def _speedups(order: list[str], baselines: list[str], rounds: pd.DataFrame,
              arms: dict) -> tuple[dict, list[str]]:
    """summary.json's ``speedups``, every arm against every other baseline arm (``ARM_vs_BASE``),
    and the warnings of DBLP's burst-round ratios.

    The claims are DBLP's burst-round speedups; the other ratios are context
    (normal rounds mix DBLP's two phases, so their spread is wide by
    construction) and keep their warnings in their own entry.
    """
    speedups, warnings = {}, []
    for arm in order:
        ra = rounds[rounds["arm"] == arm]
        for base in baselines:
            if base == arm:
                continue
            pair = f"{arm}_vs_{base}"
            speedups[pair], burst_warning = _speedup(arm, base, ra, rounds[rounds["arm"] == base],
                                                     arms)
            if is_dblp_arm(arm) and burst_warning:
                warnings.append(burst_warning)
    return speedups, warnings


def _speedup(arm: str, base: str, ra: pd.DataFrame, rb: pd.DataFrame,
             arms: dict) -> tuple[dict, str | None]:
    """One pair's entry (``arm``'s rounds ``ra`` against ``base``'s ``rb``) and the warning of its
    burst-round ratio."""
    pair = f"{arm}_vs_{base}"
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
    return entry, br["warning"]


def _burst_figures(bursts: pd.DataFrame, order: list[str]) -> dict:
    """summary.json's ``bursts``: how many, the rounds they hit, requested and measured loss."""
    measured = bursts["measured_loss"].to_numpy(dtype=float)
    req = bursts["requested_loss"].to_numpy(dtype=float)
    return {
        "count": int(len(bursts)),
        "per_arm": {a: int((bursts["arm"] == a).sum()) for a in order},
        "rounds_hit": int(bursts["rounds_hit"].sum()),
        "requested_loss": _q(req, 50),
        "measured_loss": float(np.mean(measured[np.isfinite(measured)]))
        if np.isfinite(measured).any() else math.nan,
        "measured_loss_min": _q(measured, 0), "measured_loss_max": _q(measured, 100),
        "dropped_packets": int(np.nansum(pd.to_numeric(bursts["dropped_packets"], errors="coerce"))),
        "actual_ms_p50": _q(bursts["actual_ms"].to_numpy(dtype=float), 50),
        "start_delay_ms_p50": _q(bursts["start_delay_ms"].to_numpy(dtype=float), 50),
    }


def _physics(tr, rounds: pd.DataFrame, speedups: dict, partners: dict,
             inputs: phys.PhysicsInputs | None, missing: list[str]) -> dict:
    """summary.json's ``physics``: the bound's inputs, and where each DBLP arm's burst-round
    speedup over its static partner stands between the two bounds (`physics.place_speedup`).

    ``tr``: the spec's transport section, the bounds each arm was configured with.
    """
    physics = {"inputs": inputs.as_dict() if inputs else None,
               "missing_inputs": missing, "pairs": {}}
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
    return physics


def _run_status(order: list[str], arms: dict) -> str:
    """ok when every arm is, partial when some are, failed when none is (or no arm ran)."""
    ok = [a for a in order if arms[a]["status"] == "ok"]
    return "ok" if order and len(ok) == len(order) else ("partial" if ok else "failed")


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
