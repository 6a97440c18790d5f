"""`dblp-testbed regime`: the cells, resuming and stopping, and what the committed map says."""
import json
import math
import pathlib

import pandas as pd
import pytest

from testbed import REPO_ROOT
from testbed import physics as phys
from testbed.analysis import regime as analysis
from testbed.errors import ExperimentFailed, InputError
from testbed.run import regime

pytestmark = pytest.mark.unit
REFERENCE = REPO_ROOT / "results" / "reference" / "regime"


def test_every_cell_of_every_map_is_a_valid_run_with_its_bursts():
    for m in regime.MAPS.values():
        names = [c.name for c in m.cells]
        assert len(set(names)) == len(names), m.name
        for c in m.cells:
            spec = m.spec(c)
            every = spec["burst_every"]
            assert spec.arms == list(c.arms(m.arms))
            assert set(spec.arms) <= set(m.arms[c.control])
            assert spec["bursts"] == []          # only the cell's bursts hit
            assert (every["enabled"], every["p"], every["target"], every["kind"]) == \
                (True, c.p, c.target, c.kind)
            # Fixed-duration unless round-locked; round-locked ones are cut at the cap.
            assert every["duration_ms"] == (0 if c.duration == regime.ROUND else c.duration)
            assert every["max_ms"] == regime.CAP_MS
            hit = range(every["start_round"], spec["training"]["rounds"], every["every"])
            assert len(hit) == m.bursts
            # The bound follows the burst: on the pull path only for the server's uplink.
            inputs, _ = phys.inputs_for_run(spec, {"rtt_ms": 1.0}, 1e6)
            assert inputs.burst_on_pull == (c.target == "server-uplink")
    full = regime.MAPS["full"]
    assert regime.MAPS["reduced"].bursts == full.bursts == regime.MIN_BURSTS == 5
    grid = {(c.duration, c.p, c.control) for c in full.cells if c.target == "server-downlink"
            and c.kind == "loss"}
    assert grid == {(d, p, ctl) for d in (50.0, 200.0, 1000.0, regime.ROUND)
                    for p in (0.3, 0.6, 0.9) for ctl in ("udp", "tcp")}
    assert {c.name for c in regime.PLACES} == {"udp-1000ms-p60-server-uplink",
                                               "udp-1000ms-p60-core-uplinks", "udp-1000ms-congest"}
    assert all(m.spec(c)["topology"]["kind"] == "fattree" for m in (full, regime.MAPS["reduced"])
               for c in m.cells)
    with pytest.raises(InputError, match="has no cell 'udp-7ms-p10'; choose from"):
        full.select(("udp-7ms-p10",))


def _fake(calls, status=lambda name: "ok"):
    def run(spec, out):
        out = pathlib.Path(out)
        calls.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        st = status(out.name)
        (out / "manifest.json").write_text(json.dumps({"status": st}))
        return st
    return run


def test_a_resumed_map_runs_only_the_unfinished_cells_and_ctrl_c_stops_the_whole_map(tmp_path):
    m = regime.RegimeMap("t", "smoke", (regime.Cell(regime.ROUND, 0.9, "udp"),
                                        regime.Cell(200.0, 0.9, "udp"),
                                        regime.Cell(200.0, 0.5, "tcp")), doc="", bursts=2)
    calls: list[str] = []
    # SIGINT in the second cell: the map stops there (the third never starts), the plan says so.
    with pytest.raises(ExperimentFailed, match="stopped in udp-200ms-p90 .* resume"):
        m.execute(tmp_path, run_fn=_fake(calls, lambda n: "interrupted"
                                                 if n == "udp-200ms-p90" else "ok"))
    assert calls == ["udp-round-p90", "udp-200ms-p90"]
    plan = regime.RegimeMap.read_plan(tmp_path)
    assert {n: r["status"] for n, r in plan["runs"].items()} == {
        "udp-round-p90": "ok", "udp-200ms-p90": "interrupted"}
    calls.clear()
    plan = m.execute(tmp_path, run_fn=_fake(calls))
    assert calls == ["udp-200ms-p90", "tcp-200ms-p50"]   # the finished cell is not run again
    assert {r["status"] for r in plan["runs"].values()} == {"ok"}
    assert plan["runs"]["tcp-200ms-p50"]["cell"]["control"] == "tcp"
    assert [p.name for p in tmp_path.iterdir() if ".failed-" in p.name][0].startswith(
        "udp-200ms-p90.failed-")
    with pytest.raises(InputError, match="holds regime map 't', not 'smoke'"):
        regime.MAPS["smoke"].execute(tmp_path, run_fn=_fake([]))


def test_the_breakdown_names_the_phase_that_took_the_time():
    rounds = pd.DataFrame({
        "arm": ["static"] * 3, "in_burst": [True, True, False],
        "latency_ms": [3000.0, 3200.0, 900.0], "phys_bound_ms": [2000.0, 2000.0, 800.0],
        "stats_push_s": [2.5, 2.7, 0.5], "stats_pull_first_s": [2.6, 2.8, 0.6],
        "stats_pull_stop_s": [3.0, 3.2, 0.9], "stats_passes_push": [40, 44, 1],
        "stats_passes_pull": [1, 1, 1], "stats_probe_rounds": [40, 44, 1],
        "stats_retransmitted": [900, 950, 0]})
    b = analysis.breakdown(rounds, "static")
    assert b["rounds"] == 2 and b["push_s"] == pytest.approx(2.6) and b["wait_s"] == pytest.approx(0.1)
    assert b["pull_s"] == pytest.approx(0.4) and b["passes_push"] == 42
    why = analysis._why(b)
    assert why.startswith("the push took 2.60 s of 3.10 s over 42 data passes")
    assert analysis.breakdown(rounds.assign(in_burst=False), "static") is None


def test_the_committed_map_places_every_pair_and_explains_every_arm_far_from_its_bound():
    doc = analysis.read_summary(REFERENCE)
    plan = json.loads((REFERENCE / "regime.json").read_text())
    assert doc["map"] == "reduced" and doc["cells_run"] == len(plan["cells"]) == 8
    assert doc["wall_s"] <= 30 * 60          # the reduced map's promise
    for c in doc["cells"]:
        assert c["status"] == "ok" and c["bursts"] >= regime.MIN_BURSTS * len(c["arms"]), c["name"]
        for p in c["pairs"]:
            if p["capped"]:
                assert p["speedup"] is None     # a cap never becomes a speedup
            if p["arm"].startswith("static-high") and p["baseline"].startswith("static") \
                    and not p["capped"] and p["speedup"] is not None:
                assert p["bandwidth_ratio"] == pytest.approx(phys.bandwidth_ratio(0.008, 0.408))
                assert p["pass_ratio"] == pytest.approx(phys.pass_ratio(0.008, 0.408))
        for a in c["arms"]:
            far = a["over_bound"] is not None and a["over_bound"] > analysis.BOUND_FACTOR
            if far and a["emulator_kept_up"]:
                assert a["why"], (c["name"], a["arm"])
    # Every figure in the regime page's block (docs/results/regime.md) comes from this file.
    assert analysis.markdown(doc).count("\n") == len(doc["cells"]) + 1
    assert all(math.isfinite(a["bound_ms"]) for c in doc["cells"] for a in c["arms"]
               if a["bound_ms"] is not None)


def test_plans_and_summaries_of_another_version_are_refused_in_one_line(tmp_path):
    with pytest.raises(InputError, match="regime.json not found; run `dblp-testbed regime NAME"):
        regime.RegimeMap.read_plan(tmp_path)
    (tmp_path / "regime.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(InputError, match="has schema 99; this code reads 1: rerun the map"):
        regime.RegimeMap.read_plan(tmp_path)
    (tmp_path / "regime-summary.json").write_text("{not json")
    with pytest.raises(InputError, match="is not readable JSON .* rebuild it"):
        analysis.read_summary(tmp_path)


def test_an_arm_kept_up_only_while_none_of_its_units_broke_an_invariant():
    unit = {"arm": "static", "seed": 2, "reasons": ["cpu busy 95.0 % above 85.0 %"]}
    now = {"invalid_units": [unit]}
    assert analysis._invalid_reasons(now, "static") == ["seed 2: cpu busy 95.0 % above 85.0 %"]
    assert analysis._invalid_reasons(now, "dblp") == []
    # A summary from before the invariants decided (schema 3) has only its flags.
    assert analysis._invalid_reasons({"fidelity_flags": {"static": ["CPU 95 % busy"]}},
                                     "static") == ["CPU 95 % busy"]
