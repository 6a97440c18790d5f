"""The design's figures beside each verdict (testbed.analysis.design), read from the
committed references: relaxed share, communication share, per-seed cuts, the plateau."""
import pathlib

import pandas as pd
import pytest

from testbed.analysis import design

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
REF = ROOT / "results" / "reference"


def test_the_default_references_cut_stands_beside_its_relaxed_share():
    """The default relaxes at round 30 of 40 in every seed (25 %), and the table's cut is
    the mean of its per-seed cuts with the summary's interval, read from the kept files."""
    import json
    import statistics

    table = design.design_table(REF / "default")
    row = [line for line in table.splitlines() if line.startswith("| dblp-sharded vs")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["3", "40", "25 %"] and cells[4].endswith(" %")
    per_seed = [float(c) for c in cells[5].split(", ")]
    summary = json.loads((REF / "default" / "summary.json").read_text())
    cut = next(v for v in summary["verdicts"] if v["claim"] == "train_time_cut")["interval"]
    assert len(per_seed) == 3 and abs(statistics.mean(per_seed) - cut["point"]) < 0.1
    assert cells[6] == f"{cut['point']:.1f} [{cut['lo']:.1f}, {cut['hi']:.1f}] %"


def test_every_run_reference_with_rounds_has_its_rows_across_references():
    table = design.cut_vs_relaxed_table(REF)
    names = {line.split("|")[1].strip() for line in table.splitlines()[2:]}
    assert {"default", "paper", "star"} <= names


def test_per_seed_relaxed_share_and_cut_from_rounds():
    rounds = pd.DataFrame({
        "arm": ["d"] * 4 + ["s"] * 4, "seed": [1] * 8, "round": [0, 1, 2, 3] * 2,
        "phase": ["critical", "relaxed", "relaxed", "relaxed"] + ["static"] * 4,
        "duration_ms": [100, 60, 60, 60, 100, 100, 100, 100],
        "comm_ms_max": [90, 50, 50, 50, 90, 90, 90, 90]})
    (s,) = design.per_seed(rounds, "d", "s")
    assert s["relaxed"] == 0.75 and s["cut"] == pytest.approx(30.0)
    assert s["comm"] == pytest.approx(240 / 280)


def test_a_plateau_needs_ten_evaluations_and_the_last_fifth_within_half_a_point():
    rounds = list(range(0, 200, 10))
    flat = [0.5 + 0.3 * min(1, r / 100) for r in rounds]
    evals = pd.DataFrame({"arm": "a", "seed": 1, "round": rounds, "test_accuracy": flat,
                          "test_loss": 0.1})
    (p,) = design.plateau(evals, "a")
    assert p["spread"] == pytest.approx(0.0) and p["evaluations"] == 20
    rising = evals.assign(test_accuracy=[0.5 + 0.001 * r for r in rounds])
    assert design.plateau(rising, "a")[0]["spread"] == pytest.approx(0.03)
    assert "cannot tell (4 evaluations a seed" in design.curves_table(REF / "default")
