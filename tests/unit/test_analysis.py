"""Analysis of a hand-written run directory whose every answer is known in advance.

`make_run` writes a run directory (RUN/raw/ in the declared raw-log events of
`workloads.runlog`, spec.toml and manifest.json) with chosen
timings: three workers whose compute ends staggered (so only the
critical-path definition of latency gives the chosen numbers), two bursts per
arm of which the second touches the previous round's end exactly (so the
timestamp join must be strict), and per-arm end/eval events. With several
seeds, every arm repeats in raw/<arm>/seed-<seed>/ later on the clock, each
seed's timings offset by `SEED_SHIFT` (latencies, accuracies and training
times then vary by seed as `seed_factor` says).
"""
import dataclasses
import json
import math

import pytest

from testbed import physics
from testbed.analysis import summary
from testbed.analysis import tables as analysis
from testbed.analysis.arms import static_partner
from testbed.analysis.pipeline import Tables, build_outputs
from testbed.analysis.raw import RawError, load_raw
from testbed.testing.rundirs import (
    ACC,
    BURST,
    BURST_ROUNDS,
    GRAD,
    MS,
    NORMAL,
    ROUNDS,
    TRAIN,
    WORKERS,
    latency,
    make_run,
    round_start,
    seed_factor,
    unit_raw,
)

pytestmark = pytest.mark.unit

@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "run")


def test_rounds_latency_is_the_critical_path_and_join_is_exact(run_dir):
    raw = load_raw(run_dir)
    assert raw.arms == ["gloo", "static", "dblp"]  # spec order, not alphabetical
    bursts = analysis.bursts_table(raw)
    rounds = analysis.join_bursts(analysis.rounds_table(raw), bursts)
    assert len(rounds) == 3 * ROUNDS
    for r in rounds.itertuples():
        assert r.latency_ms == pytest.approx(latency(r.arm, r.round), abs=1e-6)
        # comm_s of rank 0 includes waiting for rank 2's compute: 2 ms more.
        assert r.comm_ms_max == pytest.approx(latency(r.arm, r.round) + 2, abs=1e-6)
        assert r.in_burst == (r.round in BURST_ROUNDS)
        assert r.workers == WORKERS
    hit = rounds[rounds["in_burst"]]
    assert sorted(hit[hit["arm"] == "dblp"]["burst_id"]) == ["dblp-b1", "dblp-b2"]
    # Burst 2 overlaps round 6's last millisecond: touched, not hit (1 ms < half of 42 ms).
    r6 = rounds[(rounds["arm"] == "static") & (rounds["round"] == 6)].iloc[0]
    assert r6.burst_touch and not r6.in_burst and r6.burst_overlap_ms == 0
    r7 = rounds[(rounds["arm"] == "static") & (rounds["round"] == 7)].iloc[0]
    # The whole 412 ms round is covered.
    assert r7.burst_overlap_ms == pytest.approx(412.0) and r7.burst_touch
    # gloo's round 7 lasts 812 ms: 500 ms covered, more than half of it.
    g7 = rounds[(rounds["arm"] == "gloo") & (rounds["round"] == 7)].iloc[0]
    assert g7.in_burst and g7.burst_overlap_ms == pytest.approx(500.0)
    r5 = rounds[(rounds["arm"] == "static") & (rounds["round"] == 5)].iloc[0]
    assert not r5.burst_touch
    # Stats are summed over workers, probe rounds are a maximum.
    assert r7.stats_bytes_sent == 3 * 4000 and r7.stats_retransmitted == 3
    assert r7.stats_probe_rounds == 2
    assert analysis.count_rounds_hit(bursts, rounds)["rounds_hit"].tolist() == [1] * 6


def test_summary_speedups_are_exact(run_dir):
    s = build_outputs(run_dir)
    assert s["status"] == "ok"
    assert s["baselines"] == ["gloo", "static"]
    a = s["arms"]
    for arm in ("gloo", "static", "dblp"):
        assert a[arm]["rounds"] == ROUNDS and a[arm]["burst_rounds"] == 2
        assert a[arm]["burst_round_ms_p50"] == pytest.approx(BURST[arm])
        assert a[arm]["burst_round_ms_max"] == pytest.approx(BURST[arm])
        assert a[arm]["normal_round_ms_p50"] == pytest.approx(NORMAL[arm])
        assert a[arm]["train_time_s"] == pytest.approx(TRAIN[arm])   # slowest worker
        assert a[arm]["final_accuracy"] == pytest.approx(ACC[arm])  # last eval, not the first
    sp = s["speedups"]
    assert set(sp) == {"dblp_vs_gloo", "dblp_vs_static", "static_vs_gloo", "gloo_vs_static"}
    assert sp["dblp_vs_static"]["burst_round"] == pytest.approx(4.0)
    assert sp["dblp_vs_gloo"]["burst_round"] == pytest.approx(8.0)
    assert sp["static_vs_gloo"]["burst_round"] == pytest.approx(2.0)
    assert sp["dblp_vs_static"]["normal_round"] == pytest.approx(30 / 24)
    assert sp["dblp_vs_static"]["train_time"] == pytest.approx(2.0 / 1.5)
    assert sp["dblp_vs_static"]["train_time_reduction_pct"] == pytest.approx(25.0)
    assert sp["dblp_vs_static"]["accuracy_delta"] == pytest.approx(-0.01)
    # Two burst rounds per arm: the ratio is anecdotal and the summary says so.
    assert any("only 2 round(s)" in w for w in sp["dblp_vs_static"]["warnings"])
    assert s["bursts"]["count"] == 6 and s["bursts"]["rounds_hit"] == 6
    assert s["bursts"]["dropped_packets"] == 3 * 20
    assert s["bursts"]["requested_loss"] == pytest.approx(0.8)
    for f in ("rounds.csv", "bursts.csv", "flows.csv", "rounds.parquet", "packets.parquet",
              "summary.json", "report.md",
              "report.html", "plots/latency_over_time.png", "plots/latency_cdf.png",
              "plots/burst_rounds.png", "plots/curves.png", "plots/bytes_per_round.png",
              "plots/bottleneck_over_time.png", "plots/bottleneck_over_time.svg",
              "queue.parquet", "queue.csv", "plots/queue_over_time.png"):
        assert (run_dir / f).stat().st_size > 0, f


def test_physics_bound_per_burst_round(run_dir):
    s = build_outputs(run_dir, figures=False)
    inp = s["physics"]["inputs"]
    assert inp["rate_bps"] == 20e6 and inp["rtt_s"] == pytest.approx(0.005)
    assert inp["grad_bytes"] == GRAD and inp["flows"] == WORKERS
    # Hand-computed: bits = 3 x 10000 x 8 = 240000; P = 0.408, p = 0.8:
    # push 240000 x 0.592 / 0.2 / 20e6 = 35.52 ms, pull 7.104 ms,
    # ceil(ln 0.408 / ln 0.8) = ceil(4.017) = 5 passes x 5 ms = 25 ms.
    assert s["arms"]["dblp"]["burst_round_phys_bound_ms_p50"] == pytest.approx(67.624)
    # P = 0.008, second burst (it covers the whole 400 ms round): push
    # 59.52 ms, pull 11.904 ms, 22 passes x 5 ms = 181.424 ms. The first
    # burst lasts 50 ms of the round: it lets through 0.2 x 20e6 x 0.05 =
    # 200000 of the 238080 bits needed, so 50 ms + 38080 bits at line rate
    # (1.904 ms) + pull 11.904 ms + one clean pass 5 ms = 68.808 ms.
    static_p50 = (181.424 + 68.808) / 2
    assert s["arms"]["static"]["burst_round_phys_bound_ms_p50"] == pytest.approx(static_p50)
    assert s["arms"]["static"]["burst_round_over_phys_bound"] == pytest.approx(400 / static_p50)
    assert s["arms"]["gloo"]["burst_round_phys_bound_ms_p50"] is None  # reliable: no bound
    pl = s["physics"]["pairs"]["dblp_vs_static"]
    assert pl["bandwidth_ratio"] == pytest.approx(0.992 / 0.592)
    assert pl["pass_ratio"] == pytest.approx(math.log(0.008) / math.log(0.408))
    assert pl["position"] == "between the bandwidth-bound and pass-bound ratios"
    assert pl["fraction"] == pytest.approx((4.0 - 0.992 / 0.592)
                                           / (math.log(0.008) / math.log(0.408) - 0.992 / 0.592))


def test_physics_formulas():
    assert physics.passes(0.008, 0.8) == 22
    assert physics.passes(0.408, 0.8) == 5
    assert physics.passes(0.5, 0.1) == 1          # the loss is already within the bound
    assert math.isnan(physics.passes(0.0, 0.8))   # reliable under loss: no finite pass count
    assert physics.bandwidth_ratio(0.008, 0.408) == pytest.approx(1.6757, abs=1e-4)
    assert physics.pass_ratio(0.008, 0.408) == pytest.approx(5.39, abs=0.01)
    assert physics.pass_ratio(0.024, 0.424) == pytest.approx(4.35, abs=0.01)
    inp = physics.PhysicsInputs(rate_bps=8e6, rtt_s=0.01, grad_bytes=1e6, flows=1,
                                include_pull=False)
    # 1 MB at 8 Mbit/s = 1 s; (1 - 0.5)/(1 - 0.5) = 1 pass of bytes; 1 pass x 10 ms.
    assert physics.round_bound_s(0.5, 0.5, inp) == pytest.approx(1.01)
    # Sharded, 4 ranks: rank 0's downlink takes 3 shards of pushes and 3 of
    # averages, 2 x 3/4 of the gradient = 1.5 MB = 1.5 s, then x (1-P)/(1-p).
    four = physics.PhysicsInputs(rate_bps=8e6, rtt_s=0.01, grad_bytes=1e6, flows=4)
    assert physics.round_bound_s(0.5, 0.5, four, mode="sharded") == pytest.approx(1.51)
    assert physics.round_bound_s(0.5, 0.5, four) == pytest.approx(4.0 + 2.0 + 0.01)   # ps
    with pytest.raises(ValueError, match="mode"):
        physics.round_bound_s(0.5, 0.5, four, mode="ring")
    with pytest.raises(ValueError, match="rate_bps"):
        physics.PhysicsInputs(rate_bps=0, rtt_s=0.01, grad_bytes=1)
    with pytest.raises(ValueError, match="unknown field"):
        physics.PhysicsInputs.from_dict({"rate_bps": 1, "rtt_s": 0, "grad_bytes": 1, "rate": 2})


def test_missing_rtt_gives_no_bound_and_says_why(tmp_path):
    run = make_run(tmp_path / "run", rtt_ms=None)
    s = build_outputs(run, figures=False)
    assert s["physics"]["missing_inputs"] == ["rtt_s"]
    assert s["arms"]["dblp"]["burst_round_phys_bound_ms_p50"] is None
    assert any("rtt_s" in w for w in s["warnings"])
    assert s["status"] == "partial" or s["status"] == "ok"


def test_incomplete_arm_and_truncated_line(tmp_path):
    run = make_run(tmp_path / "run")
    w = unit_raw(run, "dblp") / "worker1.jsonl"
    lines = w.read_text().splitlines()
    # A crashed worker: no end line, a half-written last line.
    w.write_text("\n".join(lines[:-1]) + '\n{"event": "round", "arm"')
    s = build_outputs(run, figures=False)
    assert s["arms"]["dblp"]["status"] == "incomplete"
    assert s["status"] == "partial"
    assert any("worker1.jsonl" in x and "not a JSON line" in x for x in s["warnings"])
    assert s["arms"]["gloo"]["status"] == "ok"


def test_no_raw_dir_is_a_clear_error(tmp_path):
    with pytest.raises(RawError, match="no raw/ directory"):
        load_raw(tmp_path)


def test_spread_warning_on_wide_burst_rounds(tmp_path):
    wide = dict(BURST)
    run = make_run(tmp_path / "run", burst=wide)
    # Make the two static burst rounds very different: 100 ms and 700 ms.
    p = unit_raw(run, "static")
    for rank in range(WORKERS):
        f = p / f"worker{rank}.jsonl"
        out = []
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "round" and e["round"] == 7:
                e["t_end_ns"] += 300 * MS
                e["comm_s"] += 0.3
            if e["event"] == "round" and e["round"] == 3:
                e["t_end_ns"] -= 300 * MS
                e["comm_s"] -= 0.3
            out.append(json.dumps(e))
        f.write_text("\n".join(out) + "\n")
    raw = load_raw(run)
    b = analysis.bursts_table(raw)
    r = analysis.join_bursts(analysis.rounds_table(raw), b)
    s = summary.summarize(Tables(raw, None, [], analysis.add_physics(r, None),
                                 analysis.count_rounds_hit(b, r), flows=None, packets=None,
                                 bottleneck=None, queue=None, evals=None, notes=[]))
    sp = s["speedups"]["dblp_vs_static"]
    assert sp["burst_round"] == pytest.approx(4.0)           # median unchanged
    assert sp["burst_round_spread"] == pytest.approx(550 / 250)
    assert sp["burst_round_low"] == pytest.approx(250 / 100)
    assert sp["burst_round_high"] == pytest.approx(550 / 100)


def test_default_run_targets(run_dir):
    s = build_outputs(run_dir, figures=False)
    t = {x["target"]: x for x in s["targets"]}
    b = t["static: burst-round p50 within 1.5x of its bound"]
    assert b["value"] == pytest.approx(400 / ((181.424 + 68.808) / 2)) and b["met"] is False
    assert t["dblp: burst-round p50 within 1.5x of its bound"]["met"] is True   # 100 / 67.624
    sp = t["dblp vs static: burst-round speedup >= bandwidth-bound ratio 1.68x"]
    assert sp["value"] == pytest.approx(4.0) and sp["met"] is True
    assert t["dblp vs static: shorter end-to-end training"]["met"] is True
    acc = t["dblp vs static: final accuracy within 1 point"]
    assert acc["value"] == pytest.approx(-1.0) and acc["met"] is True
    assert t["dblp vs gloo: lower burst-round p50"]["value"] == pytest.approx(8.0)


def test_arm_that_never_started_and_foreign_dirs(tmp_path):
    run = make_run(tmp_path / "run", arms=("static", "dblp"))
    spec = (run / "spec.toml").read_text().replace('arms = ["static", "dblp"]',
                                                   'arms = ["static", "dblp", "gloo"]')
    (run / "spec.toml").write_text(spec)
    (run / "raw" / "fabric").mkdir()              # not an arm: no JSON lines
    (run / "raw" / "fabric" / "ovs.log").write_text("x")
    s = build_outputs(run, figures=False)
    assert s["arms_order"] == ["static", "dblp", "gloo"]
    assert s["arms"]["gloo"]["status"] == "no data" and s["status"] == "partial"
    assert any("raw/gloo/seed-1/" in w for w in s["warnings"])
    assert s["speedups"]["dblp_vs_static"]["burst_round"] == pytest.approx(4.0)


def test_paper_arms_pair_each_dblp_with_its_control_path(tmp_path):
    arms = ("static", "dblp", "static-tcp", "dblp-tcp", "gloo")
    run = make_run(tmp_path / "run", arms=arms)
    s = build_outputs(run)
    assert s["baselines"] == ["static", "static-tcp", "gloo"]
    sp = s["speedups"]
    assert sp["dblp-tcp_vs_static-tcp"]["burst_round"] == pytest.approx(6.0)
    assert sp["dblp_vs_static-tcp"]["burst_round"] == pytest.approx(9.0)
    assert sp["dblp-tcp_vs_static"]["train_time"] == pytest.approx(2.0 / 1.6)
    assert "dblp_vs_dblp-tcp" not in sp and "static_vs_static-tcp" in sp
    pairs = s["physics"]["pairs"]
    assert sorted(pairs) == ["dblp-tcp_vs_static-tcp", "dblp_vs_static"]
    # 6x is above ln(0.008)/ln(0.408) = 5.39x: the pass-bound end, where the paper's 5.88x sits.
    assert pairs["dblp-tcp_vs_static-tcp"]["position"] == "above the pass-bound ratio"
    md = (run / "report.md").read_text()
    assert "dblp-tcp burst speedup" in md and "Several control paths ran" in md


def test_dblp_in_critical_phase_is_not_placed():
    pl = physics.place_speedup(1.17, 0.008, 0.008)
    assert pl["position"].startswith("not applicable") and pl["fraction"] is None


def test_relaxed_phase_speedup(tmp_path):
    # dblp's round 3 falls in its critical phase (bound 0.008) here: only round 7 is relaxed.
    run = make_run(tmp_path / "run")
    for rank in range(WORKERS):
        f = unit_raw(run, "dblp") / f"worker{rank}.jsonl"
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        for e in lines:
            if e["event"] == "round" and e["round"] == 3:
                e["bound"], e["phase"] = 0.008, "critical"
        f.write_text("".join(json.dumps(e) + "\n" for e in lines))
    s = build_outputs(run, figures=False)
    pl = s["physics"]["pairs"]["dblp_vs_static"]
    assert pl["relaxed_rounds"] == 1 and pl["speedup_relaxed_rounds"] == pytest.approx(4.0)
    assert pl["p_high"] == pytest.approx(0.408)   # the spec's P_high


def test_round_line_without_timestamps_is_skipped_and_said(tmp_path):
    run = make_run(tmp_path / "run")
    with open(unit_raw(run, "static") / "worker2.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "round", "arm": "static", "rank": 2, "round": 99}) + "\n")
    s = build_outputs(run, figures=False)
    assert s["arms"]["static"]["rounds"] == ROUNDS
    assert sum(w.startswith("raw/static/seed-1/worker2.jsonl:") and "missing" in w
               for w in s["warnings"]) == 1


def test_static_high_separates_the_loose_bound_from_phase_awareness(tmp_path):
    run = make_run(tmp_path / "run", arms=("gloo", "static", "static-high", "dblp"))
    s = build_outputs(run, figures=False)
    assert s["baselines"] == ["gloo", "static", "static-high"]
    sp = s["speedups"]
    # What the loose bound buys (static-high vs static) ...
    assert sp["static-high_vs_static"]["burst_round"] == pytest.approx(400 / 80)
    # ... and what phase-awareness buys on top of it (dblp vs static-high).
    assert sp["dblp_vs_static-high"]["accuracy_delta"] == pytest.approx(0.05)
    assert sp["dblp_vs_static-high"]["train_time"] == pytest.approx(1.2 / 1.5)
    # The physics pairs DBLP with the static arm at P_low only, found through the registry.
    assert sorted(s["physics"]["pairs"]) == ["dblp_vs_static"]
    assert static_partner("dblp", s["arms_order"]) == "static"
    assert static_partner("dblp", s["arms_order"], "p_high") == "static-high"
    assert static_partner("dblp-tcp", s["arms_order"], "p_high") is None


def test_summary_counts_each_dblp_arms_phase_switches(tmp_path):
    run = make_run(tmp_path / "run")
    s = build_outputs(run)
    # critical in rounds 0-1, relaxed from round 2: one switch; arms without a phase: null.
    assert s["arms"]["dblp"]["phase_switches"] == 1
    assert s["arms"]["static"]["phase_switches"] is None
    assert s["arms"]["gloo"]["phase_switches"] is None
    # The timeline of the detector's phase, for the arms that have one.
    assert (run / "plots" / "phase_timeline.png").stat().st_size > 0
    assert "phase_timeline.png" in (run / "report.md").read_text()


def test_a_burst_shorter_than_the_round_bounds_the_round_by_its_length():
    inp = physics.PhysicsInputs(rate_bps=10e6, rtt_s=0.002, grad_bytes=1e6, flows=4)
    whole = physics.round_bound_s(0.008, 0.8, inp, mode="sharded")
    # 12 Mbit needed; a 100 ms burst lets 0.2 Mbit through: 0.1 s + 11.8 Mbit / 10 Mbit/s + 1 RTT.
    need = 2 * 3 / 4 * 1e6 * 8 * 0.992
    short = physics.round_bound_s(0.008, 0.8, inp, mode="sharded", burst_s=0.1)
    assert short == pytest.approx(0.1 + (need - 0.2e6) / 10e6 + 0.002)
    assert short < whole
    # A reliable transport gets a finite bound once the burst ends mid-round...
    assert physics.round_bound_s(0.0, 0.8, inp, mode="sharded", burst_s=0.1) == pytest.approx(
        0.1 + (need / 0.992 - 0.2e6) / 10e6 + 0.002)
    # ...and none under a burst that lasts the whole round.
    assert math.isnan(physics.round_bound_s(0.0, 0.8, inp, mode="sharded"))
    # A burst long enough for the whole round gives the whole-round bound.
    assert physics.round_bound_s(0.008, 0.8, inp, mode="sharded", burst_s=100.0) == whole


def test_a_burst_on_the_pull_path_meets_only_what_is_left_of_it_when_the_push_ends():
    """Parameter server, burst on the server's uplink: the push is clean, the pull starts after it."""
    down = physics.PhysicsInputs(rate_bps=10e6, rtt_s=0.002, grad_bytes=1e6, flows=4)
    up = dataclasses.replace(down, burst_on_pull=True)
    need = 4 * 1e6 * 8 * 0.992                      # 31.7 Mbit each way: 3.17 s at line rate
    # A 1 s burst is over before the pull begins: the loss-free round.
    assert physics.round_bound_s(0.008, 0.9, up, burst_s=1.0) == pytest.approx(
        2 * need / 10e6 + 0.002)
    # A 5 s burst leaves 1.83 s of itself to the pull, at 10 % of the rate.
    left = 5.0 - need / 10e6
    assert physics.round_bound_s(0.008, 0.9, up, burst_s=5.0) == pytest.approx(
        need / 10e6 + left + (need - 0.1 * 10e6 * left) / 10e6 + 0.002)
    # A round-locked burst takes the whole pull: (1-P)/(1-p) of it and the passes' probes.
    assert physics.round_bound_s(0.008, 0.9, up) == pytest.approx(
        need / 10e6 + need / 0.1 / 10e6 + 46 * 0.002)
    # Each is below the downlink's bound for the same burst (the push meets the burst there
    # from the round's start), and sharded mode is symmetric: the same either way.
    assert physics.round_bound_s(0.008, 0.9, up, burst_s=1.0) < \
        physics.round_bound_s(0.008, 0.9, down, burst_s=1.0)
    assert physics.round_bound_s(0.008, 0.9, up, mode="sharded", burst_s=1.0) == \
        physics.round_bound_s(0.008, 0.9, down, mode="sharded", burst_s=1.0)


def test_summary_pools_every_seed_of_an_arm(tmp_path):
    """Two arms x two seeds; seed 2's latencies and training times are 1.5x seed 1's."""
    run = make_run(tmp_path / "run", arms=("static", "dblp"), seeds=(1, 2))
    s = build_outputs(run, figures=False)
    d, st = s["arms"]["dblp"], s["arms"]["static"]
    assert (d["rounds"], d["burst_rounds"], d["status"]) == (2 * ROUNDS, 4, "ok")
    # Percentiles over the rounds of both seeds: burst rounds 100, 100, 150, 150 ms.
    assert d["burst_round_ms_p50"] == pytest.approx(125.0)
    assert d["normal_round_ms_p50"] == pytest.approx((24.0 + 36.0) / 2)
    assert st["burst_round_ms_p50"] == pytest.approx(500.0)
    assert s["speedups"]["dblp_vs_static"]["burst_round"] == pytest.approx(4.0)
    assert s["speedups"]["dblp_vs_static"]["burst_round_n"] == [4, 4]
    # Once-per-training figures are means over seeds.
    assert d["train_time_s"] == pytest.approx((1.5 + 2.25) / 2)
    assert d["final_accuracy"] == pytest.approx((0.95 + 0.94) / 2)
    assert s["speedups"]["dblp_vs_static"]["train_time"] == pytest.approx(2.5 / 1.875)
    assert d["phase_switches"] == 1 and st["phase_switches"] is None
    assert s["bursts"]["count"] == 8 and s["bursts"]["per_arm"] == {"static": 4, "dblp": 4}
    assert s["bursts"]["rounds_hit"] == 8
    # The manifest's record of each unit, by seed.
    assert sorted(s["fidelity"]["dblp"]) == ["1", "2"]
    assert s["fidelity"]["dblp"]["2"]["started_ns"] == round_start("dblp", 0, 2) - 2 * MS
    assert not [w for w in s["warnings"] if "seed" in w]


def test_unit_summary_keeps_each_seeds_figures(tmp_path):
    run = make_run(tmp_path / "run", arms=("static", "dblp"), seeds=(2, 3))
    raw = load_raw(run)
    assert raw.seeds == [2, 3] and raw.units == [("static", 2), ("dblp", 2), ("static", 3),
                                                 ("dblp", 3)]
    b = analysis.bursts_table(raw)
    r = analysis.join_bursts(analysis.rounds_table(raw), b)
    u = summary.unit_summary(raw, r).set_index(["arm", "seed"])
    assert list(u.index) == raw.units
    assert u.loc[("dblp", 2), "train_time_s"] == pytest.approx(1.5 * seed_factor(2))
    assert u.loc[("dblp", 3), "final_accuracy"] == pytest.approx(0.95 - 0.02)
    assert u.loc[("dblp", 3), "phase_switches"] == 1
    assert math.isnan(u.loc[("static", 2), "phase_switches"])
    assert (u["burst_rounds"] == 2).all() and (u["status"] == "ok").all()
    ev = analysis.evals_table(raw, r)
    assert list(ev.columns[:2]) == ["arm", "seed"] and set(ev["seed"]) == {2, 3}


def test_raw_lines_of_another_seed_or_outside_the_seeds_are_said(tmp_path):
    run = make_run(tmp_path / "run", arms=("static", "dblp"), seeds=(1, 2))
    # A burst line of seed 1 in seed 2's directory: skipped, and said.
    with open(unit_raw(run, "dblp", 2) / "bursts.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "burst", "arm": "dblp", "seed": 1, "id": "x", "kind": "loss",
                             "target": "server-downlink", "params": {"p": 0.5}, "trigger": "manual",
                             "requested_start_ns": 1, "requested_end_ns": 2, "actual_start_ns": 1,
                             "actual_end_ns": 2, "dropped_packets": 0}) + "\n")
    # A manual burst (no unit announced it) in raw/<arm>/: placed in the unit running then.
    t = round_start("dblp", 5, 2) + 100 * MS
    manual = {"event": "burst", "arm": "dblp", "id": "m001", "kind": "loss",
              "target": "server-downlink", "params": {"p": 0.5}, "trigger": "manual",
              "requested_start_ns": t, "requested_end_ns": t + 300 * MS, "actual_start_ns": t,
              "actual_end_ns": t + 300 * MS, "dropped_packets": 3}
    late = dict(manual, id="m002", requested_start_ns=t + 10**13, actual_start_ns=t + 10**13,
                requested_end_ns=t + 10**13 + 1, actual_end_ns=t + 10**13 + 1)
    (run / "raw" / "dblp" / "bursts.jsonl").write_text(json.dumps(manual) + "\n" + json.dumps(late) + "\n")
    # A seed the spec does not have, and a unit that never started.
    stray = run / "raw" / "static" / "seed-9"
    stray.mkdir()
    (stray / "worker0.jsonl").write_text("")
    for f in unit_raw(run, "static", 2).iterdir():
        f.unlink()
    unit_raw(run, "static", 2).rmdir()
    raw = load_raw(run)
    p = raw.problems
    assert any(x.startswith("raw/dblp/seed-2/bursts.jsonl:3: event of seed 1") for x in p), p
    assert "raw/static/seed-9/: not a seed of the spec (1, 2), ignored" in p
    assert "arm static seed 2: no raw/static/seed-2/ directory (the unit never started)" in p
    assert "raw/dblp/bursts.jsonl: burst m002 started outside every unit of arm dblp, ignored" in p
    b = analysis.bursts_table(raw).set_index(["arm", "seed", "id"])
    assert b.loc[("dblp", 2, "m001"), "dropped_packets"] == 3 and ("dblp", 2, "x") not in b.index
    s = build_outputs(run, figures=False)
    assert s["arms"]["static"]["status"] == "no data"
    assert "arm static seed 2: status no data" in s["warnings"]
