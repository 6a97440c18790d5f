"""`dblp-testbed regime`: a real cell on the fabric, analysed, then resumed without running again.

The reduced map takes up to half an hour and the full one over an hour; the
`smoke` map runs the same code path in one round-locked cell (two bursts,
the two bounds) on the smoke preset's star.
"""
import json
import subprocess
import sys

import pytest

from testbed import REPO_ROOT

CLI = [sys.executable, "-m", "testbed.cli"]


# `make test-all` only (README, "Tests only make test-all runs"): the regime map reference's command.
@pytest.mark.e2e
@pytest.mark.long
def test_smoke_map_runs_its_cell_places_the_ratio_and_resumes(tmp_path, leftovers):
    out = tmp_path / "map"
    res = subprocess.run(CLI + ["regime", "smoke", "--out", str(out), "--json"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout.splitlines()[-1])
    (cell,) = doc["cells"]
    assert cell["name"] == "udp-round-p90" and cell["status"] == "ok"
    # Two round-locked bursts per arm, each measured near the 90 % asked for.
    assert cell["bursts"] == 4 and 0.8 <= cell["measured_loss"] <= 1.0
    (pair,) = cell["pairs"]
    assert (pair["arm"], pair["baseline"]) == ("static-high", "static")
    assert pair["bandwidth_ratio"] == pytest.approx(0.992 / 0.592)
    assert pair["pass_ratio"] == pytest.approx(5.39, abs=0.01)
    # The loose bound is faster in the burst rounds (a 90 % burst for the whole round).
    assert pair["capped"] is False and pair["speedup"] > 1.0
    for a in cell["arms"]:
        assert a["burst_rounds"] >= 2 and a["bound_ms"] > 0 and a["over_bound"] > 0.9
        assert a["loss_bound"] == pytest.approx(0.008 if a["arm"] == "static" else 0.408)
    for f in ("regime.json", "regime-summary.json", "cells.csv", "arms.csv", "report.md",
              "plots/regime-speedup.png", "plots/regime-over-bound.png",
              "udp-round-p90/summary.json", "udp-round-p90/rounds.csv"):
        assert (out / f).is_file(), f
    assert "udp-round-p90" in (out / "report.md").read_text()
    assert not any(leftovers().values()), leftovers()
    again = subprocess.run(CLI + ["regime", "smoke", "--out", str(out)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("done before") == 1 and "run 1/1" not in again.stderr
    assert "| udp-round-p90 |" in again.stdout
