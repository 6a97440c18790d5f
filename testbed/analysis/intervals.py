"""Point estimates with 95 % intervals over repeated runs: a seeded, hierarchical bootstrap.

Why a bootstrap, and why hierarchical: a run repeats every arm over a few
seeds (``run --seeds N``), and each seed gives many rounds. Two things vary:
the seed (data order, initial weights, where the bursts land in training)
and the round (queueing, the emulator's scheduling). Resampling seeds alone
would call a single seed exact; resampling the pooled rounds alone would
treat a hundred rounds of one seed as a hundred independent runs. So every
replicate first draws the seeds with replacement, then, within each drawn
seed, that seed's rounds with replacement (Davison & Hinkley's two-stage
bootstrap), and the interval is the replicates' 2.5th and 97.5th
percentiles. With one seed the first stage has nothing to draw and it is a
plain round bootstrap: the result says so (``n_seeds == 1``, ``method``),
because its interval is blind to seed-to-seed spread.

Pairing: the two arms of a comparison ran the same seeds on one fabric (the
same data order and burst schedule), so both draw the *same* seeds in a
replicate; their rounds are drawn independently (round 12 of one arm has no
special relation to round 12 of the other). Only seeds both arms have data
for take part, and ``n_seeds`` says how many.

Determinism: every draw comes from ``numpy.random.default_rng(rng_seed)``
in a fixed order, so the same tables give the same interval, byte for byte
(the report's rebuild check relies on it).

Estimators, each a function of the rounds (and evaluations) of two arms,
A against baseline B, registered in ``ESTIMATORS``:

- ``burst_speedup``: median of B's burst-round latencies / median of A's
  (> 1: A is faster in burst rounds), medians over the pooled rounds.
- ``train_time_cut``: 100 x (1 - sum of A's training times / sum of B's) over
  the seeds, in percent (> 0: A trains faster). A seed's training time is
  the sum of its round windows (``duration_ms``): the workers' time in
  rounds, evaluations excluded as in their ``train_time_s``; consecutive
  windows overlap by the optimizer step (~1 ms), alike for every arm.
- ``accuracy_delta``: 100 x the mean over seeds of (A's - B's metric at the
  final evaluation), in points. A final evaluation is one number per seed,
  with no rounds under it to resample: Student's t over the paired per-seed
  differences (`mean_difference`), and no interval at all from one seed or
  from seeds whose differences are all equal (`TooFewSeeds`).
- ``time_to_target``: the sum over seeds of B's time to the target / the sum
  of A's (> 1: A reaches it sooner), over the seeds where both reached it.
  The time to target of one (arm, seed), `time_to_target`, is the wall time
  from its first round's start to the end of the first evaluated round whose
  metric reaches the target (evaluations before it included: every arm
  evaluates at the same rounds). Within a seed it splits into the steps
  of the rounds before (start to the next round's start) and the reaching
  round's own window, and those are what the second stage resamples.

Which estimators have one value per seed (``Estimator.per_seed``), decided
one by one, because a verdict's "too few seeds" (`seeds_to_clear`) applies
to those only:

- ``accuracy_delta``: yes. Each seed ends in one evaluation; two or three
  of them are all there is, so the interval is Student's t (whose coverage
  holds at 3 and 5 seeds: test_intervals), and a verdict it cannot settle
  says how many seeds would.
- ``train_time_cut`` and ``time_to_target``: no. A seed's figure is a sum
  of tens of round windows (or steps), and the bootstrap's second stage
  resamples their round-to-round spread. Measured on the committed
  references (training-time cut): at 3 seeds (default) the per-seed cuts
  agree within 0.2-0.8 points sd, and the bootstrap's 16-23 point width is
  mostly that round stage; at 2 seeds they can differ by 10 points (paper:
  9.4 and 19.6), a spread that a 2-seed bootstrap under-states (17 points
  wide, where a t over the two seeds would be 130): there the interval is
  too narrow, not too wide, and its seed count is the warning.
  They keep the hierarchical bootstrap and its one-seed caveat. Their
  verdicts say "straddles", not "too few seeds": more rounds narrow them
  as well as more seeds do, and no count of seeds can be read from them.
- ``burst_speedup``: no; it pools every burst round of every seed.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

RESAMPLES = 10_000
LEVEL = 0.95
RNG_SEED = 20_260_501
# Replicates drawn at once: bounds the memory of the pooled resample
# (replicates x seeds x rounds per seed floats).
_CHUNK_VALUES = 4_000_000
# Fewer values than this on one side (burst rounds, summed over seeds) give
# no interval: two rounds' median is an anecdote, and its bootstrap is too.
MIN_VALUES = 3
# Evaluation metrics: the column in the evals table and which way reaches a target.
METRICS = {"test_accuracy": "higher", "test_loss": "lower"}


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval.

    ``n_seeds`` is how many seeds went in (1: a round bootstrap only, blind
    to seed-to-seed spread), ``n_samples`` how many values (rounds, or
    evaluations) both arms contributed, ``method`` how it was computed.
    """

    point: float
    lo: float
    hi: float
    n_seeds: int
    n_samples: int
    method: str
    resamples: int = RESAMPLES
    level: float = LEVEL
    rng_seed: int = RNG_SEED

    @property
    def one_seed(self) -> bool:
        return self.n_seeds == 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ------------------------------------------------------------- resampling --

def _method(n_seeds: int, per_seed: bool) -> str:
    if not per_seed:
        return "bootstrap over seeds (one value per seed), percentile"
    if n_seeds == 1:
        return "round bootstrap (one seed: blind to seed-to-seed spread), percentile"
    return "hierarchical bootstrap (seeds, then rounds within each seed), percentile"


def _picks(rng: np.random.Generator, n_seeds: int, resamples: int) -> np.ndarray:
    """(resamples, n_seeds) seed indices drawn with replacement; one seed: always it."""
    if n_seeds == 1:
        return np.zeros((resamples, 1), dtype=np.int64)
    return rng.integers(0, n_seeds, size=(resamples, n_seeds))


def _pooled(groups: list[np.ndarray], picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per replicate, each picked seed's values drawn with replacement, pooled (NaN-padded).

    Returns (replicates, n_seeds x longest group); a replicate's row holds,
    for each picked seed, as many draws as that seed has values.
    """
    sizes = np.array([g.size for g in groups])
    flat = np.concatenate(groups)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    width = int(sizes.max())
    size = sizes[picks][..., None]                       # (R, n, 1)
    draw = np.minimum((rng.random(picks.shape + (width,)) * size).astype(np.int64), size - 1)
    vals = flat[offsets[picks][..., None] + draw]
    vals[np.arange(width) >= size] = np.nan
    return vals.reshape(picks.shape[0], -1)


def _sums(groups: list[np.ndarray], picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(replicates, n_seeds): for each picked seed, the sum of its values drawn with replacement."""
    out = np.empty(picks.shape)
    for s, g in enumerate(groups):
        where = np.nonzero(picks == s)
        k = where[0].size
        sums = np.empty(k)
        step = max(1, _CHUNK_VALUES // g.size)
        for i in range(0, k, step):
            n = min(step, k - i)
            sums[i:i + n] = g[rng.integers(0, g.size, size=(n, g.size))].sum(axis=1)
        out[where] = sums
    return out


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    """The replicates' central ``level`` interval; too many undefined replicates: ValueError."""
    ok = stats[np.isfinite(stats)]
    if ok.size < 0.99 * stats.size:
        raise ValueError(f"{stats.size - ok.size} of {stats.size} bootstrap replicates are "
                         "undefined (a zero in a denominator): no interval")
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(ok, [tail, 100 - tail])
    return float(lo), float(hi)


def _paired(arm: Mapping, base: Mapping, what: str) -> list:
    """The seeds both arms have values for, in order; none: ValueError naming ``what``."""
    def has(groups, s):
        return np.asarray(groups[s], dtype=float).size > 0
    seeds = sorted(s for s in arm if s in base and has(arm, s) and has(base, s))
    if not seeds:
        raise ValueError(f"no seed has {what} for both arms "
                         f"(arm: seeds {sorted(arm)}, baseline: seeds {sorted(base)})")
    return seeds


def _arrays(groups: Mapping, seeds: list) -> list[np.ndarray]:
    out = [np.asarray(groups[s], dtype=float) for s in seeds]
    for s, g in zip(seeds, out, strict=True):
        if not np.isfinite(g).all():
            raise ValueError(f"seed {s}: non-finite values")
    return out


def _bootstrap(arm: Mapping, base: Mapping, what: str, point_fn: Callable,
               replicate_fn: Callable, resamples: int, rng_seed: int, level: float,
               per_seed: bool = True) -> Interval:
    """The shared frame of the two-arm estimators: pair the seeds, draw, take percentiles.

    ``point_fn(a_groups, b_groups)`` gives the estimate on the data;
    ``replicate_fn(a_groups, b_groups, picks, rng)`` the replicates' values.
    """
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100, got {resamples}")
    seeds = _paired(arm, base, what)
    a, b = _arrays(arm, seeds), _arrays(base, seeds)
    n = min(sum(g.size for g in a), sum(g.size for g in b))
    if per_seed and n < MIN_VALUES:
        raise ValueError(f"only {n} {what} on one side (fewer than {MIN_VALUES}): no interval")
    point = float(point_fn(a, b))
    if not math.isfinite(point):
        raise ValueError(f"{what}: the estimate is undefined on these data (a zero denominator)")
    rng = np.random.default_rng(rng_seed)
    stats = []
    width = max(len(seeds) * max(g.size for g in a + b), 1)
    chunk = max(1, _CHUNK_VALUES // width)
    for start in range(0, resamples, chunk):
        picks = _picks(rng, len(seeds), min(chunk, resamples - start))
        stats.append(replicate_fn(a, b, picks, rng))
    lo, hi = _percentiles(np.concatenate(stats), level)
    return Interval(point, lo, hi, len(seeds), int(sum(g.size for g in a + b)),
                    _method(len(seeds), per_seed), resamples, level, rng_seed)


# ------------------------------------------------- estimators on arrays --
# Each takes, for arm A and baseline B, a mapping seed -> values of that seed.

def ratio_of_medians(arm: Mapping, base: Mapping, *, what: str = "values",
                     resamples: int = RESAMPLES, rng_seed: int = RNG_SEED,
                     level: float = LEVEL) -> Interval:
    """median(B's pooled values) / median(A's): a speedup of A over B for latencies."""
    def point(a, b):
        den = np.median(np.concatenate(a))
        return np.median(np.concatenate(b)) / den if den > 0 else math.nan

    def replicate(a, b, picks, rng):
        pa, pb = _pooled(a, picks, rng), _pooled(b, picks, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.nanmedian(pb, axis=1) / np.nanmedian(pa, axis=1)
    return _bootstrap(arm, base, what, point, replicate, resamples, rng_seed, level)


def _of_sums(stat: Callable, arm: Mapping, base: Mapping, what: str, resamples: int,
             rng_seed: int, level: float) -> Interval:
    """``stat(sum of A's values, sum of B's)``, summed over rounds and seeds, with its interval."""
    def guarded(sa, sb):
        with np.errstate(divide="ignore", invalid="ignore"):
            return stat(np.float64(sa) if np.isscalar(sa) else sa,
                        np.float64(sb) if np.isscalar(sb) else sb)

    def point(a, b):
        return guarded(sum(g.sum() for g in a), sum(g.sum() for g in b))

    def replicate(a, b, picks, rng):
        return guarded(_sums(a, picks, rng).sum(axis=1), _sums(b, picks, rng).sum(axis=1))
    return _bootstrap(arm, base, what, point, replicate, resamples, rng_seed, level)


def relative_change_of_sums(arm: Mapping, base: Mapping, *, what: str = "values",
                            resamples: int = RESAMPLES, rng_seed: int = RNG_SEED,
                            level: float = LEVEL) -> Interval:
    """100 x (1 - sum of A's values / sum of B's), over rounds and seeds: a cut in percent."""
    return _of_sums(lambda sa, sb: 100.0 * (1.0 - sa / sb), arm, base, what, resamples,
                    rng_seed, level)


def ratio_of_sums(arm: Mapping, base: Mapping, *, what: str = "values",
                  resamples: int = RESAMPLES, rng_seed: int = RNG_SEED,
                  level: float = LEVEL) -> Interval:
    """sum of B's values / sum of A's, over rounds and seeds: a speedup of A for times."""
    return _of_sums(lambda sa, sb: sb / sa, arm, base, what, resamples, rng_seed, level)


#: How `mean_difference` names its method: `seeds_to_clear` reads its intervals only.
T_METHOD = "Student t over the paired per-seed differences"
#: The most seeds `seeds_to_clear` looks at before it says "not within reach".
MAX_SEEDS = 1000


class TooFewSeeds(ValueError):
    """No interval from one value per seed: one seed, or seeds whose values leave no spread.

    A ValueError like every "no interval", so callers that only need the
    reason keep working; ``n_seeds`` lets a verdict say "too few seeds (n)".
    """

    def __init__(self, n_seeds: int, message: str):
        super().__init__(message)
        self.n_seeds = n_seeds


def _t_quantile(level: float, n: int) -> float:
    from scipy.stats import t as student_t
    return float(student_t.ppf((1 + level) / 2, n - 1))


def mean_difference(arm: Mapping, base: Mapping, *, scale: float = 1.0,
                    resamples: int = RESAMPLES, rng_seed: int = RNG_SEED,
                    level: float = LEVEL) -> Interval:
    """scale x mean over seeds of (A's value - B's value), one value per seed, paired.

    One value per seed leaves only the seeds: with fewer than two there is no
    spread at all, and a zero-width interval would be a lie. With two or
    three, a percentile bootstrap of the mean is about [min, max] of the
    differences, which covers the true mean far less often than it claims
    (48 % at two seeds, 75 % at three, in simulation); Student's t on the
    paired differences holds its level for normal differences at any number
    of seeds (``test_mean_difference_t_interval_holds_its_level``), so the
    interval is mean +- t(level, n-1) x sd / sqrt(n).

    Differences that are all equal (a metric in steps, such as one test
    example in 360, repeats itself by chance: two seeds each -0.15 points)
    say nothing about the spread, and their sd of zero would give a
    zero-width interval: no interval either (`TooFewSeeds`, as for one
    seed). ``resamples`` and ``rng_seed`` are accepted for the estimators'
    common signature; nothing is resampled.
    """
    seeds = _paired({s: np.atleast_1d(v) for s, v in arm.items()},
                    {s: np.atleast_1d(v) for s, v in base.items()}, "a value")
    if len(seeds) < 2:
        raise TooFewSeeds(len(seeds), f"too few seeds ({len(seeds)}): one value per seed and "
                          f"only {len(seeds)} seed: no spread to resample (run more seeds, "
                          "`run --seeds N`)")
    d = scale * np.array([float(np.atleast_1d(arm[s])[0]) - float(np.atleast_1d(base[s])[0])
                          for s in seeds])
    n = len(d)
    point = float(d.mean())
    if np.ptp(d) <= 1e-9 * max(1.0, float(np.abs(d).max())):
        raise TooFewSeeds(n, f"too few seeds ({n}): the {n} per-seed differences are all "
                          f"{point:+.4g}, which says nothing of their spread (a metric in steps "
                          "repeats itself by chance): no interval (run more seeds, "
                          "`run --seeds N`)")
    half = _t_quantile(level, n) * float(d.std(ddof=1)) / math.sqrt(n)
    return Interval(point, point - half, point + half, n_seeds=n, n_samples=2 * n,
                    method=T_METHOD, resamples=0, level=level, rng_seed=rng_seed)


def differences_sd(interval: Interval) -> float:
    """The sd of the per-seed differences behind one of `mean_difference`'s intervals."""
    if interval.method != T_METHOD:
        raise ValueError(f"{T_METHOD!r} intervals only, not {interval.method!r}: a bootstrap's "
                         "width is not a t's")
    n = interval.n_seeds
    return (interval.hi - interval.lo) / 2 * math.sqrt(n) / _t_quantile(interval.level, n)


def seeds_to_clear(interval: Interval, edge: float) -> int | None:
    """An estimate: the fewest seeds whose t interval around this point would clear ``edge``.

    The sd of the per-seed differences is read back from the interval
    (half-width x sqrt(n) / t(level, n-1)) and held fixed, as is the point:
    the answer is the smallest n >= 2 with t(level, n-1) x sd / sqrt(n) below
    the distance from the point to ``edge``. An estimate, not a promise: with
    more seeds both the point and the sd move. None when the point sits on
    the edge or no n up to `MAX_SEEDS` would do. Only for `mean_difference`'s
    intervals (ValueError otherwise, `differences_sd`).
    """
    sd = differences_sd(interval)
    gap = abs(interval.point - edge)
    if gap == 0:
        return None
    for m in range(2, MAX_SEEDS + 1):
        if _t_quantile(interval.level, m) * sd / math.sqrt(m) < gap:
            return m
    return None


# ------------------------------------------------- estimators on frames --

def _with_seed(df: pd.DataFrame) -> pd.DataFrame:
    """Tables written before `run --seeds` have no seed column: one seed, labelled 0."""
    return df if "seed" in df.columns else df.assign(seed=0)


def _groups(df: pd.DataFrame, arm: str, column: str) -> dict:
    d = _with_seed(df)
    d = d[d["arm"] == arm]
    return {int(s): g.sort_values("round")[column].to_numpy(dtype=float)
            for s, g in d.groupby("seed", sort=True)}


def _need(df: pd.DataFrame | None, name: str, arm: str) -> pd.DataFrame:
    if df is None or not len(df) or not (df["arm"] == arm).any():
        raise ValueError(f"arm {arm}: no {name}")
    return df


def burst_speedup(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Burst-round speedup of ``arm`` over ``base``: ratio of the burst-round latency medians."""
    r = frames.rounds
    for a in (arm, base):
        _need(r, "rounds", a)
        if not r[(r["arm"] == a) & r["in_burst"].astype(bool)].shape[0]:
            raise ValueError(f"arm {a}: no burst rounds")
    hit = r[r["in_burst"].astype(bool)]
    if "burst_capped" in hit.columns:
        capped = hit[hit["arm"].isin([arm, base]) & hit["burst_capped"].astype(bool)]
        if len(capped):
            # The cap, not the transports, set those rounds: never a speedup.
            raise ValueError(f"{len(capped)} burst round(s) of {arm} or {base} hit a round-locked "
                             "burst's cap: the cap set them; use fixed-duration bursts "
                             "(burst_every.duration_ms or a burst's duration_ms)")
    return ratio_of_medians(_groups(hit, arm, "latency_ms"), _groups(hit, base, "latency_ms"),
                            what="burst rounds", **kw)


def train_time_cut(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Cut in training time of ``arm`` against ``base``, percent (sums of round windows)."""
    r = frames.rounds
    for a in (arm, base):
        _need(r, "rounds", a)
    return relative_change_of_sums(_groups(r, arm, "duration_ms"), _groups(r, base, "duration_ms"),
                                   what="rounds", **kw)


def _metric_at(evals: pd.DataFrame, arm: str, metric: str, last: bool) -> dict:
    """seed -> the metric at the arm's last (or first) evaluated round, mean over evaluating ranks."""
    e = _with_seed(evals)
    e = e[(e["arm"] == arm) & e[metric].notna()]
    out = {}
    for s, g in e.groupby("seed", sort=True):
        at = g[g["round"] == (g["round"].max() if last else g["round"].min())]
        out[int(s)] = float(at[metric].mean())
    return out


def final_metric(evals: pd.DataFrame, arm: str, metric: str = "test_accuracy") -> dict:
    """seed -> the metric at the arm's last evaluated round (mean over evaluating ranks)."""
    return _metric_at(evals, arm, metric, last=True)


def first_metric(evals: pd.DataFrame, arm: str, metric: str = "test_accuracy") -> dict:
    """seed -> the metric at the arm's first evaluated round (mean over evaluating ranks)."""
    return _metric_at(evals, arm, metric, last=False)


def accuracy_delta(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """``arm``'s minus ``base``'s metric at the final evaluation, in points (x 100), paired by seed."""
    e = frames.evals
    for a in (arm, base):
        _need(e, "evaluations", a)
    return mean_difference(final_metric(e, arm, frames.metric), final_metric(e, base, frames.metric),
                           scale=100.0, **kw)


def _steps(rounds: pd.DataFrame) -> pd.DataFrame:
    """One (arm, seed)'s rounds in order: step (start to the next round's start), window, wall.

    wall_s is the time from the first round's start to this round's end:
    the steps before a round plus its own window.
    """
    r = rounds.sort_values("round")
    start = r["t_start_ns"].to_numpy(dtype=np.int64)
    end = r["t_end_ns"].to_numpy(dtype=np.int64)
    steps = np.append(np.diff(start), 0) if len(r) else np.array([], np.int64)
    return pd.DataFrame({"round": r["round"].to_numpy(dtype=np.int64), "step_s": steps / 1e9,
                         "window_s": (end - start) / 1e9,
                         "wall_s": (end - (start[0] if len(r) else 0)) / 1e9})


def _parts_until(steps: pd.DataFrame, rnd: int) -> np.ndarray:
    """The parts that sum to the wall time until round ``rnd`` ends: earlier steps, its window."""
    before = steps[steps["round"] < rnd]["step_s"].to_numpy()
    return np.append(before, steps[steps["round"] == rnd]["window_s"].to_numpy())


def time_to_target(rounds: pd.DataFrame, evals: pd.DataFrame | None, target: float,
                   metric: str = "test_accuracy") -> pd.DataFrame:
    """Per (arm, seed): the first evaluated round whose metric reaches ``target``, and when.

    Columns: arm, seed, round (None: never reached), t_s (wall seconds from
    the (arm, seed)'s first round start to that round's end; None: never
    reached), evaluated (rounds evaluated). Reaching: accuracy >= target, or
    loss <= target (``METRICS``). The metric of a round is the mean over the
    ranks that evaluated it.
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {sorted(METRICS)}")
    rows = []
    r = _with_seed(rounds)
    e = _with_seed(evals) if evals is not None and len(evals) else None
    for (arm, seed), g in r.groupby(["arm", "seed"], sort=False):
        steps = _steps(g).set_index("round")
        hit_round, t, n = None, None, 0
        if e is not None:
            ev = e[(e["arm"] == arm) & (e["seed"] == seed) & e[metric].notna()]
            by_round = ev.groupby("round", sort=True)[metric].mean()
            n = int(by_round.size)
            ok = by_round >= target if METRICS[metric] == "higher" else by_round <= target
            for rnd in by_round.index[ok.to_numpy()]:
                if int(rnd) in steps.index:
                    hit_round, t = int(rnd), float(steps.loc[int(rnd), "wall_s"])
                    break
        rows.append({"arm": arm, "seed": int(seed), "round": hit_round, "t_s": t, "evaluated": n})
    return pd.DataFrame(rows, columns=["arm", "seed", "round", "t_s", "evaluated"])


def time_to_target_ratio(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Time-to-target speedup of ``arm`` over ``base`` (> 1: ``arm`` reaches it sooner).

    Over the seeds where both arms reached the target; a seed where one did
    not is left out (its time is unknown, not long), and ``n_seeds`` shows it.
    """
    if frames.target is None:
        raise ValueError("no target metric value")
    for a in (arm, base):
        _need(frames.rounds, "rounds", a)
        _need(frames.evals, "evaluations", a)
    ttt = time_to_target(frames.rounds, frames.evals, frames.target, frames.metric)
    r = _with_seed(frames.rounds)
    groups = {}
    for a in (arm, base):
        reached = ttt[(ttt["arm"] == a) & ttt["round"].notna()]
        if not len(reached):
            raise ValueError(f"arm {a}: never reached {frames.metric} {frames.target:.4g}")
        groups[a] = {}
        for row in reached.itertuples(index=False):
            st = _steps(r[(r["arm"] == a) & (r["seed"] == row.seed)])
            groups[a][int(row.seed)] = _parts_until(st, int(row.round))
    return ratio_of_sums(groups[arm], groups[base], what="rounds to the target", **kw)


@dataclasses.dataclass(frozen=True)
class RunFrames:
    """What the estimators read: the rounds and evals tables, and the time-to-target setting."""

    rounds: pd.DataFrame
    evals: pd.DataFrame | None = None
    target: float | None = None
    metric: str = "test_accuracy"


@dataclasses.dataclass(frozen=True)
class Estimator:
    """One figure two arms are compared by: its unit, meaning and function."""

    name: str
    unit: str
    what: str
    fn: Callable[..., Interval]
    #: One value per seed (the module's docstring says which and why): its verdicts can
    #: be "too few seeds", with `seeds_to_clear`'s estimate.
    per_seed: bool = False

    def __call__(self, frames: RunFrames, arm: str, base: str, **kw) -> Interval:
        return self.fn(frames, arm, base, **kw)


ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("burst_speedup", "x", "burst-round latency: median of the baseline's / the arm's",
              burst_speedup),
    Estimator("train_time_cut", "%", "training time (sum of round windows): 100 x (1 - arm / "
              "baseline)", train_time_cut),
    Estimator("accuracy_delta", "points", "final evaluation's metric: arm - baseline, x 100, "
              "paired by seed", accuracy_delta, per_seed=True),
    Estimator("time_to_target", "x", "wall time to the target metric: baseline / arm, over "
              "the seeds where both reached it", time_to_target_ratio),
)}
