"""CI's regression guard: the `ci` preset against results/reference/ci.json.

The unchanged code must pass `compare`; a deliberately weakened DBLP (its
relaxed bound set to the critical one, P_high = P_low, i.e. no phase
awareness) must fail it, which shows the guard catches the regression it
exists for.
"""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
REFERENCE = ROOT / "results" / "reference" / "ci.json"


def run_ci(out, *extra):
    res = subprocess.run(CLI + ["run", "--preset", "ci", "--out", str(out), *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def compare(out):
    return subprocess.run(CLI + ["compare", str(out), "--reference", str(REFERENCE)], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.mark.e2e
def test_unchanged_code_passes_the_reference(tmp_path):
    res = compare(run_ci(tmp_path / "ci"))
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dblp_vs_static.burst_round" in res.stdout


@pytest.mark.e2e
def test_weakened_dblp_fails_the_reference(tmp_path):
    """Only the arms the guarded speedup compares: gloo's figure is then missing (also a
    failure), so the test reads the table for the verdict on dblp vs static itself."""
    res = compare(run_ci(tmp_path / "weak", "--set", "transport.p_high=0.008",
                         "--arms", "static,dblp"))
    print(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION" in res.stderr and "dblp_vs_static.burst_round" in res.stderr
    row = next(line for line in res.stdout.splitlines()
               if line.startswith("speedups.dblp_vs_static.burst_round"))
    assert row.split()[-1] == "REGRESSED", row
