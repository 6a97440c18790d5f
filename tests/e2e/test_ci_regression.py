"""CI's regression guard: one `ci` run against results/reference/ci.json, with DBLP's twin.

One run carries the reference's arms (gloo, static, dblp) and DBLP's
deliberately slowed twin (``dblp-slowed``: every exchange 10 % longer, the
transport's test-only ``slowdown``): the arms run one after another on the
same fabric, so the twin changes nothing of the others' figures. The
unchanged code must pass `compare`; the twin, judged in dblp's place
(``--arm dblp-slowed``), must fail it: the guard catches a 10 % regression,
not only the loss of the whole gain.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
REFERENCE = ROOT / "results" / "reference" / "ci.json"
ARMS = "gloo,static,dblp,dblp-slowed"


def _compare(out, *extra):
    return subprocess.run(CLI + ["compare", str(out), "--reference", str(REFERENCE), *extra],
                          cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, emulator):
    out = tmp_path_factory.mktemp("ci") / "run"
    env = dict(os.environ, DBLP_TEST_SLOWDOWN="1")
    res = subprocess.run(CLI + ["run", "--preset", "ci", "--arms", ARMS, "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.mark.e2e
def test_unchanged_code_passes_the_reference(ci_run):
    res = _compare(ci_run)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    for figure in ("arms.dblp.burst_round_over_phys_bound", "arms.dblp.normal_round_over_phys_bound",
                   "speedups.dblp_vs_static.burst_round", "speedups.dblp_vs_gloo.burst_round",
                   "arms.dblp.final_accuracy"):
        assert rows[figure].rstrip().endswith("ok"), rows[figure]
    # Each guarded figure's tolerance is printed with the reference's provenance.
    assert "%)" in rows["speedups.dblp_vs_static.burst_round"]
    assert "reference: commit " in res.stdout


@pytest.mark.e2e
def test_a_ten_percent_slower_dblp_fails_the_reference(ci_run):
    res = _compare(ci_run, "--arm", "dblp-slowed")
    print(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION" in res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    # Its own rounds against the physical bound: what a slowdown shared with static moves.
    # The normal rounds (about 50 of them, no loss, so whatever the phase) fail by twice
    # their tolerance, and against the same run's dblp they are the slowdown itself. The
    # five burst rounds are not held to it: their median moves too much from run to run
    # (in three runs the twin's burst p50 came out 9.8 % and 18 % over dblp's, and once
    # level with it, 1167 against 1161 ms, both at P_high; why it was level is not known).
    row = rows["arms.dblp-slowed.normal_round_over_phys_bound"]
    assert row.rstrip().endswith("REGRESSED"), row
    arms = json.loads((ci_run / "summary.json").read_text())["arms"]
    slowed, dblp = (arms[a]["normal_round_over_phys_bound"] for a in ("dblp-slowed", "dblp"))
    assert slowed > 1.05 * dblp, (slowed, dblp)


@pytest.mark.e2e
def test_the_slowed_twin_runs_only_under_the_test():
    """Without the test's permission the run is refused before anything starts (exit 2)."""
    env = {k: v for k, v in os.environ.items() if k != "DBLP_TEST_SLOWDOWN"}
    res = subprocess.run(CLI + ["run", "--preset", "ci", "--arms", "dblp-slowed", "--out",
                                "/nonexistent/never-made"], cwd=ROOT, capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 2
    assert "test-only setting" in res.stderr and res.stderr.strip().count("\n") == 0
