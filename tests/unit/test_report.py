"""`dblp-testbed report DIR`: every derived file rebuilds from raw/, byte for byte."""
import hashlib
import json
import pathlib
import subprocess
import sys

import pytest

from testbed.analysis.report import DERIVED, build_outputs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_analysis import make_run  # noqa: E402

pytestmark = pytest.mark.unit
CLI = pathlib.Path(sys.executable).with_name("dblp-testbed")


def _digest(run: pathlib.Path) -> dict:
    out = {}
    for name in DERIVED:
        p = run / name
        for f in sorted([p] if p.is_file() else p.rglob("*")):
            if f.is_file():
                out[str(f.relative_to(run))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_report_rebuild_is_identical_and_self_contained(tmp_path):
    run = make_run(tmp_path / "run")
    res = subprocess.run([str(CLI), "report", str(run)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "dblp_vs_static: burst-round 4.00x" in res.stdout
    first = _digest(run)
    assert len(first) == 11  # 3 CSVs, summary, report.md/html, 5 plots
    # Derived files deleted or tampered with: the rebuild restores them exactly.
    (run / "summary.json").write_text("{}")
    (run / "rounds.csv").unlink()
    build_outputs(run)
    assert _digest(run) == first
    html = (run / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == 5
    assert "src='plots/" not in html and "http" not in html.split("<body>")[1]
    md = (run / "report.md").read_text()
    assert "| static | 400.00 | 400.00 | 30.00 | 2.00 | 0.9600 | 4.00x | 25.0 % |" in md
    assert "up to 5.88x" in md and "24.4 %" in md
    assert "between the bandwidth-bound and pass-bound ratios" in md
    s = json.loads((run / "summary.json").read_text())
    assert s["speedups"]["dblp_vs_gloo"]["burst_round"] == pytest.approx(8.0)


def test_report_on_a_non_run_dir_is_one_line(tmp_path):
    res = subprocess.run([str(CLI), "report", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "no raw/ directory" in res.stderr


def test_fidelity_flags_reach_the_report(tmp_path):
    run = make_run(tmp_path / "run")
    man = json.loads((run / "manifest.json").read_text())
    man["arms"]["static"]["fidelity"] = {"cpu_busy_frac": 0.97, "achieved_mbps": 9.0,
                                         "shaped_mbps": 20.0}
    man["arms"]["dblp"]["fidelity"] = {"cpu_busy_frac": 0.5, "ovs_drops": 0}
    (run / "manifest.json").write_text(json.dumps(man))
    s = build_outputs(run)
    assert s["fidelity_flags"]["dblp"] == []
    flags = s["fidelity_flags"]["static"]
    assert len(flags) == 2 and "CPU 97 % busy" in flags[0] and "9 of 20 Mbit/s" in flags[1]
    assert "arm static: CPU 97 % busy" in (run / "report.md").read_text()
