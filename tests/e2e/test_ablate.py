"""`dblp-testbed ablate`: real runs on the fabric, joined, each point against the baselines.

The `detector` ablation takes about an hour; the `smoke` ablation runs the
same code path in two short runs (the base: static and dblp; one point:
dblp at P_high 0.208) on the smoke preset's star.
"""
import json
import subprocess
import sys

import pytest

from testbed import REPO_ROOT

CLI = [sys.executable, "-m", "testbed.cli"]


# `make test-all` only (README, "Tests only make test-all runs"): the ablation reference's command.
@pytest.mark.e2e
@pytest.mark.long
def test_smoke_ablation_runs_each_point_once_and_compares_it(tmp_path, leftovers):
    out = tmp_path / "ab"
    res = subprocess.run(CLI + ["ablate", "smoke", "--out", str(out), "--json"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout.splitlines()[-1])
    assert doc["runs"]["base"]["status"] == doc["runs"]["p_high=0.208"]["status"] == "ok"
    (axis,) = doc["axes"]
    low, base = axis["points"]
    assert (low["arm"], base["arm"]) == ("dblp@p_high=0.208", "dblp")
    for p in (low, base):
        assert p["seeds"] == [1] and p["final_accuracy_mean"] > 0.1
        assert p["train_time_s_mean"] > 0 and p["relaxed_share"] is not None
        assert set(p["against"]) == {"static"}
        # One seed: per-round figures get a round bootstrap, per-seed ones none (and say why).
        cut = p["against"]["static"]["train_time_cut"]
        assert cut["interval"]["n_seeds"] == 1
        assert "one value per seed and only 1 seed" in p["against"]["static"]["accuracy_delta"]["reason"]
    for f in ("ablation.json", "ablation-summary.json", "points.csv", "report.md",
              "plots/ablation-p_high.png", "plots/phases-p_high.png",
              "base/summary.json", "p_high=0.208/summary.json"):
        assert (out / f).is_file(), f
    assert not any(leftovers().values()), leftovers()
    # Resumed: both runs finished, so nothing runs again and the files are rebuilt alike.
    again = subprocess.run(CLI + ["ablate", "smoke", "--out", str(out)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("done before") == 2 and "run 1/2" not in again.stderr
    assert "| **0.408** |" in again.stdout
