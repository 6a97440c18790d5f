"""The run's figures say what the verdicts say: each unit on its own clock, valid units only,
burst rounds apart from normal ones, accuracy per seed against rounds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from testbed.analysis import plots

pytestmark = pytest.mark.unit


@pytest.fixture
def drawn(monkeypatch):
    """The figures each plot function made, kept open instead of written."""
    figs = []

    def keep(fig, path):
        figs.append(fig)
        return path
    monkeypatch.setattr(plots, "_save", keep)
    return figs


def _rounds(seeds=(1, 2, 3), n=10, gap_s=100.0, valid=(True, True, True)):
    """Three units of one arm, each 10 rounds of 0.1 s, run ``gap_s`` apart (other arms'
    units between them), round 5 in a burst."""
    rows = []
    for k, seed in enumerate(seeds):
        t0 = int((1 + k * gap_s) * 1e9)
        for r in range(n):
            start = t0 + int(r * 0.1e9)
            rows.append({"arm": "dblp", "seed": seed, "round": r, "t_start_ns": start,
                         "t_end_ns": start + int(0.1e9), "latency_ms": 100.0 + (900 if r == 5 else 0),
                         "in_burst": r == 5, "valid": valid[k]})
    return pd.DataFrame(rows)


def test_every_unit_starts_at_its_own_zero(drawn, tmp_path):
    bursts = pd.DataFrame({"arm": ["dblp"] * 3, "seed": [1, 2, 3],
                           "actual_start_ns": [int((1 + k * 100 + 0.5) * 1e9) for k in range(3)],
                           "actual_end_ns": [int((1 + k * 100 + 0.6) * 1e9) for k in range(3)]})
    plots.latency_over_time(_rounds(), bursts, ["dblp"], tmp_path / "l.png")
    ax = drawn[0].axes[0]
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 10]
    assert len(lines) == 3  # one per seed
    for ln in lines:
        x = np.asarray(ln.get_xdata(), float)
        assert 0.0 < x.min() <= 0.11 and x.max() <= 1.01  # on its own clock, not 200 s apart
    spans = list(ax.patches)
    assert len(spans) == 3 and all(abs(p.get_x() - 0.5) < 1e-6 for p in spans)


def test_the_cdf_leaves_out_invalid_units_and_splits_burst_rounds(drawn, tmp_path):
    plots.latency_cdf(_rounds(valid=(True, True, False)), ["dblp"], tmp_path / "c.png")
    labels = sorted(ln.get_label() for ln in drawn[0].axes[0].get_lines())
    # two valid units: 18 normal rounds and 2 burst rounds; the invalid unit's nowhere
    assert labels == ["dblp, burst rounds (2)", "dblp, normal rounds (18)"]


def test_the_curves_are_drawn_against_rounds_per_seed_with_the_mean(drawn, tmp_path):
    rows = [{"arm": "dblp", "seed": s, "round": r, "rank": 0, "t_s": 50.0 * s + r,
             "test_accuracy": 0.5 + 0.01 * r + 0.001 * s, "test_loss": 1.0 - 0.01 * r,
             "valid": True} for s in (1, 2) for r in (9, 19, 29)]
    # Evaluations logged out of round order (ranks, a resumed unit): the lines are not.
    evals = pd.DataFrame(rows[::-1])
    rounds = _rounds(seeds=(1, 2), valid=(True, True)).assign(loss=lambda d: 2.0 - 0.1 * d["round"])
    plots.learning_curves(evals, rounds, ["dblp"], tmp_path / "a.png")
    acc, loss, train = drawn[0].axes
    xs = [list(ln.get_xdata()) for ln in acc.get_lines()]
    assert xs == [[9, 19, 29]] * 3  # two seeds and their mean, all against rounds
    mean = acc.get_lines()[-1]
    assert mean.get_label() == "dblp"
    assert np.allclose(mean.get_ydata(), [0.5015 + 0.01 * r for r in (9, 19, 29)])
    assert loss.get_ylabel() == "test loss"
    assert train.get_ylabel().startswith("training loss")
    assert [list(ln.get_xdata()) for ln in train.get_lines()] == [list(range(10))] * 3


def test_a_long_series_is_thinned_and_says_so(drawn, tmp_path):
    """A unit of 1,240 rounds draws at most MAX_POINTS points a line, its burst round kept."""
    r = _rounds(seeds=(1,), n=1240, valid=(True,))
    r.loc[r["round"] == 700, ["latency_ms", "in_burst"]] = [5000.0, True]
    plots.latency_over_time(r, pd.DataFrame(), ["dblp"], tmp_path / "l.png")
    ax = drawn[0].axes[0]
    line = max(ax.get_lines(), key=lambda ln: len(ln.get_xdata()))
    assert len(line.get_xdata()) <= plots.MAX_POINTS
    assert max(line.get_ydata()) == 5000.0          # the slowest of each run of rounds
    assert "each point the slowest of 13 rounds" in ax.get_xlabel()
