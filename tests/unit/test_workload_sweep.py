"""Loss-tolerance sweep: exact chunk drops, phase windows, and a small end-to-end sweep via the CLI."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from workloads import sweep


@pytest.mark.unit
def test_drop_chunks_zero_fills_exactly_the_requested_share():
    flat = torch.arange(1, 1001, dtype=torch.float32)       # 10 chunks of 100 floats
    k = sweep.drop_chunks_(flat, 0.4, 100, np.random.default_rng(0))
    assert k == 4
    zero_chunks = [(flat[c * 100:(c + 1) * 100] == 0).all().item() for c in range(10)]
    assert sum(zero_chunks) == 4 and int((flat == 0).sum()) == 400
    tail = torch.ones(1000)
    sweep.drop_chunks_(tail, 0.3, 100, np.random.default_rng(0), order="tail")
    assert int((tail[:700] == 0).sum()) == 0 and int((tail[700:] == 0).sum()) == 300
    assert sweep.drop_chunks_(torch.ones(10), 0.0, 4, np.random.default_rng(0)) == 0


@pytest.mark.unit
def test_phase_windows_have_equal_length_and_sit_where_named():
    e, m, late = (sweep.drop_window(p, 300, 0.25) for p in sweep.PHASES)
    assert len(e) == len(m) == len(late) == 75
    assert e.start == 0 and late.stop == 300 and m.start == 112
    with pytest.raises(ValueError, match="--phases"):
        sweep.drop_window("warmup", 300, 0.25)
    with pytest.raises(ValueError, match="--window"):
        sweep.drop_window("early", 300, 1.5)


@pytest.mark.unit
def test_drops_change_training_only_inside_the_window():
    base = sweep.train_with_drops("digits_cnn", 2, 20, 0, 0.0, range(0), 1432, eval_every=10)
    late = sweep.train_with_drops("digits_cnn", 2, 20, 0, 0.8, range(15, 20), 1432, eval_every=10)
    early = sweep.train_with_drops("digits_cnn", 2, 20, 0, 0.8, range(0, 5), 1432, eval_every=10)
    # identical until the late window opens; the early window changes round 9 already
    assert late["curve"][0] == base["curve"][0]
    assert early["curve"][0] != base["curve"][0]
    n_chunks = -(-38282 // 358)
    assert late["dropped_chunks"] == 5 * 2 * round(0.8 * n_chunks)


@pytest.mark.unit
def test_sweep_command_writes_csv_json_and_report(tmp_path):
    out = tmp_path / "sw"
    cli = os.path.join(os.path.dirname(sys.executable), "dblp-testbed")   # the installed console script
    r = subprocess.run([cli, "sweep", "--out", str(out),
                        "--rounds", "20", "--fractions", "0,0.6", "--seeds", "0",
                        "--phases", "early,late", "--workers", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert {(x["phase"], float(x["drop_fraction"])) for x in rows} == {
        ("early", 0.0), ("late", 0.0), ("early", 0.6), ("late", 0.6)}
    doc = json.load(open(out / "sweep.json"))
    assert doc["meta"]["chunk_bytes"] > 0 and "early@0.6" in doc["summary"]
    assert all(0 <= x["final_accuracy"] <= 1 for x in doc["runs"])
    report = (out / "report.md").read_text()
    assert "| 60% |" in report and "## Verdict" in report
