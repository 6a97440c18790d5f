"""The paper's claims, declared once, and the verdicts a run's intervals give on them.

A claim is what the paper reports (its value or range), the comparison it is
about (which pairs of arms, found through the arms registry), the estimator
that measures it on this testbed (`testbed.analysis.intervals.ESTIMATORS`)
and the region of that estimator's values that counts as reproducing it.

The verdict rule, never read from a point estimate:

- **reproduced** when the whole 95 % interval lies inside the claim's region;
- **refuted** when the whole interval lies outside it;
- **unresolved** otherwise (the interval straddles an edge of the region),
  and when the interval could not be computed (the arms did not run, no
  burst rounds, ...), with the reason;
- **unresolved: too few seeds** for a figure with one value per seed
  (``Estimator.per_seed``: the training-time cut, time to target, the
  accuracy difference and the p99 and mean round latencies) that this many
  seeds cannot settle: one seed or seeds with no spread (no interval), or an
  interval that straddles an edge, or a decisive interval from fewer than
  `MIN_DECISIVE_SEEDS` seeds. The verdict's ``too_few_seeds`` says how
  many seeds there were and about how many would let an interval around the
  same point clear the nearest edge (`intervals.seeds_to_clear`, an
  estimate from the observed sd and Student's t);
- **not judged** when the emulator did not keep its invariants: every seed
  of the pair has an invalid unit (`testbed.invariants`), so no measurement
  is left to judge. Never reproduced, refuted or unresolved: the machine,
  not the transports, would have set the figure.

Invalid units are left out before anything is measured: a seed takes part
in a pair's intervals only when both of its units are valid (the bootstrap
pairs by seed), and each verdict and interval lists the units it left out.

A claim is judged on every pair of arms its comparison finds among those
that ran (DBLP against the static bound of the same control path and mode:
dblp/static, dblp-tcp/static-tcp, dblp-sharded/static-sharded; a command arm,
a user's own transport, against every static arm at P_low): one verdict
per claim and pair, and one unresolved verdict, with no pair, for a claim
none of whose pairs ran. Pairs are not merged into one verdict: a claim can
hold with UDP control and fail with TCP, and that is the finding. The tail
and mean latency claims are judged against each baseline (``baselines``:
the paper's pairs, and each DBLP or command arm against gloo).

A claim the paper states without a number (the abstract's "tail-latency
collapse") is judged against `NO_FIGURE`, "> 1x": DBLP faster, the whole
interval above 1x; its source says that the paper gives no figure and that
"> 1x" is this testbed's reading.

The burst claim is also judged per requested loss level and per DBLP phase
(`burst_levels`, from `testbed.analysis.burstlevels`), beside each level's
pass-count ratio; a level with fewer than `burstlevels.MIN_BURSTS` bursts or
`MIN_DECISIVE_SEEDS` seeds is "too few bursts/seeds" (`TOO_FEW_BURSTS`). The
pooled verdict stays, and says what it pools (``pools``).

Besides the claims, `judge` measures the figures the paper has no number for
but a reader needs to place them (``COMPARISONS``): what the loose bound buys
(static at P_high against static at P_low), what phase-awareness buys (DBLP
against static at P_high, in accuracy above all) and how each sharded arm
fares against gloo's all-reduce (the like-for-like peer). Those are
reported as intervals, with no region and no verdict.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from testbed.analysis import burstlevels as bl
from testbed.analysis import intervals as iv
from testbed.analysis.arms import (
    arm_kind,
    is_command_arm,
    is_dblp_arm,
    is_reliable_arm,
    paper_baselines,
    static_partner,
)

REPRODUCED, REFUTED, UNRESOLVED = "reproduced", "refuted", "unresolved"
NOT_JUDGED = "not judged"
#: A burst level's verdict when it has fewer than `burstlevels.MIN_BURSTS` bursts or fewer than
#: `MIN_DECISIVE_SEEDS` seeds, and when a round-locked burst's cap set its rounds.
TOO_FEW_BURSTS, CAPPED = "too few bursts/seeds", "capped"
#: Why a verdict is not judged, in a word: every invariant is one the emulator
#: keeps only while the machine running it keeps up.
NOT_JUDGED_CAUSE = "emulator saturated"
#: The sections `judge` writes, which `rejudge` replaces.
JUDGED_SECTIONS = ("intervals", "verdicts", "time_to_target", "burst_levels")
#: How `with_verdicts`'s one-seed warning starts (a rejudged summary gets it afresh).
ONE_SEED_WARNING = "one seed per arm ("
# With no spec value, the target is this fraction of the converged accuracy of the
# reliable arms (gloo, dblp's reliable policy: no drop touched them), the mean of their
# final evaluations over seeds. Without a reliable arm, the lowest final accuracy over
# every arm and seed that ran stands in for it.
TARGET_FRACTION = 0.95
# A target within this much (accuracy, as a fraction) of the first evaluation measures
# nothing: every arm reaches it at once (a byte-level LM starts at 27 %, the most common
# byte, and ended the default run at 28 %). Then there is no target, and the reason says so.
TARGET_MIN_GAIN = 0.01
# The spec field (section, name) that sets the target; 0 or absent: derive it.
TARGET_FIELD = ("training", "target_accuracy")

#: The fewest seeds a figure with one value per seed is decided on. Why: at two seeds the
#: interval's width rests on one degree of freedom, so a narrow one is mostly luck. Student's
#: t covers 95 % on average at any count, but the narrowest tenth of two-seed intervals covers
#: 52 % of the time (three seeds: 62 %, with the interval about half as variable), in a
#: simulation of 200,000 normal pairs; and the coverage tests (test_intervals) check three
#: and five seeds. Fewer seeds than this: "unresolved: too few seeds", however narrow.
MIN_DECISIVE_SEEDS = 3

#: The paper's figure of a claim it states without a number (the abstract's "tail-latency
#: collapse"): DBLP faster than the baseline, i.e. a speedup whose whole interval lies above 1x.
#: Its source says so; a reader should not take it for a number the paper gives.
NO_FIGURE = "> 1x"

DEFINITIONS = {
    "interval": "the seed is the unit: the training-time cut (one cut per seed), time to "
                "target (one ratio per seed, on the log scale) and the accuracy difference (one "
                "difference per seed), the p99 and mean round latencies (one ratio per seed over "
                "all its rounds, log scale) and each burst level and phase (one ratio of medians "
                "per seed, log scale): 95 % Student t interval over the paired seeds; none from "
                "one seed or from equal values. The pooled burst speedup (a ratio of medians over every "
                "seed's burst rounds): 95 % percentile bootstrap interval, hierarchical: seeds "
                "with replacement, then rounds within each drawn seed (one seed: a round "
                f"bootstrap, blind to seed-to-seed spread); {iv.RESAMPLES} replicates, numpy rng "
                f"seed {iv.RNG_SEED}",
    "verdict": "reproduced: the whole 95 % interval inside the claim's region; refuted: the whole "
               "interval outside it; unresolved: otherwise, or no interval (the reason says why); "
               "unresolved, too few seeds: a figure with one value per seed that these seeds "
               f"cannot settle, or settle on fewer than {MIN_DECISIVE_SEEDS} seeds "
               "(too_few_seeds: the seeds, and an estimate of how many would); "
               f"not judged ({NOT_JUDGED_CAUSE}): every seed of the pair has an invalid unit",
    "left_out": "the pair's invalid units (summary invalid_units), left out of its intervals and "
                "verdicts: a seed takes part only when both of its units are valid",
    "source": "where each of the paper's figures in a verdict comes from: abstract, the abstract "
              "of arXiv 2605.01989v1; full text, a reading of the paper's full text, whose "
              "versions differ slightly (one gives 5.97x and 24.8 %); a claim with no figure "
              f"(\"tail-latency collapse\") is judged against {NO_FIGURE!r}: DBLP faster",
    "burst_levels": "each DBLP arm against its static partner, per requested loss level (the "
                    "bursts table's requested_loss) and per DBLP phase at the burst: the speedup "
                    "(per seed, the baseline's median burst-round latency / DBLP's; geometric "
                    "mean, Student t over the seeds), the bursts and seeds behind it, and the "
                    "pass-count ratio ceil(ln P_baseline / ln p) / ceil(ln P_dblp / ln p), the "
                    "bounds from the spec's transport section; judged by the burst claim's "
                    f"region, except {TOO_FEW_BURSTS!r} below {bl.MIN_BURSTS} bursts or "
                    f"{MIN_DECISIVE_SEEDS} seeds and {CAPPED!r} where a round-locked burst's cap "
                    "set the rounds",
    "pools": "what a pooled burst verdict pools: the requested loss levels, the bursts per phase "
             "of the arm (none: no phase), the bursts and the seeds",
    "time_to_target": "wall time from an (arm, seed)'s first round start to the end of the first "
                      "evaluated round whose test accuracy reaches the target",
    "target": f"spec {'.'.join(TARGET_FIELD)}; unset: {TARGET_FRACTION:.0%} of the reliable "
              "arms' converged accuracy (their mean final accuracy; without one, the lowest "
              "final accuracy of any arm), and none within "
              f"{100 * TARGET_MIN_GAIN:g} point of the first evaluation",
}


@dataclasses.dataclass(frozen=True)
class Region:
    """The values of a claim's estimator that reproduce it: [lo, hi], either end may be open."""

    lo: float = -math.inf
    hi: float = math.inf

    def to_list(self) -> list:
        """[lo, hi] with null for an unbounded end (JSON has no infinity)."""
        return [x if math.isfinite(x) else None for x in (self.lo, self.hi)]

    def text(self, unit: str) -> str:
        u = "" if unit == "x" else " "
        if not math.isfinite(self.hi):
            return f">= {self.lo:g}{u}{unit}"
        if not math.isfinite(self.lo):
            return f"<= {self.hi:g}{u}{unit}"
        return f"{self.lo:g} to {self.hi:g}{u}{unit}"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A kind of pair of arms: which arm is measured against which, found by the registry."""

    name: str
    what: str
    find: Callable[[Sequence[str]], list[tuple[str, str]]]

    def pairs(self, arms: Sequence[str]) -> list[tuple[str, str]]:
        return self.find(list(arms))


def _dblp_against_static(bound_from: str | None):
    def find(arms):
        return [(a, p) for a in arms if is_dblp_arm(a)
                for p in [static_partner(a, arms, bound_from)] if p is not None]
    return find


def _candidates_against_static(arms):
    """DBLP against its static partner, and each command arm (a user's transport, judged on
    the same claims) against every static arm at P_low that ran."""
    return _dblp_against_static(None)(arms) + [
        (a, s) for a in arms if is_command_arm(a) for s in paper_baselines(arms)]


def _loose_against_tight(arms):
    from testbed.config.arms import ARMS
    return [(a, p) for a in arms if arm_kind(a)[0] == "static" and ARMS[a].bound_from == "p_high"
            for p in [static_partner(a, arms)] if p is not None]


def _sharded_against_gloo(arms):
    """Each sharded arm (and each DDP arm over another c10d backend) against the gloo arm
    reached the same way (`Arm.gloo_peer`): flat against the flat loop, DDP against DDP."""
    from testbed.config.arms import ARMS, C10D
    return [(a, p.name) for a in arms if arm_kind(a)[2] == "sharded" or arm_kind(a)[0] == C10D
            for p in [ARMS[a].gloo_peer()] if p is not None and p.name in arms]


def _candidates_against_baselines(arms):
    """The paper's pairs (`_candidates_against_static`), then each DBLP or command arm against
    every gloo arm that ran: the baselines a user could run instead."""
    return _candidates_against_static(arms) + [
        (a, g) for a in arms if is_dblp_arm(a) or is_command_arm(a)
        for g in arms if arm_kind(g)[0] == "gloo"]


COMPARISONS: dict[str, Comparison] = {c.name: c for c in (
    Comparison("paper", "DBLP against the paper's baseline: the static bound at P_low "
               "(MLT-style), same control path and mode", _candidates_against_static),
    Comparison("loose_bound", "what the loose bound buys: the static bound at P_high against "
               "the static bound at P_low", _loose_against_tight),
    Comparison("phase_awareness", "what phase-awareness buys: DBLP against the static bound at "
               "its own P_high", _dblp_against_static("p_high")),
    Comparison("against_gloo", "like for like: each sharded arm against gloo's all-reduce",
               _sharded_against_gloo),
    Comparison("baselines", "DBLP against each baseline: the paper's (the static bound at "
               "P_low, same control path and mode) and gloo's all-reduce",
               _candidates_against_baselines),
)}


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of the paper: what it says, how this testbed measures it, what reproduces it."""

    name: str
    what: str
    paper: str
    comparison: str
    estimator: str
    region: Region
    region_why: str
    #: Where each figure in ``paper`` comes from (``DEFINITIONS["source"]``).
    source: str = ""


#: The paper's figures as numbers, written once (the claims below quote them in words, with
#: their sources): a summary's ``paper`` block and the report's comparisons read them here.
PAPER_FIGURES = {"burst_round_speedup_max": 5.88, "burst_round_speedup_range": [4.0, 5.9],
                 "train_time_reduction_pct_mean": 24.4, "train_time_reduction_pct_max": 33.9,
                 "accuracy_delta_points": 0.5}


CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("burst_speedup",
          "DBLP's single-round communication latency at burst rounds is lower than the "
          "baseline's by 4.0-5.9x across models (up to 5.88x)",
          "4.0-5.88x", "paper", "burst_speedup", Region(4.0),
          "at least the smallest speedup the paper reports for any model; a larger one does "
          "not contradict it",
          source="5.88x: abstract; 4.0-5.9x: full text"),
    Claim("train_time_cut",
          "DBLP cuts end-to-end training time against the baseline by 24.4 % on average (up to "
          "33.9 %; about 17 % without bursts)",
          "24.4 % mean, 33.9 % max, ~17 % without bursts", "paper", "train_time_cut",
          Region(17.0, 34.0),
          "from the cut the paper reports without bursts (its least) to its largest, 33.9 % "
          "rounded up: a cut outside it, either way, is a different result",
          source="24.4 %, 33.9 %: abstract; ~17 %: full text"),
    Claim("accuracy",
          "DBLP's final accuracy stays within about 0.5 points of the baseline's (worst case "
          "1.55 points, under 70 % bursts)",
          "within ~0.5 points (worst 1.55)", "paper", "accuracy_delta", Region(-0.5),
          "the claim is about what dropping gradients costs: losing at most 0.5 points "
          "reproduces it, a gain does not contradict it; the worst case, 1.55, is context",
          source="\"comparable\": abstract; 0.5, 1.55: full text"),
    Claim("tail_latency",
          "DBLP's tail round latency (the 99th percentile over every round) is lower than each "
          "baseline's: the abstract's \"tail-latency collapse\"",
          NO_FIGURE, "baselines", "round_p99_speedup", Region(1.0),
          "the paper gives no figure: DBLP faster (the whole interval at or above 1x) "
          "reproduces it, DBLP slower (the whole interval below 1x) refutes it",
          source="\"tail-latency collapse\": abstract, which gives no figure; > 1x (DBLP "
                 "faster): this testbed's reading"),
    Claim("mean_latency",
          "DBLP's mean round latency is lower than each baseline's, beside its tail (a tail "
          "bought with a slower mean would not be the collapse the abstract names)",
          NO_FIGURE, "baselines", "round_mean_speedup", Region(1.0),
          "the paper gives no figure: DBLP faster (the whole interval at or above 1x) "
          "reproduces it, DBLP slower (the whole interval below 1x) refutes it",
          source="no figure in the abstract or the full text's reading; > 1x (DBLP faster): "
                 "this testbed's reading of \"tail-latency collapse\" (abstract) for the mean"),
)}


def verdict(interval: iv.Interval | None, region: Region, why_none: str = "") -> tuple[str, str]:
    """(verdict, reason) for one interval against one region, by the module's rule."""
    if interval is None:
        return UNRESOLVED, why_none or "no interval"
    lo, hi = interval.lo, interval.hi
    span = f"95 % interval [{lo:.4g}, {hi:.4g}]"
    caveat = "; one seed: a round bootstrap, blind to seed-to-seed spread" \
        if interval.one_seed else ""
    if region.lo <= lo and hi <= region.hi:
        return REPRODUCED, f"the whole {span} lies inside the region{caveat}"
    if hi < region.lo or lo > region.hi:
        return REFUTED, f"the whole {span} lies outside the region{caveat}"
    edge = region.lo if lo < region.lo <= hi else region.hi
    return UNRESOLVED, f"the {span} straddles the region's edge at {edge:g}{caveat}"




def enough_seeds(interval: iv.Interval | None, verdict_reason: tuple[str, str]) -> tuple[str, str]:
    """A decisive verdict of a figure with one value per seed on fewer than
    `MIN_DECISIVE_SEEDS` seeds, turned unresolved (`too_few_seeds` then says how many)."""
    v, why = verdict_reason
    if v in (REPRODUCED, REFUTED) and interval is not None \
            and interval.n_seeds < MIN_DECISIVE_SEEDS:
        return UNRESOLVED, (f"{why}, but on {interval.n_seeds} seeds, fewer than the "
                            f"{MIN_DECISIVE_SEEDS} a decisive verdict needs")
    return v, why


def nearest_edge(point: float, region: Region) -> float | None:
    """The finite edge of ``region`` nearest ``point``: the one an interval around it clears last."""
    edges = [e for e in (region.lo, region.hi) if math.isfinite(e)]
    return min(edges, key=lambda e: abs(point - e)) if edges else None


def too_few_seeds(interval: iv.Interval | None, region: Region, verdict_reason: tuple[str, str],
                  n_short: int | None) -> tuple[str, dict] | None:
    """For a figure with one value per seed, an unresolved verdict that more seeds could settle:
    (reason, the verdict's ``too_few_seeds``: seeds, needed, edge); None otherwise.

    ``n_short``: the seeds when there was no interval for too few of them
    (`intervals.TooFewSeeds`). With an interval that straddles an edge, how
    many seeds would let one around the same point clear the nearest edge
    is `intervals.seeds_to_clear`'s estimate.
    """
    v, why = verdict_reason
    if v != UNRESOLVED:
        return None
    if interval is None:
        if n_short is None:
            return None
        return why, {"seeds": n_short, "needed": None, "edge": None}
    edge = nearest_edge(interval.point, region)
    if edge is None or interval.method not in iv.T_METHODS:   # a bootstrap's width is not a t's
        return None
    need = iv.seeds_to_clear(interval, edge)
    if need is not None:
        need = max(need, MIN_DECISIVE_SEEDS)
    n, sd = interval.n_seeds, iv.differences_sd(interval)
    scale = " (log scale)" if iv.T_METHODS[interval.method] else ""
    how = (f"about {need} seeds would let an interval around {interval.point:.3g} clear the "
           f"edge at {edge:g} (an estimate: the per-seed values' sd{scale}, {sd:.3g}, and the "
           "point held fixed, Student's t)" if need is not None else
           f"no number of seeds up to {iv.MAX_SEEDS} would let an interval around "
           f"{interval.point:.3g} clear the edge at {edge:g}")
    return f"too few seeds ({n}): {why}; {how}", {"seeds": n, "needed": need, "edge": edge}


def target_metric(spec, evals: pd.DataFrame | None) -> tuple[float | None, str]:
    """(target accuracy, where it came from): the spec's field, else derived from the run.

    Read defensively (``spec[section].get``): a spec without the field, or
    with 0 (unset), derives it: `TARGET_FRACTION` of the reliable arms'
    converged accuracy (their mean final accuracy), never a target within
    `TARGET_MIN_GAIN` of the first evaluation (None, and the reason).
    """
    section, name = TARGET_FIELD
    try:
        value = spec[section].get(name)
    except (KeyError, TypeError, AttributeError):
        value = None
    note = ""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
        if 0 < value <= 1:
            return float(value), f"spec {section}.{name}"
        note = f"spec {section}.{name} = {value!r} is not in (0, 1], ignored; "
    finals, firsts = [], []
    if evals is not None and len(evals):
        for arm in evals["arm"].unique():
            finals += [(v, arm, s) for s, v in iv.final_metric(evals, arm).items()]
            firsts += list(iv.first_metric(evals, arm).values())
    if not finals:
        return None, note + "no evaluations: no target"
    start = float(np.median(firsts))
    reliable = [v for v, arm, _ in finals if is_reliable_arm(arm)]
    if reliable:
        converged = float(np.mean(reliable))
        arms = sorted({arm for _, arm, _ in finals if is_reliable_arm(arm)})
        whose = (f"the reliable arms' converged accuracy {converged:.4f} ({', '.join(arms)}: "
                 f"mean final accuracy over {len(reliable)} unit(s))")
    else:
        converged, arm, seed = min(finals)
        whose = (f"the lowest final accuracy {converged:.4f} ({arm}, seed {seed}; no reliable "
                 "arm ran)")
    target = TARGET_FRACTION * converged
    if target < start + TARGET_MIN_GAIN:
        return None, (note + f"no target: {TARGET_FRACTION:.0%} of {whose} is {target:.4f}, "
                      f"within {100 * TARGET_MIN_GAIN:g} point of the first evaluation's "
                      f"{start:.4f}: the model learns too little for a time to target to "
                      "measure anything")
    return target, note + f"derived: {TARGET_FRACTION:.0%} of {whose}"


def _seeded(df: pd.DataFrame | None, seed: int) -> pd.DataFrame | None:
    """A table from before `run --seeds` has one seed: the spec's."""
    if df is None or "seed" in df.columns:
        return df
    return df.assign(seed=seed)


def _measure(frames: iv.RunFrames, arm: str, base: str, est: iv.Estimator,
             resamples: int, rng_seed: int) -> tuple[iv.Interval | None, str | None, int | None]:
    """(interval, why none, seeds when there were too few for one value per seed)."""
    try:
        return est(frames, arm, base, resamples=resamples, rng_seed=rng_seed), None, None
    except iv.TooFewSeeds as exc:
        return None, str(exc), exc.n_seeds
    except ValueError as exc:
        return None, str(exc), None


Invalid = Mapping[tuple[str, int], Sequence[str]]


def _without(df: pd.DataFrame | None, invalid: Invalid) -> pd.DataFrame | None:
    """``df`` without the rows of invalid units (and of rows marked ``valid`` False)."""
    if df is None or not len(df):
        return df
    keep = [(a, int(s)) not in invalid for a, s in zip(df["arm"], df["seed"], strict=True)]
    if "valid" in df.columns:
        keep = [k and bool(v) for k, v in zip(keep, df["valid"], strict=True)]
    return df[keep]


def left_out(invalid: Invalid, arm: str, base: str) -> list[dict]:
    """The invalid units of a pair, as summary.json lists them (arm, seed, reasons)."""
    return [{"arm": a, "seed": int(s), "reasons": list(why)} for (a, s), why in invalid.items()
            if a in (arm, base)]


def _judgeable(rounds: pd.DataFrame, arm: str, base: str) -> bool:
    """Some seed has valid rounds of both arms (``rounds``: valid rows only)."""
    if rounds is None or not len(rounds):
        return False
    seeds = [set(rounds.loc[rounds["arm"] == a, "seed"]) for a in (arm, base)]
    return bool(seeds[0] & seeds[1])


def not_judged_reason(units: list[dict]) -> str:
    """Why a pair is not judged: the cause in a word, then each invalid unit and what it broke."""
    named = "; ".join(f"{u['arm']} s{u['seed']}: {', '.join(u['reasons'])}" for u in units)
    return f"{NOT_JUDGED_CAUSE}: no seed with both units valid ({named})"


def _figures(frames: iv.RunFrames, arm: str, base: str, units: list[dict], judgeable: bool,
             resamples: int, rng_seed: int) -> dict:
    """Every estimator's interval for one pair; none, with the reason, when it is not judgeable.

    ``_short`` (dropped before the summary is written) keeps the seeds of a
    per-seed figure that had too few of them for an interval.
    """
    figures = {}
    for est in iv.ESTIMATORS.values():
        short = None
        if judgeable:
            interval, reason, short = _measure(frames, arm, base, est, resamples, rng_seed)
        else:
            interval, reason = None, not_judged_reason(units)
        figures[est.name] = {"estimator": est.name, "unit": est.unit,
                             "interval": interval.to_dict() if interval else None,
                             "reason": reason, "_short": short}
    return figures


def judge(spec, arms: Sequence[str], rounds: pd.DataFrame, evals: pd.DataFrame | None,
          invalid: Invalid | None = None, *, bursts: pd.DataFrame | None = None,
          resamples: int = iv.RESAMPLES, rng_seed: int = iv.RNG_SEED) -> dict:
    """summary.json's ``intervals``, ``verdicts``, ``time_to_target`` and ``burst_levels``
    sections (formats.py).

    ``invalid``: (arm, seed) -> reasons for the units that broke an invariant
    (`tables.invalid_units`); their rows are left out of everything here.
    ``bursts``: the bursts table, whose requested loss levels cut the burst
    rounds by level (`burstlevels`); None: no level is known.
    """
    seed = int(getattr(spec, "seed", 0))
    invalid = dict(invalid or {})
    rounds, evals = _seeded(rounds, seed), _seeded(evals, seed)
    rounds, evals = _without(rounds, invalid), _without(evals, invalid)
    bursts = _seeded(bursts, seed)
    target, source = target_metric(spec, evals)
    frames = iv.RunFrames(rounds, evals, target)
    found: dict[str, dict] = {}
    for comp in COMPARISONS.values():
        for arm, base in comp.pairs(arms):
            key = f"{arm}_vs_{base}"
            if key in found:
                continue
            units = left_out(invalid, arm, base)
            judgeable = not units or _judgeable(rounds, arm, base)
            found[key] = {"arm": arm, "baseline": base, "comparison": comp.name,
                          "what": comp.what, "left_out": units, "judged": judgeable,
                          "figures": _figures(frames, arm, base, units, judgeable, resamples,
                                              rng_seed)}
    verdicts = []
    for claim in CLAIMS.values():
        head = {"claim": claim.name, "what": claim.what, "paper": claim.paper,
                "source": claim.source,
                "comparison": claim.comparison, "estimator": claim.estimator,
                "unit": iv.ESTIMATORS[claim.estimator].unit, "region": claim.region.to_list(),
                "region_why": claim.region_why}
        pairs = COMPARISONS[claim.comparison].pairs(arms)
        for arm, base in pairs:
            pair = found[f"{arm}_vs_{base}"]
            fig = pair["figures"][claim.estimator]
            got = iv.Interval(**fig["interval"]) if fig["interval"] else None
            short = None
            if pair["judged"]:
                v, why = verdict(got, claim.region, fig["reason"] or "")
                if iv.ESTIMATORS[claim.estimator].per_seed:
                    v, why = enough_seeds(got, (v, why))
                    short = too_few_seeds(got, claim.region, (v, why), fig["_short"])
                    if short:
                        why = short[0]
                if pair["left_out"]:
                    why += f"; {len(pair['left_out'])} invalid unit(s) left out"
            else:
                v, why = NOT_JUDGED, fig["reason"]
            verdicts.append({**head, "pair": f"{arm}_vs_{base}", "arm": arm, "baseline": base,
                             "verdict": v, "reason": why,
                             "interval": dict(fig["interval"]) if fig["interval"] else None,
                             "left_out": pair["left_out"],
                             **({"too_few_seeds": short[1]} if short else {}),
                             **(_pools(claim, rounds, bursts, arm, base) if pair["judged"]
                                else {})})
        if not pairs:
            verdicts.append({**head, "pair": None, "arm": None, "baseline": None,
                             "verdict": UNRESOLVED, "interval": None, "left_out": [],
                             "reason": "no pair of arms for it ran ("
                                       f"{COMPARISONS[claim.comparison].what})"})
    for pair in found.values():
        del pair["judged"]   # said by its figures' reasons and its verdicts
        for fig in pair["figures"].values():
            del fig["_short"]  # said by the verdicts' too_few_seeds
    return {"intervals": found, "verdicts": verdicts,
            "time_to_target": _time_to_target(rounds, evals, target, source, arms),
            "burst_levels": burst_levels(spec, arms, rounds, bursts)}


def _pools(claim: Claim, rounds: pd.DataFrame, bursts: pd.DataFrame | None, arm: str,
           base: str) -> dict:
    """For the burst claim's verdict, what its pooled figure pools (``pools``: levels, bursts per
    phase, bursts, seeds; `burstlevels.pools`); nothing for the other claims."""
    if claim.estimator != "burst_speedup":
        return {}
    try:
        return {"pools": bl.pools(bl.labelled(rounds, bursts, arm, base), arm, base)}
    except ValueError:
        return {}   # no burst ids: the per-level section says so


def burst_levels(spec, arms: Sequence[str], rounds: pd.DataFrame,
                 bursts: pd.DataFrame | None) -> dict:
    """summary.json's ``burst_levels``: each DBLP arm against its static partner, the burst
    speedup per requested loss level and phase (`burstlevels.pair_levels`), each row judged.

    The region is the burst claim's; the rule that of every per-seed figure
    (`verdict`, `enough_seeds`, `too_few_seeds`), after two of the rows' own:
    a round-locked burst's cap set the rows' rounds (`CAPPED`), or fewer than
    `burstlevels.MIN_BURSTS` bursts or `MIN_DECISIVE_SEEDS` seeds stand
    behind it (`TOO_FEW_BURSTS`, whatever its interval). ``rounds``: valid rows only.
    """
    region = CLAIMS["burst_speedup"].region
    out = {}
    for arm, base in COMPARISONS["paper"].pairs(arms):
        if not is_dblp_arm(arm):
            continue    # a command arm has no phase to cut its bursts by
        entry = bl.pair_levels(rounds, bursts, spec, arm, base)
        for row in entry["rows"]:
            _judge_level(row, region)
        out[f"{arm}_vs_{base}"] = entry
    return out


def _judge_level(row: dict, region: Region) -> None:
    """``row``'s verdict and reason (and too_few_seeds, where more seeds could settle it)."""
    got = iv.Interval(**row["interval"]) if row["interval"] else None
    if row["capped"]:
        row["verdict"] = CAPPED
        return
    if row["bursts"] < bl.MIN_BURSTS or row["seeds"] < MIN_DECISIVE_SEEDS:
        row["verdict"] = TOO_FEW_BURSTS
        row["reason"] = (f"{row['bursts']} burst(s) over {row['seeds']} seed(s): a level and "
                         f"phase is judged on at least {bl.MIN_BURSTS} bursts and "
                         f"{MIN_DECISIVE_SEEDS} seeds")
        return
    v, why = enough_seeds(got, verdict(got, region, row["reason"] or ""))
    short = too_few_seeds(got, region, (v, why), None)
    if short:
        why, row["too_few_seeds"] = short
    row["verdict"], row["reason"] = v, why


def _time_to_target(rounds, evals, target, source, arms) -> dict:
    per_arm = {}
    table = iv.time_to_target(rounds, evals, target) if target is not None and len(rounds) else None
    for arm in arms:
        t = table[table["arm"] == arm] if table is not None else pd.DataFrame()
        reached = t[t["round"].notna()] if len(t) else t
        per_arm[arm] = {
            "runs": int(len(t)), "reached": int(len(reached)),
            "t_s_median": float(reached["t_s"].median()) if len(reached) else None,
            "t_s": {str(r.seed): (None if pd.isna(r.t_s) else float(r.t_s))
                    for r in t.itertuples(index=False)},
            "round": {str(r.seed): (None if pd.isna(r.round) else int(r.round))
                      for r in t.itertuples(index=False)}}
    return {"metric": "test_accuracy", "target": target, "source": source, "per_arm": per_arm}


def with_verdicts(summary: dict, spec, rounds: pd.DataFrame, evals: pd.DataFrame | None,
                  invalid: Invalid | None = None, **kw) -> dict:
    """``summary`` with the sections of `judge`, their definitions, each arm's median time
    to target (arms.<arm>.time_to_target_s) and a warning when the intervals have one seed.
    ``kw``: `judge`'s keywords (``bursts``, ``resamples``, ``rng_seed``)."""
    out = dict(summary, **judge(spec, summary["arms_order"], rounds, evals, invalid, **kw))
    out["definitions"] = {**summary["definitions"], **DEFINITIONS}
    per_arm = out["time_to_target"]["per_arm"]
    out["arms"] = {a: dict(v, time_to_target_s=per_arm.get(a, {}).get("t_s_median"))
                   for a, v in summary["arms"].items()}
    one = sorted({k for k, p in out["intervals"].items() for f in p["figures"].values()
                  if f["interval"] and f["interval"]["n_seeds"] == 1})
    if one:
        out["warnings"] = list(summary["warnings"]) + [
            f"{ONE_SEED_WARNING}{', '.join(one)}): the intervals are round bootstraps, blind to "
            "seed-to-seed spread, and per-seed figures have none; run more seeds (`run --seeds N`)"]
    return out



def rejudge(run_dir) -> dict:
    """A run's summary.json judged again from the tables it keeps, with today's intervals.

    Why: the committed references keep their rounds, evaluations and spec
    beside the summary (`testbed.references.KEPT_FILES`), and a change to
    how a figure's interval is computed (Student's t for the accuracy
    difference, "too few seeds", the per-level burst verdicts) should reach
    their verdicts without running them again. Everything but the judged
    sections (intervals, verdicts, time to target, burst levels, their
    definitions and the one-seed warning) is kept as the run wrote it; the
    invalid units are the summary's. The figures of rounds come out as the
    run's own analysis gave them (same tables, same bootstrap seed). A summary from before the invariants
    (versions 1-3: fidelity_flags, no invalid_units) keeps its version
    number, since its per-arm figures still pool every unit; its verdicts
    may then carry version 6's too_few_seeds. Returns the new summary,
    written in place.
    """
    import pathlib

    from testbed.analysis import formats
    from testbed.analysis.raw import load_spec

    run_dir = pathlib.Path(run_dir)
    summary = formats.read_summary(run_dir / "summary.json")
    rounds = pd.read_csv(run_dir / "rounds.csv")
    evals = pd.read_csv(run_dir / "evals.csv")
    # The bursts' requested levels (`burst_levels`); a folder that kept none has no levels.
    bursts = pd.read_csv(run_dir / "bursts.csv") if (run_dir / "bursts.csv").exists() else None
    if "valid" in evals.columns:
        evals = evals[evals["valid"].astype(bool)]
    invalid = {(u["arm"], int(u["seed"])): list(u["reasons"])
               for u in summary.get("invalid_units", [])}
    kept = {k: v for k, v in summary.items() if k not in JUDGED_SECTIONS}
    kept["warnings"] = [w for w in summary["warnings"] if not w.startswith(ONE_SEED_WARNING)]
    # A summary of versions 1-3 keeps its version: its per-arm figures pooled every unit
    # (fidelity_flags decided nothing), and calling it version 4 or later would say that
    # invariants had left units out. Its judged sections are today's all the same.
    kept["schema"] = formats.SUMMARY_SCHEMA if summary["schema"] >= 4 else summary["schema"]
    out = with_verdicts(kept, load_spec(run_dir), rounds, evals, invalid, bursts=bursts)
    formats.write_summary(run_dir / "summary.json", out)
    return out
