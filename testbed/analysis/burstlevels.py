"""The burst speedup per loss level and per DBLP phase, beside the pass-count ratio of the bounds.

Why: the burst speedup the paper's claim is judged on (`intervals.burst_speedup`)
is one ratio of medians over every burst round of a pair. A run's bursts
differ in the two things that decide what a looser bound can buy:

- the loss the burst asked for: with loss p lasting through every pass, a
  bound P needs ceil(ln P / ln p) passes (`physics.passes`), so the pass
  count of 0.8 % against 40.8 % is 10/2 at 60 % and 46/9 at 90 %
  (5.0x and 5.1x: the paper's band, where each pass costs a fixed time);
- the phase DBLP was in when the burst hit: critical, DBLP runs at P_low,
  the static arm's own bound, and equals it by construction; relaxed, at
  P_high.

Pooled, a run whose bursts mostly meet DBLP critical says little about the
relaxed ones, where the claim can hold. So, for each DBLP arm against its
static partner (the claims' ``paper`` pairs), each requested loss level and
each phase, `section` gives:

- the speedup: per seed, the static arm's median latency over its burst
  rounds at that level and phase / DBLP's; their geometric mean and its
  Student t interval over the seeds (`intervals.over_seeds`, log scale): the
  seed is the unit, as for every per-seed figure;
- the bursts (distinct burst ids of the paired seeds) and seeds behind it;
- the pass-count ratio at that level: passes(static's bound, p) /
  passes(DBLP's bound in that phase, p), with the bounds read from the
  spec's transport section as the arms registry names them (the static arm's
  ``bound_from`` field, else ``p_static``; DBLP's ``p_low`` critical and
  ``p_high`` relaxed), never typed here.

A burst's level is the loss its line in the bursts table asked for
(``requested_loss``; a round two bursts hit takes the larger). Its phase is
DBLP's phase at the first of DBLP's rounds it hit (same seed, same burst id:
a run's schedule gives every arm the same bursts under the same ids), and
that phase labels the static arm's rounds under the same burst too; a
burst whose id DBLP's rounds do not carry (a schedule that names bursts per
arm) takes DBLP's phase at the same seed and round, as the phases table
does. The bursts behind a figure are DBLP's (distinct seed and burst id),
so bursts named per arm are not counted twice. A burst round a round-locked
burst's cap ended is counted (``capped``) and gives no speedup: the cap set it.

This module measures; the verdict on each row is `testbed.analysis.claims`'s,
by the burst claim's region and the rule of every per-seed figure, with one
more: a row with fewer than `MIN_BURSTS` bursts (or fewer seeds than the
claims' minimum) says "too few bursts/seeds" instead of a verdict.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from testbed import physics as phys
from testbed.analysis import intervals as iv

#: The fewest bursts a level and phase is judged on: fewer say "too few bursts/seeds".
MIN_BURSTS = 10
#: DBLP's phases, in the order a level's rows show them (the relaxed one is the claim's).
PHASES = ("relaxed", "critical")
#: A requested loss is kept to this many decimals (a level, not a float's noise).
LEVEL_DECIMALS = 4


def _ids(cell) -> list[str]:
    """The burst ids of a rounds table's ``burst_id`` cell (``;``-joined; empty: none)."""
    return [i for i in str(cell).split(";") if i] if isinstance(cell, str) else []


def _phase(cell) -> str | None:
    return cell if isinstance(cell, str) and cell in PHASES else None


def labelled(rounds: pd.DataFrame, bursts: pd.DataFrame | None, arm: str, base: str
             ) -> pd.DataFrame:
    """The burst rounds of ``arm`` and ``base``, one row each: arm, seed, latency_ms, capped,
    level (the requested loss, NaN: none recorded), phase (``arm``'s at that burst, None:
    unknown) and bursts (the (seed, id) of the bursts that hit it).

    ``rounds``: valid rows only (the caller leaves invalid units out). ValueError
    when the rounds carry no burst ids (a table from before the join kept them).
    """
    cols = ["arm", "seed", "latency_ms", "capped", "level", "phase", "bursts"]
    if rounds is None or not len(rounds):
        return pd.DataFrame(columns=cols)
    if "burst_id" not in rounds.columns:
        raise ValueError("the rounds table has no burst ids (burst_id): no burst is known by "
                         "its level or phase")
    hit = rounds[rounds["arm"].isin([arm, base]) & rounds["in_burst"].astype(bool)]
    asked: dict[tuple[str, int, str], float] = {}
    if bursts is not None and len(bursts):
        for a, s, i, p in zip(bursts["arm"], bursts["seed"], bursts["id"],
                              pd.to_numeric(bursts["requested_loss"], errors="coerce"),
                              strict=True):
            asked[(str(a), int(s), str(i))] = float(p)
    first: dict[tuple[int, str], str | None] = {}
    at_round: dict[tuple[int, int], str | None] = {}
    if "phase" in rounds.columns:
        mine = rounds[rounds["arm"] == arm].sort_values(["seed", "round"], kind="stable")
        for s, r, ids, ph, b in zip(mine["seed"], mine["round"], mine["burst_id"], mine["phase"],
                                    mine["in_burst"].astype(bool), strict=True):
            at_round[(int(s), int(r))] = _phase(ph)
            for i in _ids(ids) if b else ():
                first.setdefault((int(s), i), _phase(ph))
    rows = []
    capped = hit["burst_capped"].astype(bool) if "burst_capped" in hit.columns \
        else pd.Series(False, index=hit.index)
    for (a, s, r, lat, ids), cap in zip(hit[["arm", "seed", "round", "latency_ms", "burst_id"]]
                                        .itertuples(index=False, name=None), capped, strict=True):
        keys = [(int(s), i) for i in _ids(ids)]
        levels = [asked.get((str(a), k[0], k[1]), math.nan) for k in keys]
        levels = [x for x in levels if math.isfinite(x)]
        phase = next((first[k] for k in keys if first.get(k)), at_round.get((int(s), int(r))))
        rows.append({"arm": a, "seed": int(s), "latency_ms": float(lat), "capped": bool(cap),
                     "level": round(max(levels), LEVEL_DECIMALS) if levels else math.nan,
                     "phase": phase, "bursts": tuple(keys)})
    return pd.DataFrame(rows, columns=cols)


def _paired_seeds(lab: pd.DataFrame, arm: str, base: str) -> list[int]:
    """The seeds with burst rounds of both arms in ``lab``."""
    return sorted(set(lab.loc[lab["arm"] == arm, "seed"]) & set(lab.loc[lab["arm"] == base, "seed"]))


def _count_bursts(lab: pd.DataFrame, arm: str) -> int:
    """The distinct bursts (seed, id) that hit ``arm``'s rounds in ``lab``."""
    return len({k for keys in lab.loc[lab["arm"] == arm, "bursts"] for k in keys})


def pools(lab: pd.DataFrame, arm: str, base: str) -> dict:
    """What a pooled burst speedup of ``arm`` over ``base`` pools: the requested levels, the
    bursts that hit ``arm`` in each of its phases (``none``: an arm without phases), the bursts
    and the seeds, over the seeds both arms have burst rounds in."""
    seeds = _paired_seeds(lab, arm, base)
    lab = lab[lab["seed"].isin(seeds)]
    phases: dict[str, set] = {}
    own = lab[lab["arm"] == arm]
    for ph, keys in zip(own["phase"], own["bursts"], strict=True):
        phases.setdefault(ph if isinstance(ph, str) else "none", set()).update(keys)
    levels = sorted({float(x) for x in lab["level"] if math.isfinite(x)})
    return {"levels": levels, "phases": {p: len(phases[p]) for p in sorted(phases)},
            "bursts": _count_bursts(lab, arm), "seeds": len(seeds)}


def bounds(spec, arm: str, base: str) -> dict:
    """The loss bounds each side ran, from the spec's transport section as the arms registry
    names them: ``baseline`` (the static arm's ``bound_from`` field, else ``p_static``),
    ``critical`` and ``relaxed`` (DBLP's ``p_low`` and ``p_high``); None where the spec has none."""
    from testbed.config.arms import ARMS

    def field(name: str) -> float | None:
        try:
            v = spec["transport"][name]
        except (KeyError, TypeError, IndexError):
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        return float(v) if ok else None
    src = ARMS[base].bound_from if base in ARMS else None
    return {"baseline": field(src or "p_static"), "critical": field("p_low"),
            "relaxed": field("p_high")}


def pass_counts(bound_base: float | None, bound_arm: float | None, level: float
                ) -> tuple[list, float | None]:
    """([the baseline's passes, the arm's passes], their ratio) at loss ``level`` (`physics.passes`:
    ceil(ln P / ln p)); None where a bound is missing or a count is not finite."""
    if bound_base is None or bound_arm is None:
        return [None, None], None
    n = [phys.passes(bound_base, level), phys.passes(bound_arm, level)]
    if not all(math.isfinite(x) for x in n):
        return [None if not math.isfinite(x) else int(x) for x in n], None
    return [int(n[0]), int(n[1])], n[0] / n[1]


def _row(lab: pd.DataFrame, arm: str, base: str, level: float, phase: str, bnd: dict) -> dict:
    """One level and phase: its bursts, seeds, pass counts and the per-seed speedup interval."""
    at = lab[(lab["level"] == level) & (lab["phase"] == phase)]
    seeds = _paired_seeds(at, arm, base)
    at = at[at["seed"].isin(seeds)]
    passes, ratio = pass_counts(bnd["baseline"], bnd[phase], level)
    row = {"level": level, "phase": phase, "bursts": _count_bursts(at, arm), "seeds": len(seeds),
           "rounds": [int((at["arm"] == arm).sum()), int((at["arm"] == base).sum())],
           "capped": int(at["capped"].sum()), "bounds": [bnd["baseline"], bnd[phase]],
           "passes": passes, "pass_ratio": ratio, "interval": None, "reason": None}
    if row["capped"]:
        row["reason"] = (f"capped: {row['capped']} burst round(s) hit a round-locked burst's "
                         "cap, which set them: no speedup")
        return row
    if not seeds:
        row["reason"] = f"no seed has burst rounds of both {arm} and {base} at this level and phase"
        return row

    def groups(a: str) -> dict:
        return {s: g["latency_ms"].to_numpy(dtype=float)
                for s, g in at[at["arm"] == a].groupby("seed", sort=True)}
    try:
        ratios = iv.per_seed_ratio(groups(arm), groups(base), lambda x: float(np.median(x)),
                                   "burst rounds")
        row["interval"] = iv.over_seeds(ratios, method=iv.T_LOG_METHOD,
                                        n_samples=sum(row["rounds"])).to_dict()
    except ValueError as exc:
        row["reason"] = str(exc)
    return row


def pair_levels(rounds: pd.DataFrame, bursts: pd.DataFrame | None, spec, arm: str, base: str
                ) -> dict:
    """One pair's entry of summary.json's ``burst_levels``: its bounds, what a pooled figure
    pools, and one row per requested level and phase that a burst of the paired seeds met (levels
    ascending, relaxed before critical); ``reason`` says why there are no rows."""
    bnd = bounds(spec, arm, base)
    rows: list[dict] = []
    out = {"arm": arm, "baseline": base, "bounds": bnd, "pools": None, "rows": rows,
           "reason": None}
    try:
        lab = labelled(rounds, bursts, arm, base)
    except ValueError as exc:
        out["reason"] = str(exc)
        return out
    out["pools"] = pools(lab, arm, base)
    lab = lab[lab["seed"].isin(_paired_seeds(lab, arm, base))]
    known = lab[lab["level"].notna() & lab["phase"].notna()]
    for level in sorted({float(x) for x in known["level"]}):
        for phase in PHASES:
            if ((known["level"] == level) & (known["phase"] == phase)).any():
                rows.append(_row(known, arm, base, level, phase, bnd))
    if not rows:
        out["reason"] = ("no burst round of both arms with a requested loss level and a phase of "
                         f"{arm}" + ("" if len(lab) else " (no burst rounds in a seed both ran)"))
    return out
