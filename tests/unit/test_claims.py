"""The paper's claims: declared once, paired through the arms registry, judged by the interval rule."""
import json
import math

import pandas as pd
import pytest

from testbed.analysis import answer, claims, formats
from testbed.analysis import intervals as iv
from testbed.testing.frames import SYNTH_ROUNDS, TRUTH, synthetic
from workloads.runlog import check_fields

pytestmark = pytest.mark.unit


def _iv(lo, hi, n_seeds=5):
    return iv.Interval((lo + hi) / 2, lo, hi, n_seeds, 100, "test")


def test_every_claim_names_a_registered_estimator_and_comparison():
    assert set(claims.CLAIMS) == {"burst_speedup", "train_time_cut", "accuracy", "tail_latency",
                                  "mean_latency"}
    for c in claims.CLAIMS.values():
        assert c.estimator in iv.ESTIMATORS and c.comparison in claims.COMPARISONS
        assert c.paper and c.what and c.region_why
    assert claims.CLAIMS["burst_speedup"].region == claims.Region(4.0, math.inf)
    assert claims.CLAIMS["train_time_cut"].region == claims.Region(17.0, 34.0)
    assert claims.CLAIMS["accuracy"].region == claims.Region(-0.5, math.inf)
    assert claims.Region(4.0).to_list() == [4.0, None]
    # The abstract's "tail-latency collapse" has no figure: > 1x, DBLP faster, and said so.
    for name in ("tail_latency", "mean_latency"):
        c = claims.CLAIMS[name]
        assert c.region == claims.Region(1.0) and c.paper == claims.NO_FIGURE == "> 1x"
        assert "no figure" in c.source and c.comparison == "baselines"


@pytest.mark.parametrize("lo,hi,want,needle", [
    (4.2, 6.0, claims.REPRODUCED, "lies inside"),
    (4.0, 4.0, claims.REPRODUCED, "lies inside"),            # the edge belongs to the region
    (1.5, 3.9, claims.REFUTED, "lies outside"),
    (3.5, 5.0, claims.UNRESOLVED, "straddles the region's edge at 4"),
])
def test_the_verdict_comes_from_the_whole_interval_never_the_point(lo, hi, want, needle):
    v, why = claims.verdict(_iv(lo, hi), claims.CLAIMS["burst_speedup"].region)
    assert v == want and needle in why


def test_a_two_sided_region_refutes_from_either_side():
    region = claims.CLAIMS["train_time_cut"].region
    assert claims.verdict(_iv(40, 60), region)[0] == claims.REFUTED
    assert claims.verdict(_iv(1, 10), region)[0] == claims.REFUTED
    assert claims.verdict(_iv(30, 40), region) == (
        claims.UNRESOLVED, "the 95 % interval [30, 40] straddles the region's edge at 34")


def test_no_interval_or_one_seed_is_said():
    region = claims.CLAIMS["accuracy"].region
    assert claims.verdict(None, region, "arm dblp: no evaluations") == (
        claims.UNRESOLVED, "arm dblp: no evaluations")
    v, why = claims.verdict(_iv(-0.2, 0.1, n_seeds=1), region)
    assert v == claims.REPRODUCED and "one seed: a round bootstrap" in why


ALL_ARMS = ["gloo", "static", "dblp", "static-high", "dblp-tcp", "static-tcp",
            "dblp-sharded", "static-sharded", "static-high-sharded"]


def test_pairs_come_from_the_arms_registry_and_only_from_arms_that_ran():
    c = claims.COMPARISONS
    assert c["paper"].pairs(ALL_ARMS) == [("dblp", "static"), ("dblp-tcp", "static-tcp"),
                                          ("dblp-sharded", "static-sharded")]
    assert c["loose_bound"].pairs(ALL_ARMS) == [("static-high", "static"),
                                                ("static-high-sharded", "static-sharded")]
    assert c["phase_awareness"].pairs(ALL_ARMS) == [("dblp", "static-high"),
                                                    ("dblp-sharded", "static-high-sharded")]
    assert c["against_gloo"].pairs(ALL_ARMS) == [("dblp-sharded", "gloo"), ("static-sharded", "gloo"),
                                                 ("static-high-sharded", "gloo")]
    assert c["paper"].pairs(["gloo", "dblp", "static-tcp"]) == []
    assert c["baselines"].pairs(ALL_ARMS) == c["paper"].pairs(ALL_ARMS) + [
        ("dblp", "gloo"), ("dblp-tcp", "gloo"), ("dblp-sharded", "gloo")]


def _verdicts(out, claim) -> dict:
    """pair -> verdict entry of one claim (the summary's list, keyed for the test)."""
    return {v["pair"]: v for v in out["verdicts"] if v["claim"] == claim}


def _truth(**over):
    return {**TRUTH, **{arm: tuple(v) for arm, v in over.items()}}


def test_judge_gives_each_claim_its_verdict_from_known_data():
    # dblp vs static: burst speedup 5x (reproduced), cut ~50 % (refuted: outside 17-34 %),
    # accuracy -0.3 points with little noise (reproduced: at most 0.5 points lost).
    rounds, evals = synthetic(seeds=tuple(range(6)), arms=("static", "dblp"), acc_sd=0.0003)
    out = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, resamples=2000)
    assert [(v["claim"], v["pair"], v["verdict"]) for v in out["verdicts"]] == [
        ("burst_speedup", "dblp_vs_static", claims.REPRODUCED),
        ("train_time_cut", "dblp_vs_static", claims.REFUTED),
        ("accuracy", "dblp_vs_static", claims.REPRODUCED),
        ("tail_latency", "dblp_vs_static", claims.REPRODUCED),     # p99: the burst rounds, ~5x
        ("mean_latency", "dblp_vs_static", claims.REPRODUCED)]     # ~2.9x
    pair = _verdicts(out, "burst_speedup")["dblp_vs_static"]
    assert pair["interval"]["n_seeds"] == 6 and pair["interval"]["lo"] >= 4.0
    assert pair["region"] == [4.0, None] and pair["paper"] == "4.0-5.88x"
    fig = out["intervals"]["dblp_vs_static"]["figures"]
    assert set(fig) == set(iv.ESTIMATORS) and fig["time_to_target"]["interval"]["point"] > 1
    assert out["intervals"]["dblp_vs_static"]["comparison"] == "paper"


def test_an_interval_across_the_edge_is_unresolved():
    # A 4x speedup measured with wide spread straddles the region's edge at 4.
    rounds, evals = synthetic(seeds=(1, 2, 3), arms=("static", "dblp"), seed_sd=0.3,
                              truth=_truth(static=(400.0, 30.0, 100.0, 0.9)))
    out = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, resamples=2000)
    b = _verdicts(out, "burst_speedup")["dblp_vs_static"]
    assert b["verdict"] == claims.UNRESOLVED and "straddles the region's edge at 4" in b["reason"]


def test_missing_arms_leave_a_claim_unresolved_with_the_reason():
    rounds, evals = synthetic(seeds=(1, 2), arms=("gloo", "dblp"))
    out = claims.judge({"training": {}}, ["gloo", "dblp"], rounds, evals, resamples=500)
    paper = [c for c, claim in claims.CLAIMS.items() if claim.comparison == "paper"]
    assert [v["claim"] for v in out["verdicts"]] == paper + ["tail_latency", "mean_latency"]
    for v in out["verdicts"][:len(paper)]:        # one each, no pair
        assert v["verdict"] == claims.UNRESOLVED and v["pair"] is None and v["interval"] is None
        assert v["reason"].startswith("no pair of arms for it ran")
    # The tail and mean claims compare DBLP with every baseline, gloo too.
    assert [v["pair"] for v in out["verdicts"][len(paper):]] == ["dblp_vs_gloo"] * 2
    assert list(out["intervals"]) == ["dblp_vs_gloo"] and out["burst_levels"] == {}


def test_each_pair_gets_its_own_verdict():
    truth = _truth(**{"dblp-tcp": TRUTH["dblp"], "static-tcp": (150.0, 30.0, 100.0, 0.9)})
    arms = ["static", "dblp", "static-tcp", "dblp-tcp"]
    rounds, evals = synthetic(seeds=(1, 2, 3, 4), arms=arms, truth=truth)
    out = claims.judge({"training": {}}, arms, rounds, evals, resamples=1000)
    b = _verdicts(out, "burst_speedup")
    assert list(b) == ["dblp_vs_static", "dblp-tcp_vs_static-tcp"]
    assert b["dblp_vs_static"]["verdict"] == claims.REPRODUCED
    assert b["dblp-tcp_vs_static-tcp"]["verdict"] == claims.REFUTED   # 1.5x
    assert b["dblp-tcp_vs_static-tcp"]["arm"] == "dblp-tcp"


def test_the_target_comes_from_the_spec_else_the_reliable_arms_converged_accuracy():
    """Issue 55: 95 % of the converged accuracy of the arms no drop touched (gloo), the
    mean of their final evaluations; without one, of the lowest final accuracy."""
    rounds, evals = synthetic(seeds=(1, 2), arms=("static", "dblp", "gloo"), acc_sd=0.0)
    assert claims.target_metric({"training": {"target_accuracy": 0.8}}, evals) == (
        0.8, "spec training.target_accuracy")
    last = evals[evals["round"] == evals["round"].max()]
    converged = last[last["arm"] == "gloo"]["test_accuracy"].mean()
    for spec in ({"training": {}}, {"training": {"target_accuracy": 0}}, {}):
        t, source = claims.target_metric(spec, evals)
        assert t == pytest.approx(0.95 * converged)
        assert source.startswith("derived: 95% of the reliable arms' converged accuracy")
        assert "gloo" in source
    t, source = claims.target_metric({"training": {"target_accuracy": 1.5}}, evals)
    assert t == pytest.approx(0.95 * converged) and "is not in (0, 1], ignored" in source
    no_reliable = evals[evals["arm"] != "gloo"]
    t, source = claims.target_metric({"training": {}}, no_reliable)
    low = last[last["arm"] != "gloo"]["test_accuracy"].min()
    assert t == pytest.approx(0.95 * low) and "no reliable arm ran" in source
    assert claims.target_metric({"training": {}}, None) == (None, "no evaluations: no target")


def test_a_model_that_barely_learns_has_no_target():
    """A byte LM evaluates at 27 % before it learns and ends at 28-30 %: 95 % of that lies
    within a point of the first evaluation, where every arm is at once. No target then, and
    the reason says why, instead of a time to target that measures nothing."""
    evals = pd.DataFrame({"arm": ["gloo"] * 4 + ["static"] * 4, "seed": [1] * 8,
                          "round": [9, 19, 29, 39] * 2,
                          "test_accuracy": [0.271, 0.275, 0.28, 0.283, 0.271, 0.274, 0.28, 0.28]})
    t, source = claims.target_metric({"training": {}}, evals)
    assert t is None and "the model learns too little" in source
    assert "within 1 point of the first evaluation's 0.2710" in source


def test_time_to_target_section_per_arm_and_seed():
    rounds, evals = synthetic(seeds=(1, 2), arms=("static", "dblp"))
    out = claims.judge({"training": {"target_accuracy": 0.86}}, ["static", "dblp"], rounds, evals,
                       resamples=500)
    t = out["time_to_target"]
    assert t["target"] == 0.86 and t["source"] == "spec training.target_accuracy"
    assert t["per_arm"]["static"]["reached"] == 2 and set(t["per_arm"]["static"]["t_s"]) == {"1", "2"}
    assert t["per_arm"]["dblp"]["reached"] == 2       # 0.897 x (0.5 + 0.5 x 60/60) >= 0.86
    assert t["per_arm"]["static"]["t_s_median"] > t["per_arm"]["dblp"]["t_s_median"]


def test_with_verdicts_keeps_the_summary_declared_and_warns_on_one_seed():
    rounds, evals = synthetic(seeds=(1,), arms=("static", "dblp"))
    base = {"arms_order": ["static", "dblp"], "definitions": {"latency": "x"}, "warnings": ["w"],
            "arms": {"static": {"rounds": SYNTH_ROUNDS}, "dblp": {"rounds": SYNTH_ROUNDS}}}
    out = claims.with_verdicts(base, {"training": {}}, rounds, evals, resamples=500)
    assert out["definitions"]["latency"] == "x" and "verdict" in out["definitions"]
    # Each arm carries its median time to target beside its other figures.
    for arm in ("static", "dblp"):
        assert out["arms"][arm]["rounds"] == SYNTH_ROUNDS
        assert out["arms"][arm]["time_to_target_s"] == out["time_to_target"]["per_arm"][arm][
            "t_s_median"] > 0
    assert out["warnings"][0] == "w" and "one seed per arm (dblp_vs_static)" in out["warnings"][1]
    acc = _verdicts(out, "accuracy")["dblp_vs_static"]
    assert acc["reason"].startswith("too few seeds (1): one value per seed and only 1 seed")
    assert acc["too_few_seeds"] == {"seeds": 1, "needed": None, "edge": None}
    assert answer.verdict_label(acc) == "unresolved: too few seeds (1)"
    assert json.loads(json.dumps(out, allow_nan=False)) == out      # plain JSON, no NaN


def test_an_accuracy_interval_across_the_edge_is_too_few_seeds_with_an_estimate():
    """Three seeds of a -0.45 point difference with 0.1 points of noise per final evaluation
    (this generator seed draws -0.35 [-0.69, -0.01]): the t interval straddles -0.5, and the
    verdict says so as too few seeds, with how many would clear it; a burst speedup that
    straddles stays a plain "straddles" (its rounds are pooled)."""
    truth = _truth(dblp=(400.0, 24.0, 75.0, 0.8955), static=(400.0, 30.0, 100.0, 0.9))
    rounds, evals = synthetic(seeds=(1, 2, 3), arms=("static", "dblp"), acc_sd=0.001,
                              truth=truth, seed_sd=0.3, rng=1)
    out = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, resamples=500)
    acc = _verdicts(out, "accuracy")["dblp_vs_static"]
    got = iv.Interval(**acc["interval"])
    assert got.lo < -0.5 < got.hi and acc["verdict"] == claims.UNRESOLVED
    short = acc["too_few_seeds"]
    assert short["seeds"] == 3 and short["edge"] == -0.5
    assert short["needed"] == iv.seeds_to_clear(got, -0.5) and short["needed"] > 3
    assert acc["reason"].startswith("too few seeds (3): the 95 % interval")
    assert f"about {short['needed']} seeds would" in acc["reason"]
    assert answer.verdict_label(acc) == f"unresolved: too few seeds (3; about {short['needed']} needed)"
    burst = _verdicts(out, "burst_speedup")["dblp_vs_static"]
    assert "too_few_seeds" not in burst
    check_fields(acc, formats.SUMMARY_VERDICT_FIELDS, "verdict")
    check_fields(short, formats.SUMMARY_TOO_FEW_SEEDS_FIELDS, "too_few_seeds")


def test_a_reproduced_or_refuted_accuracy_verdict_is_never_too_few_seeds():
    rounds, evals = synthetic(seeds=tuple(range(6)), arms=("static", "dblp"), acc_sd=0.0003)
    out = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, resamples=500)
    acc = _verdicts(out, "accuracy")["dblp_vs_static"]
    assert acc["verdict"] == claims.REPRODUCED and "too_few_seeds" not in acc


def test_rejudging_a_committed_reference_keeps_its_figures_of_rounds(tmp_path):
    """The default reference judged again from the files it keeps: the burst speedup's
    bootstrap comes out as the run's analysis gave it (same tables, same seed), every figure
    with one value per seed is Student's t over the seeds, and the summary is declared."""
    import shutil

    from testbed.references import REFERENCE_DIR
    ref = tmp_path / "default"
    shutil.copytree(REFERENCE_DIR / "default", ref)
    before = json.loads((ref / "summary.json").read_text())
    after = claims.rejudge(ref)
    assert json.loads((ref / "summary.json").read_text()) == after
    assert after["schema"] == formats.SUMMARY_SCHEMA
    for key, pair in before["intervals"].items():
        figs = after["intervals"][key]["figures"]
        assert figs["burst_speedup"] == pair["figures"]["burst_speedup"], key
        assert figs["accuracy_delta"]["interval"]["method"] == iv.T_METHOD
        assert figs["train_time_cut"]["interval"]["method"] == iv.T_VALUES_METHOD
        assert figs["train_time_cut"]["interval"]["n_seeds"] == 3
    def kept(s):   # what judging does not touch: arms' time to target follows the target
        out = {k: v for k, v in s.items()
               if k not in claims.JUDGED_SECTIONS + ("schema", "definitions", "arms")}
        out["arms"] = {a: {k: x for k, x in v.items() if k != "time_to_target_s"}
                       for a, v in s["arms"].items()}
        return out
    assert kept(after) == kept(before)
