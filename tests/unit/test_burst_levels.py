"""The burst claim per loss level and DBLP phase, and the tail and mean latency claims.

Synthetic seeds whose per-seed figures are known exactly: every DBLP burst
round is the static arm's divided by the seed's ratio, so the per-seed
ratio of medians is that ratio, and the interval is Student's t on its
logarithms, computed here by hand.
"""
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t

from testbed.analysis import burstlevels as bl
from testbed.analysis import claims, formats
from testbed.analysis import intervals as iv
from testbed.analysis.pages import verdicts as pages
from testbed.testing.frames import synthetic
from workloads.runlog import check_fields

pytestmark = pytest.mark.unit

MS = 1_000_000
#: The spec's bounds, as a run's spec.toml gives them (the module reads them, never types them).
SPEC = {"training": {}, "transport": {"p_static": 0.008, "p_low": 0.008, "p_high": 0.408}}


def t_interval(values) -> tuple[float, float, float]:
    """(geometric mean, lo, hi): Student's t on the logs, by hand."""
    x = np.log(np.asarray(values, dtype=float))
    n = len(x)
    half = student_t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return math.exp(x.mean()), math.exp(x.mean() - half), math.exp(x.mean() + half)


def burst_run(ratios: dict, bursts_per_seed: list[tuple[float, str]], capped=()):
    """(rounds, bursts): per seed, one burst round per (level, phase) in ``bursts_per_seed``
    followed by two normal rounds; static's burst rounds take 1000 + 10 j ms, DBLP's that over
    the seed's ratio. DBLP's rounds carry the burst's phase; static's carry none. ``capped``:
    (seed, burst index) whose rounds a round-locked burst's cap ended."""
    rounds, bursts = [], []
    for arm in ("static", "dblp"):
        for seed, ratio in ratios.items():
            t = 10**18 + (seed * 2 + (arm == "dblp")) * 10**12
            r = 0
            for j, (level, phase) in enumerate(bursts_per_seed):
                bid = f"b{j:03d}"
                bursts.append({"arm": arm, "seed": seed, "id": bid, "requested_loss": level})
                for k in range(3):
                    burst = k == 0
                    lat = (1000.0 + 10 * j) if burst else 50.0
                    if arm == "dblp" and burst:
                        lat /= ratio
                    rounds.append({
                        "arm": arm, "seed": seed, "round": r, "t_start_ns": t,
                        "t_end_ns": t + int(lat * MS), "duration_ms": lat, "latency_ms": lat,
                        "in_burst": burst, "burst_id": bid if burst else "",
                        "burst_capped": burst and (seed, j) in capped,
                        "phase": phase if arm == "dblp" else None,
                        "bound": (0.408 if phase == "relaxed" else 0.008) if arm == "dblp"
                        else 0.008})
                    t += int(lat * MS) + 2 * MS
                    r += 1
    return pd.DataFrame(rounds), pd.DataFrame(bursts)


def _levels(rounds, bursts, spec=SPEC):
    return claims.burst_levels(spec, ["static", "dblp"], rounds, bursts)["dblp_vs_static"]


@pytest.mark.parametrize("p,counts,ratio", [
    (0.6, [10, 2], 5.0), (0.7, [14, 3], 14 / 3), (0.8, [22, 5], 4.4), (0.9, [46, 9], 46 / 9)])
def test_the_pass_count_ratio_of_the_two_bounds_per_level(p, counts, ratio):
    """ceil(ln 0.008 / ln p) / ceil(ln 0.408 / ln p): 10/2 at 60 %, 46/9 at 90 % (issue 57)."""
    assert bl.pass_counts(0.008, 0.408, p) == (counts, pytest.approx(ratio))
    assert bl.pass_counts(0.008, 0.008, p) == ([counts[0]] * 2, 1.0)   # critical: static's bound


def test_the_bounds_come_from_the_spec_as_the_arms_registry_names_them():
    spec = {"transport": {"p_static": 0.01, "p_low": 0.02, "p_high": 0.5}}
    assert bl.bounds(spec, "dblp", "static") == {"baseline": 0.01, "critical": 0.02,
                                                 "relaxed": 0.5}
    # static-high runs at the spec's p_high (its bound_from): its passes are the loose bound's.
    assert bl.bounds(spec, "dblp", "static-high")["baseline"] == 0.5
    assert bl.bounds({"training": {}}, "dblp", "static") == {
        "baseline": None, "critical": None, "relaxed": None}
    assert bl.pass_counts(None, 0.408, 0.6) == ([None, None], None)


def test_a_level_and_phase_gives_the_t_interval_of_its_per_seed_speedups():
    ratios = {1: 4.6, 2: 4.8, 3: 5.1, 4: 4.9}
    plan = [(0.6, "relaxed")] * 3 + [(0.6, "critical")] * 3
    rounds, bursts = burst_run(ratios, plan)
    entry = _levels(rounds, bursts)
    relaxed, critical = entry["rows"]
    assert (relaxed["level"], relaxed["phase"], critical["phase"]) == (0.6, "relaxed", "critical")
    assert relaxed["bursts"] == 12 and relaxed["seeds"] == 4 and relaxed["rounds"] == [12, 12]
    point, lo, hi = t_interval(list(ratios.values()))
    got = relaxed["interval"]
    assert (got["point"], got["lo"], got["hi"]) == (pytest.approx(point), pytest.approx(lo),
                                                    pytest.approx(hi))
    assert got["method"] == iv.T_LOG_METHOD and got["n_seeds"] == 4
    assert relaxed["passes"] == [10, 2] and relaxed["pass_ratio"] == pytest.approx(5.0)
    assert relaxed["bounds"] == [0.008, 0.408]
    assert lo >= 4.0 and relaxed["verdict"] == claims.REPRODUCED
    # DBLP's critical-phase bursts are judged apart, at static's own bound (pass ratio 1).
    assert critical["pass_ratio"] == 1.0 and critical["bounds"] == [0.008, 0.008]
    assert entry["pools"] == {"levels": [0.6], "phases": {"critical": 12, "relaxed": 12},
                              "bursts": 24, "seeds": 4}
    check_fields(entry, formats.SUMMARY_BURST_LEVELS_PAIR_FIELDS, "pair")
    for row in entry["rows"]:
        check_fields(row, formats.SUMMARY_BURST_LEVEL_FIELDS, "row")


def test_a_speedup_far_below_the_claim_is_refuted_on_enough_bursts_and_seeds():
    rounds, bursts = burst_run({1: 1.1, 2: 1.2, 3: 1.3}, [(0.9, "relaxed")] * 4)
    row = _levels(rounds, bursts)["rows"][0]
    assert row["bursts"] == 12 and row["seeds"] == 3
    assert row["verdict"] == claims.REFUTED and row["pass_ratio"] == pytest.approx(46 / 9)
    assert row["interval"]["hi"] < 4.0 and "lies outside" in row["reason"]


@pytest.mark.parametrize("ratios,per_seed,why", [
    ({1: 5.0, 2: 5.2, 3: 5.1}, 3, "9 burst(s) over 3 seed(s)"),          # nine bursts
    ({1: 5.0, 2: 5.05}, 6, "12 burst(s) over 2 seed(s)"),                  # two seeds
])
def test_fewer_than_ten_bursts_or_three_seeds_say_too_few_instead_of_a_verdict(ratios, per_seed,
                                                                               why):
    rounds, bursts = burst_run(ratios, [(0.8, "relaxed")] * per_seed)
    row = _levels(rounds, bursts)["rows"][0]
    assert row["verdict"] == claims.TOO_FEW_BURSTS and row["reason"].startswith(why)
    assert row["interval"]["lo"] > 4.0        # however decisive its interval
    assert "| too few bursts/seeds |" in pages.burst_levels_table(
        {"burst_levels": {"dblp_vs_static": _levels(rounds, bursts)}})


def test_ten_bursts_over_three_seeds_are_enough():
    plan = [(0.7, "relaxed")] * 4
    rounds, bursts = burst_run({1: 5.0, 2: 5.3, 3: 5.1}, plan)
    # Seed 3 with two bursts only: 4 + 4 + 2 = 10.
    drop = (rounds["seed"] == 3) & rounds["burst_id"].isin(["b002", "b003"])
    rounds.loc[drop, ["in_burst", "burst_id"]] = [False, ""]
    row = _levels(rounds, bursts)["rows"][0]
    assert row["bursts"] == 10 and row["verdict"] == claims.REPRODUCED


def test_capped_rounds_give_no_speedup_and_say_capped():
    rounds, bursts = burst_run({1: 5.0, 2: 5.2, 3: 5.1}, [(0.6, "relaxed")] * 4, capped={(2, 1)})
    row = _levels(rounds, bursts)["rows"][0]
    assert row["verdict"] == claims.CAPPED and row["interval"] is None and row["capped"] == 2
    assert row["reason"].startswith("capped: 2 burst round(s)")


def test_levels_are_the_requested_losses_and_phases_are_dblps_at_the_burst():
    """Static's rounds take DBLP's phase at the same burst; levels ascend, relaxed first."""
    plan = [(0.9, "critical"), (0.6, "relaxed"), (0.6, "critical")]
    rounds, bursts = burst_run({1: 2.0, 2: 2.0, 3: 2.0}, plan)
    entry = _levels(rounds, bursts)
    assert [(r["level"], r["phase"]) for r in entry["rows"]] == [
        (0.6, "relaxed"), (0.6, "critical"), (0.9, "critical")]
    assert all(r["rounds"] == [3, 3] for r in entry["rows"])
    # No bursts table: no level is known, and the section says why there are no rows.
    none = _levels(rounds, None)
    assert none["rows"] == [] and "requested loss level" in none["reason"]
    assert none["pools"]["levels"] == [] and none["pools"]["bursts"] == 9


def test_the_pooled_burst_verdict_says_what_it_pools():
    plan = [(0.6, "relaxed"), (0.8, "critical"), (0.8, "critical")]
    rounds, bursts = burst_run({1: 1.5, 2: 1.6, 3: 1.4}, plan)
    out = claims.judge(SPEC, ["static", "dblp"], rounds, None, bursts=bursts, resamples=200)
    v = next(v for v in out["verdicts"] if v["claim"] == "burst_speedup")
    assert v["pools"] == {"levels": [0.6, 0.8], "phases": {"critical": 6, "relaxed": 3},
                          "bursts": 9, "seeds": 3}
    check_fields(v["pools"], formats.SUMMARY_POOLS_FIELDS, "pools")
    table = pages.verdicts_table(out)
    assert "| burst_speedup (pools 9 bursts at 60 %/80 % over 3 seeds: 6 critical, 3 relaxed) |" \
        in table
    assert "burst_levels" in claims.JUDGED_SECTIONS and set(out["burst_levels"]) == {
        "dblp_vs_static"}
    levels = pages.burst_levels_table(out)
    assert "| dblp vs static | 60 % | relaxed | 3 (3) |" in levels and "| 5.00x (10/2) |" in levels
    assert "| dblp vs static | 80 % | critical | 6 (3) |" in levels and "| 1.00x (22/22) |" in levels
    assert levels.endswith("pools 9 bursts at 60 %/80 % over 3 seeds: 6 critical, 3 relaxed.\n")
    # A summary judged before version 9 has no levels: the table says how to get them.
    assert "`dblp-testbed reproduce --rejudge`" in pages.burst_levels_table({"verdicts": []})


# -- tail and mean round latency ---------------------------------------------------------------

def _per_seed(rounds, stat, arm, base):
    out = {}
    for s in sorted(set(rounds["seed"])):
        lat = {a: rounds[(rounds["arm"] == a) & (rounds["seed"] == s)]["latency_ms"].to_numpy()
               for a in (arm, base)}
        out[s] = stat(lat[base]) / stat(lat[arm])
    return out


def test_tail_and_mean_latency_are_judged_against_every_baseline_with_seed_t_intervals():
    rounds, evals = synthetic(seeds=(1, 2, 3, 4, 5), arms=("static", "dblp", "gloo"))
    out = claims.judge({"training": {}}, ["static", "dblp", "gloo"], rounds, evals,
                       resamples=500)
    for claim, est, stat in (("tail_latency", "round_p99_speedup", lambda x: np.percentile(x, 99)),
                             ("mean_latency", "round_mean_speedup", np.mean)):
        got = {v["pair"]: v for v in out["verdicts"] if v["claim"] == claim}
        assert list(got) == ["dblp_vs_static", "dblp_vs_gloo"]
        for pair, v in got.items():
            arm, base = pair.split("_vs_")
            point, lo, hi = t_interval(list(_per_seed(rounds, stat, arm, base).values()))
            assert (v["interval"]["point"], v["interval"]["lo"], v["interval"]["hi"]) == (
                pytest.approx(point), pytest.approx(lo), pytest.approx(hi))
            assert v["interval"]["n_seeds"] == 5 and v["estimator"] == est
            assert v["paper"] == claims.NO_FIGURE == "> 1x" and "no figure" in v["source"]
            assert v["region"] == [1.0, None]
            # DBLP is faster than both in every seed of this synthetic run.
            assert v["verdict"] == claims.REPRODUCED
    assert out["intervals"]["dblp_vs_gloo"]["comparison"] == "baselines"


def test_a_slower_tail_is_refuted_and_two_seeds_never_decide():
    # Here DBLP's burst rounds are five times static's: its tail is slower.
    truth = {"static": (100.0, 30.0, 75.0, 0.9), "dblp": (500.0, 30.0, 100.0, 0.9)}
    rounds, evals = synthetic(seeds=(1, 2, 3, 4), arms=("static", "dblp"), truth=truth)
    out = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, resamples=500)
    tail = next(v for v in out["verdicts"] if v["claim"] == "tail_latency")
    assert tail["verdict"] == claims.REFUTED and tail["interval"]["hi"] < 1
    two = rounds[rounds["seed"] <= 2]
    out = claims.judge({"training": {}}, ["static", "dblp"], two, evals, resamples=500)
    tail = next(v for v in out["verdicts"] if v["claim"] == "tail_latency")
    assert tail["verdict"] == claims.UNRESOLVED and tail["too_few_seeds"]["seeds"] == 2


def test_tail_latency_refuses_rounds_a_cap_ended():
    rounds, _ = synthetic(seeds=(1, 2, 3), arms=("static", "dblp"))
    rounds["burst_capped"] = rounds["in_burst"] & (rounds["round"] == 0)
    with pytest.raises(ValueError, match="hit a round-locked burst's cap"):
        iv.round_p99_speedup(iv.RunFrames(rounds), "dblp", "static")


def test_invalid_units_are_left_out_of_the_levels():
    rounds, bursts = burst_run({1: 5.0, 2: 5.2, 3: 5.1, 4: 0.5}, [(0.6, "relaxed")] * 4)
    out = claims.judge(SPEC, ["static", "dblp"], rounds, None, {("dblp", 4): ["cpu busy"]},
                       bursts=bursts, resamples=200)
    row = out["burst_levels"]["dblp_vs_static"]["rows"][0]
    assert row["seeds"] == 3 and row["bursts"] == 12 and row["interval"]["lo"] > 4.0
