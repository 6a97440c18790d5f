"""A round-locked burst that lasted its whole cap decided its rounds: flagged, never a speedup."""
import math

import pandas as pd
import pytest

from testbed.analysis import intervals as iv
from testbed.analysis import summary, tables
from testbed.config.presets import PRESETS
from testbed.config.spec import load

MS = 1_000_000


def test_a_burst_is_capped_only_when_round_locked_and_it_lasted_its_cap():
    assert tables._cap(("round-locked", 3000.0), 0, 3000 * MS)["capped"] is True
    assert tables._cap(("round-locked", 3000.0), 0, 2997 * MS)["capped"] is True   # within slack
    assert tables._cap(("round-locked", 3000.0), 0, 2400 * MS)["capped"] is False  # the round ended it
    assert tables._cap(("fixed", math.nan), 0, 1000 * MS) == {
        "model": "fixed", "cap_ms": pytest.approx(math.nan, nan_ok=True), "capped": False}
    assert tables._cap(("manual", math.nan), None, None)["capped"] is False


def test_each_burst_s_model_comes_from_the_run_s_schedule():
    from testbed.rundir import resolve_bursts

    smoke = tables.burst_models(resolve_bursts(load(None, PRESETS["smoke"])))
    assert smoke and set(smoke.values()) == {("round-locked", 3000.0)}
    assert [m for m, _ in tables.burst_models(resolve_bursts(load(None, PRESETS["ci"]))).values()
            ] == ["fixed"] * 5
    default = tables.burst_models(resolve_bursts(load(None, PRESETS["default"])))
    assert [m for m, _ in default.values()] == ["fixed"] * 4   # bursts at rounds 5, 15, 25, 35


def test_the_recorded_schedule_wins_over_the_spec(tmp_path):
    """A run's burst_schedule.json says what ran, even if the spec would resolve otherwise."""
    import json

    from testbed.rundir import read_burst_schedule, resolve_bursts

    spec = load(None, PRESETS["default"])
    doc = resolve_bursts(load(None, PRESETS["smoke"])).to_dict()   # one round-locked burst
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "burst_schedule.json").write_text(json.dumps(doc))
    assert tables.burst_models(read_burst_schedule(tmp_path, spec)) == {
        "b000": ("round-locked", 3000.0)}
    assert [m for m, _ in tables.burst_models(read_burst_schedule(tmp_path / "nothing", spec))
            .values()] == ["fixed"] * 4


def _frames(capped: bool):
    rows = []
    for arm, lat in (("static", 3000.0), ("dblp", 2900.0)):
        for r in range(8):
            burst = r % 2 == 0
            rows.append({"arm": arm, "seed": 1, "round": r, "in_burst": burst,
                         "burst_capped": burst and capped, "latency_ms": lat if burst else 500.0,
                         "duration_ms": lat if burst else 500.0})
    return iv.RunFrames(pd.DataFrame(rows), None, None, "test_accuracy")


def test_the_burst_speedup_refuses_rounds_a_cap_decided():
    assert iv.burst_speedup(_frames(False), "dblp", "static", resamples=200).point == pytest.approx(
        3000 / 2900)
    with pytest.raises(ValueError, match="cap"):
        iv.burst_speedup(_frames(True), "dblp", "static", resamples=200)


def test_join_marks_rounds_a_capped_burst_hit():
    rounds = pd.DataFrame({"arm": ["a", "a"], "seed": [1, 1], "round": [0, 1],
                           "t_start_ns": [0, 4000 * MS], "t_end_ns": [3500 * MS, 4500 * MS]})
    bursts = pd.DataFrame({"arm": ["a"], "seed": [1], "id": ["b000"],
                           "actual_start_ns": [10 * MS], "actual_end_ns": [3010 * MS],
                           "measured_loss": [0.8], "requested_loss": [0.8], "capped": [True]})
    j = tables.join_bursts(rounds, bursts)
    assert j["burst_capped"].tolist() == [True, False]
    assert summary._capped_rounds(j) == 1
