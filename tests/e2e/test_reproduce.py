"""`dblp-testbed reproduce`: a reference run from scratch, its files kept, the pages re-rendered.

The real references take half an hour; this runs the same code path on a
two-seed, eight-round `smoke` reference written to a temporary folder, so the
committed results/reference/ is never touched by a test.
"""
import json
import subprocess
import sys

import pytest

from testbed import REPO_ROOT
from testbed import references as refs
from testbed.analysis import reference_figures
from testbed.run import reproduce as rp

CLI = [sys.executable, "-m", "testbed.cli"]


# `make test-all` only (README, "Tests only make test-all runs"): what remakes every reference.
@pytest.mark.e2e
@pytest.mark.long
def test_a_reference_runs_from_scratch_and_keeps_its_files(tmp_path, leftovers):
    ref = refs.RunReference("tiny", "smoke", "test", overrides=("training.rounds=8", "seeds=2",
                                                              "arms=static,dblp-sharded",
                                                              "capture.enabled=false"))
    dest = tmp_path / "reference"
    done = rp.reproduce([ref], tmp_path / "runs", reference_dir=dest)
    assert done["tiny"]["status"] == "ok", done
    kept = dest / "tiny"
    # The kept files, and the figures drawn from them (testbed.analysis.reference_figures).
    assert sorted(p.name for p in kept.iterdir()) == sorted([*refs.KEPT_FILES, "reproduce.json",
                                                             *reference_figures.files()])
    summary = json.loads((kept / "summary.json").read_text())
    assert set(summary["arms"]) == {"static", "dblp-sharded"}
    record = refs.read_record(kept)
    assert record["argv"][:3] == ["run", "--preset", "smoke"] and record["kind"] == "run"
    # The rounds table of both seeds, as the results pages read it.
    rows = (kept / "rounds.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 8
    assert not any(leftovers().values()), leftovers()


@pytest.mark.e2e
def test_readme_only_rerenders_nothing_when_the_readme_is_current():
    """The command's path, on two command references (no figures to draw: a run reference's
    take 20 s); every page's every table is checked by tests/unit/test_readme_tables.py."""
    res = subprocess.run(CLI + ["reproduce", "--readme-only", "transport", "burstround", "--json"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout.splitlines()[-1])
    assert doc["readme_tables_changed"] == [] and doc["figures_drawn"] == []
