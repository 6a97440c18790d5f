"""A run that breaks the emulator's invariants decides nothing, and says so.

Two processes that spin, one pinned to each core, stand for a busy machine
(a neighbour's job, a build): the fabric still forwards and the run still
finishes, but its CPU is saturated, so every unit is invalid, the paper's
claims are "not judged", and the run exits non-zero. The smoke run of
tests/e2e/test_run.py is the same run without the hog: it exits 0 with every
unit valid.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
#: `dblp-testbed run` exits with this when every arm finished but a unit is invalid.
EXIT_INVALID = 3


def _hogs() -> list[subprocess.Popen]:
    """One busy loop per core, each pinned to its core (taskset), at normal priority."""
    spin = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(["taskset", "-c", str(cpu)] + spin)
            for cpu in range(os.cpu_count() or 1)]


@pytest.mark.e2e
def test_a_run_beside_a_cpu_hog_is_invalid_and_judges_nothing(tmp_path, leftovers):
    spec = tmp_path / "two-arms.toml"
    # Eight rounds an arm (the burst is at round 6): enough for the verdict table.
    spec.write_text('arms = ["static", "dblp"]\n\n[training]\nrounds = 8\n\n[capture]\nenabled = false\n')
    out = tmp_path / "run"
    hogs = _hogs()
    try:
        res = subprocess.run(CLI + ["run", str(spec), "--preset", "smoke", "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=900)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert res.returncode == EXIT_INVALID, res.stdout + res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert {u["status"] for u in manifest["units"]} == {"ok"}       # every arm finished
    assert all(u["fidelity"]["cpu_busy_frac"] > 0.85 for u in manifest["units"])
    summary = json.loads((out / "summary.json").read_text())
    assert {(u["arm"], u["seed"]) for u in summary["invalid_units"]} == {("static", 1), ("dblp", 1)}
    verdicts = [v for v in summary["verdicts"] if v.get("pair")]
    assert verdicts and {v["verdict"] for v in verdicts} == {"not judged"}
    # The run's last lines are its answer: the verdicts and the invalid units.
    tail = res.stdout.strip().splitlines()[-8:]
    assert any("not judged" in line for line in tail), res.stdout
    assert any("cpu busy" in line for line in tail), res.stdout
    # Its figures stay in the tables, marked.
    rounds = (out / "rounds.csv").read_text().splitlines()
    assert "valid" in rounds[0].split(",") and len(rounds) > 10
