"""Point estimates with 95 % intervals over repeated runs: Student's t over seeds, and a
seeded, hierarchical bootstrap where rounds of every seed are pooled.

Why a bootstrap for pooled rounds, and why hierarchical: a run repeats every arm over a few
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
- ``train_time_cut``: 100 x (1 - A's training time / B's), one value per
  seed, in percent (> 0: A trains faster), and their mean over the seeds.
  A seed's training time is the sum of its round windows (``duration_ms``):
  the workers' time in rounds, evaluations excluded as in their
  ``train_time_s``; consecutive windows overlap by the optimizer step
  (~1 ms), alike for every arm.
- ``accuracy_delta``: 100 x the mean over seeds of (A's - B's metric at the
  final evaluation), in points.
- ``time_to_target``: B's time to the target / A's (> 1: A reaches it
  sooner), one ratio per seed where both reached it, and their geometric
  mean. The time to target of one (arm, seed), `time_to_target`, is the
  wall time from its first round's start to the end of the first evaluated
  round whose metric reaches the target (evaluations before it included:
  every arm evaluates at the same rounds).
- ``round_p99_speedup`` and ``round_mean_speedup``: B's 99th-percentile
  (mean) round latency / A's, each taken over every round of one seed, one
  ratio per seed, and their geometric mean: the abstract's "tail-latency
  collapse", which gives no number.

The seed is the unit of replication for every figure but the burst speedup
(``Estimator.per_seed``). Why, for the training-time cut and time to
target: the rounds of one seed share its phase schedule (when the detector
relaxes) and its burst schedule, so they are not independent draws. On the
committed references burst x phase explained 88-98 % of the round-time
variance and DBLP's normal rounds had a lag-1 autocorrelation of 0.83-0.88;
resampling those rounds as if independent gave the default reference
[-0.1, 15.8] % around per-seed cuts of 7.89, 8.26 and 8.18 % (too wide:
the round stage turned the design into noise), and the paper reference
[5.7, 23.0] % around 9.4 and 19.6 % (too narrow: two seeds that disagree
by ten points). One value per seed and Student's t over them
(`over_seeds`) is honest at both ends; its coverage on synthetic seeds
whose rounds are autocorrelated and split into phases is checked by
test_intervals. A ratio (time to target) is taken on the log scale, where
a ratio and its inverse are symmetric, and the interval is brought back.
With one seed, or seeds that all give one value, there is no interval
(`TooFewSeeds`), and a verdict it cannot settle says how many seeds would
(`seeds_to_clear`).

The burst speedup keeps the hierarchical bootstrap: it is a ratio of
medians over the burst rounds of every seed, a handful per seed, and its
verdicts say "straddles", not "too few seeds".
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

def _method(n_seeds: int) -> str:
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
               replicate_fn: Callable, resamples: int, rng_seed: int, level: float) -> Interval:
    """The shared frame of the two-arm estimators: pair the seeds, draw, take percentiles.

    ``point_fn(a_groups, b_groups)`` gives the estimate on the data;
    ``replicate_fn(a_groups, b_groups, picks, rng)`` the replicates' values.
    """
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100, got {resamples}")
    seeds = _paired(arm, base, what)
    a, b = _arrays(arm, seeds), _arrays(base, seeds)
    n = min(sum(g.size for g in a), sum(g.size for g in b))
    if n < MIN_VALUES:
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
                    _method(len(seeds)), resamples, level, rng_seed)


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


#: How the Student t intervals over seeds name their method: `seeds_to_clear` reads those
#: only (a bootstrap's width is not a t's). The accuracy difference's keeps its old name.
T_METHOD = "Student t over the paired per-seed differences"
T_VALUES_METHOD = "Student t over the per-seed values of the paired seeds"
T_LOG_METHOD = "Student t over the per-seed log ratios of the paired seeds (geometric mean)"
#: Each t method, and whether it works on the log scale.
T_METHODS = {T_METHOD: False, T_VALUES_METHOD: False, T_LOG_METHOD: True}
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


def over_seeds(values: Mapping, *, method: str = T_VALUES_METHOD, n_samples: int | None = None,
               level: float = LEVEL, rng_seed: int = RNG_SEED) -> Interval:
    """The mean of one value per seed and its Student t interval: mean +- t(level, n-1) x sd / sqrt(n).

    The seed is the unit: whatever a seed's value sums (rounds, steps), its
    parts share the seed's phase and burst schedule, so only the seeds are
    independent draws. Student's t holds its level for normal values at any
    number of seeds (``test_mean_difference_t_interval_holds_its_level``,
    ``test_train_time_cut_covers_with_autocorrelated_phased_rounds``), where
    a percentile bootstrap of two or three values is about their [min, max]
    and covers far less often than it claims (48 % at two seeds, 75 % at
    three, in simulation). A log method (``T_METHODS``) takes the mean of
    the logs and returns the geometric mean and its interval, for ratios.

    Fewer than two seeds, or values that are all equal (a metric in steps
    repeats itself by chance), say nothing of the spread, and a zero-width
    interval would be a lie: `TooFewSeeds`. ``rng_seed`` is kept for the
    estimators' common signature; nothing is drawn.
    """
    if method not in T_METHODS:
        raise ValueError(f"method must be one of {sorted(T_METHODS)}, got {method!r}")
    seeds = sorted(values)
    x = np.array([float(values[s]) for s in seeds], dtype=float)
    if not np.isfinite(x).all():
        raise ValueError(f"non-finite per-seed values {dict(zip(seeds, x.tolist(), strict=True))}")
    log = T_METHODS[method]
    if log:
        if (x <= 0).any():
            raise ValueError(f"per-seed ratios must be positive, got {x.tolist()}")
        x = np.log(x)
    n = len(x)
    if n < 2:
        raise TooFewSeeds(n, f"too few seeds ({n}): one value per seed and only {n} seed: no "
                          "spread to judge (run more seeds, `run --seeds N`)")
    shown = float(np.exp(x.mean())) if log else float(x.mean())
    if np.ptp(x) <= 1e-9 * max(1.0, float(np.abs(x).max())):
        raise TooFewSeeds(n, f"too few seeds ({n}): the {n} per-seed values are all "
                          f"{shown:+.4g}, which says nothing of their spread (a metric in steps "
                          "repeats itself by chance): no interval (run more seeds, "
                          "`run --seeds N`)")
    m = float(x.mean())
    half = _t_quantile(level, n) * float(x.std(ddof=1)) / math.sqrt(n)
    lo, hi = (m - half, m + half)
    if log:
        lo, hi = math.exp(lo), math.exp(hi)
    return Interval(shown, lo, hi, n_seeds=n, n_samples=n if n_samples is None else n_samples,
                    method=method, resamples=0, level=level, rng_seed=rng_seed)


def mean_difference(arm: Mapping, base: Mapping, *, scale: float = 1.0,
                    resamples: int = RESAMPLES, rng_seed: int = RNG_SEED,
                    level: float = LEVEL) -> Interval:
    """scale x mean over seeds of (A's value - B's value), one value per seed, paired.

    `over_seeds` on the paired differences. ``resamples`` is accepted for
    the estimators' common signature; nothing is resampled.
    """
    seeds = _paired({s: np.atleast_1d(v) for s, v in arm.items()},
                    {s: np.atleast_1d(v) for s, v in base.items()}, "a value")
    d = {s: scale * (float(np.atleast_1d(arm[s])[0]) - float(np.atleast_1d(base[s])[0]))
         for s in seeds}
    return over_seeds(d, method=T_METHOD, n_samples=2 * len(seeds), level=level,
                      rng_seed=rng_seed)


def _on_scale(interval: Interval) -> tuple[Callable[[float], float], Interval]:
    """(the map to the scale the t interval was taken on, the interval checked to be a t's)."""
    if interval.method not in T_METHODS:
        raise ValueError(f"Student t intervals only ({sorted(T_METHODS)}), not "
                         f"{interval.method!r}: a bootstrap's width is not a t's")
    return (math.log if T_METHODS[interval.method] else float), interval


def differences_sd(interval: Interval) -> float:
    """The sd of the per-seed values behind a t interval (`over_seeds`), on its own scale."""
    f, _ = _on_scale(interval)
    n = interval.n_seeds
    return (f(interval.hi) - f(interval.lo)) / 2 * math.sqrt(n) / _t_quantile(interval.level, n)


def seeds_to_clear(interval: Interval, edge: float) -> int | None:
    """An estimate: the fewest seeds whose t interval around this point would clear ``edge``.

    The sd of the per-seed values is read back from the interval
    (half-width x sqrt(n) / t(level, n-1), on the log scale for a ratio)
    and held fixed, as is the point: the answer is the smallest n >= 2 with
    t(level, n-1) x sd / sqrt(n) below the distance from the point to
    ``edge``. An estimate, not a promise: with more seeds both the point and
    the sd move. None when the point sits on the edge (or, for a ratio, the
    edge is not positive) or no n up to `MAX_SEEDS` would do. Only for t
    intervals (ValueError otherwise, `differences_sd`).
    """
    f, _ = _on_scale(interval)
    sd = differences_sd(interval)
    if f is math.log and edge <= 0:
        return None
    gap = abs(f(interval.point) - f(edge))
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


def _refuse_capped(r: pd.DataFrame, arm: str, base: str) -> None:
    """ValueError when a burst round of ``arm`` or ``base`` hit a round-locked burst's cap."""
    if "burst_capped" not in r.columns:
        return
    capped = r[r["arm"].isin([arm, base]) & r["in_burst"].astype(bool)
               & r["burst_capped"].astype(bool)]
    if len(capped):
        # The cap, not the transports, set those rounds: never a speedup.
        raise ValueError(f"{len(capped)} burst round(s) of {arm} or {base} hit a round-locked "
                         "burst's cap: the cap set them; use fixed-duration bursts "
                         "(burst_every.duration_ms or a burst's duration_ms)")


def burst_speedup(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Burst-round speedup of ``arm`` over ``base``: ratio of the burst-round latency medians."""
    r = frames.rounds
    for a in (arm, base):
        _need(r, "rounds", a)
        if not r[(r["arm"] == a) & r["in_burst"].astype(bool)].shape[0]:
            raise ValueError(f"arm {a}: no burst rounds")
    _refuse_capped(r, arm, base)
    hit = r[r["in_burst"].astype(bool)]
    return ratio_of_medians(_groups(hit, arm, "latency_ms"), _groups(hit, base, "latency_ms"),
                            what="burst rounds", **kw)


def per_seed_cut(arm: Mapping, base: Mapping) -> dict:
    """seed -> 100 x (1 - sum of A's values / sum of B's), over the seeds both arms have."""
    seeds = _paired(arm, base, "rounds")
    a, b = _arrays(arm, seeds), _arrays(base, seeds)
    out = {}
    for s, ga, gb in zip(seeds, a, b, strict=True):
        if gb.sum() <= 0:
            raise ValueError(f"seed {s}: the baseline's rounds sum to {gb.sum():g}: no cut")
        out[s] = 100.0 * (1.0 - ga.sum() / gb.sum())
    return out


def train_time_cut(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Cut in training time of ``arm`` against ``base``, percent: one cut per seed, t over seeds."""
    r = frames.rounds
    for a in (arm, base):
        _need(r, "rounds", a)
    ga, gb = _groups(r, arm, "duration_ms"), _groups(r, base, "duration_ms")
    cuts = per_seed_cut(ga, gb)
    n = sum(len(ga[s]) + len(gb[s]) for s in cuts)
    return over_seeds(cuts, method=T_VALUES_METHOD, n_samples=n,
                      **{k: v for k, v in kw.items() if k in ("level", "rng_seed")})


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

    One ratio per seed where both arms reached the target (a seed where one
    did not is left out: its time is unknown, not long, and ``n_seeds``
    shows it), their geometric mean and its t interval (`over_seeds`).
    """
    if frames.target is None:
        raise ValueError("no target metric value")
    for a in (arm, base):
        _need(frames.rounds, "rounds", a)
        _need(frames.evals, "evaluations", a)
    ttt = time_to_target(frames.rounds, frames.evals, frames.target, frames.metric)
    times = {}
    for a in (arm, base):
        reached = ttt[(ttt["arm"] == a) & ttt["round"].notna()]
        if not len(reached):
            raise ValueError(f"arm {a}: never reached {frames.metric} {frames.target:.4g}")
        times[a] = {int(row.seed): float(row.t_s) for row in reached.itertuples(index=False)}
    seeds = _paired(times[arm], times[base], "a time to the target")
    ratios = {s: times[base][s] / times[arm][s] for s in seeds if times[arm][s] > 0}
    return over_seeds(ratios, method=T_LOG_METHOD, n_samples=2 * len(ratios),
                      **{k: v for k, v in kw.items() if k in ("level", "rng_seed")})


#: The statistics of one seed's round latencies the tail and mean figures compare: the 99th
#: percentile (numpy's linear interpolation, as summary.json's round_ms_p99) and the mean.
ROUND_STATS: dict[str, Callable[[np.ndarray], float]] = {
    "p99": lambda x: float(np.percentile(x, 99)),
    "mean": lambda x: float(np.mean(x)),
}


def per_seed_ratio(arm: Mapping, base: Mapping, stat: Callable[[np.ndarray], float],
                   what: str = "rounds") -> dict:
    """seed -> stat(B's values) / stat(A's), over the seeds both arms have (> 1: A is faster)."""
    seeds = _paired(arm, base, what)
    out = {}
    for s, ga, gb in zip(seeds, _arrays(arm, seeds), _arrays(base, seeds), strict=True):
        den = stat(ga)
        if not den > 0:
            raise ValueError(f"seed {s}: the arm's {what} give {den:g}: no ratio")
        out[s] = stat(gb) / den
    return out


def round_latency_speedup(frames: RunFrames, arm: str, base: str, stat: str, **kw) -> Interval:
    """Speedup of ``arm`` over ``base`` in one statistic of every round's latency (``ROUND_STATS``):
    per seed, the baseline's statistic over all its rounds / the arm's; their geometric mean and
    its t interval over the seeds (`over_seeds`, log scale).

    The seed is the unit, as for the training-time cut: a seed's p99 is one of
    its few slowest rounds, which its burst and phase schedule place, so its
    rounds are not independent draws. Every round counts, burst or not (the
    tail a user meets); a burst round a round-locked burst's cap ended is
    refused, as in `burst_speedup`: the cap, not the transport, set it.
    """
    r = frames.rounds
    for a in (arm, base):
        _need(r, "rounds", a)
    _refuse_capped(r, arm, base)
    ga, gb = _groups(r, arm, "latency_ms"), _groups(r, base, "latency_ms")
    ratios = per_seed_ratio(ga, gb, ROUND_STATS[stat], f"round latencies ({stat})")
    n = sum(len(ga[s]) + len(gb[s]) for s in ratios)
    return over_seeds(ratios, method=T_LOG_METHOD, n_samples=n,
                      **{k: v for k, v in kw.items() if k in ("level", "rng_seed")})


def round_p99_speedup(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Tail round latency: the baseline's p99 / the arm's, one ratio per seed."""
    return round_latency_speedup(frames, arm, base, "p99", **kw)


def round_mean_speedup(frames: RunFrames, arm: str, base: str, **kw) -> Interval:
    """Mean round latency: the baseline's mean / the arm's, one ratio per seed."""
    return round_latency_speedup(frames, arm, base, "mean", **kw)


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
              "baseline), one cut per seed, mean over seeds", train_time_cut, per_seed=True),
    Estimator("accuracy_delta", "points", "final evaluation's metric: arm - baseline, x 100, "
              "paired by seed", accuracy_delta, per_seed=True),
    Estimator("time_to_target", "x", "wall time to the target metric: baseline / arm, one "
              "ratio per seed where both reached it, geometric mean", time_to_target_ratio,
              per_seed=True),
    Estimator("round_p99_speedup", "x", "round latency, 99th percentile over every round: "
              "baseline's / the arm's, one ratio per seed, geometric mean", round_p99_speedup,
              per_seed=True),
    Estimator("round_mean_speedup", "x", "round latency, mean over every round: baseline's / "
              "the arm's, one ratio per seed, geometric mean", round_mean_speedup, per_seed=True),
)}
