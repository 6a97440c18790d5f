"""Progress for the whole run: which unit of how many runs, and when the run will end."""
import json

import pytest

from testbed.run.progress import Progress, RunClock, run_remaining_s, span

pytestmark = pytest.mark.unit

UNITS = [("gloo", 0), ("dblp", 0), ("gloo", 1), ("dblp", 1)]


def test_later_units_are_estimated_from_their_arms_finished_units():
    # gloo s0 took 10 s and dblp s0 30 s; gloo s1 has run 4 s and says 2 s are left.
    left = run_remaining_s(UNITS, 2, {"gloo": [10.0], "dblp": [30.0]}, 4.0, 2.0)
    assert left == pytest.approx(2.0 + 30.0)
    # Two finished units of one arm: their mean.
    left = run_remaining_s(UNITS, 2, {"gloo": [10.0, 20.0], "dblp": [30.0]}, 4.0, 2.0)
    assert left == pytest.approx(2.0 + 30.0)
    # Before its first round, the running unit is its arm's estimate less what it ran.
    assert run_remaining_s(UNITS, 2, {"gloo": [10.0, 20.0], "dblp": [30.0]}, 4.0, None) == \
        pytest.approx((15.0 - 4.0) + 30.0)


def test_an_arm_that_never_finished_takes_the_mean_of_every_finished_unit():
    # dblp s0 runs; only gloo s0 (10 s) finished: gloo s1 is estimated at gloo's own 10 s,
    # dblp s1 at the mean of every finished unit (10 s).
    assert run_remaining_s(UNITS, 1, {"gloo": [10.0]}, 5.0, 15.0) == pytest.approx(15 + 10 + 10)
    assert run_remaining_s(UNITS, 1, {"gloo": [10.0]}, 12.0, None) == pytest.approx(0 + 10 + 10)


def test_before_any_unit_finished_the_running_unit_stands_in_for_every_unit():
    # Unit 1 ran 4 s and projects 6 s more: 10 s per unit, three units to go.
    assert run_remaining_s(UNITS, 0, {}, 4.0, 6.0) == pytest.approx(6 + 3 * 10)
    # No round yet and nothing finished: no basis for an estimate.
    assert run_remaining_s(UNITS, 0, {}, 4.0, None) is None
    assert span(None) == "?" and span(float("nan")) == "?"
    assert span(45.4) == "45 s" and span(725) == "12 min 05 s"


def test_the_clock_times_units_and_says_where_the_run_is():
    clock = RunClock(UNITS)
    clock.t0 = 0.0
    clock.start(0, now=0.0)
    assert clock.start_line("gloo s0", now=0.0) == \
        "[gloo s0] unit 1/4 starts; run elapsed 0 s, run ETA ?"
    clock.finish(now=12.0)
    clock.start(1, now=12.5)
    assert clock.durations == {"gloo": [12.0]}
    # dblp s0 estimated like the rest (12 s each), three units from here.
    assert clock.start_line("dblp s0", now=12.5) == \
        "[dblp s0] unit 2/4 starts; run elapsed 12 s, run ETA 36 s"
    assert clock.remaining_s(20.0, now=22.5) == pytest.approx(20 + 12 + 12)


def test_the_round_line_carries_the_unit_and_the_run_eta(tmp_path, capsys):
    log = tmp_path / "worker0.jsonl"
    log.write_text(json.dumps({"event": "round", "round": 39}) + "\n")
    clock = RunClock(UNITS)
    clock.start(0)
    Progress("gloo s0", 200, log, clock=clock).show(final=True)
    line = capsys.readouterr().err.strip()
    assert line.startswith("[gloo s0] unit 1/4 round 40/200") and "run ETA " in line
    eta = line.split("run ETA ")[1]
    assert eta != "?"   # its own rounds give the estimate


def test_before_the_first_round_the_round_line_says_it_does_not_know(tmp_path, capsys):
    log = tmp_path / "worker0.jsonl"
    log.write_text("")
    clock = RunClock(UNITS)
    clock.start(0)
    Progress("gloo s0", 200, log, clock=clock).show(final=True)
    line = capsys.readouterr().err.strip()
    assert line.startswith("[gloo s0] unit 1/4 round 0/200") and "nan" not in line
    assert line.endswith("ETA     ? s  run ETA ?"), line
