"""examples/explore_results.ipynb: a valid notebook whose every code cell runs.

Its cells are executed in order, in one namespace, from the repository's
root, as a Jupyter kernel would (matplotlib without a display): first on the
committed default reference alone, then with ``RUN_DIR`` set to a run
directory built by the analysis tests, so its `load_run` cell runs too.
"""
import json
import os
import pathlib
import sys

import matplotlib
import pytest

from testbed.analysis.pipeline import build_outputs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_analysis_packets import make_run  # noqa: E402

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "explore_results.ipynb"


def _cells() -> list[str]:
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["language"] == "python"
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("markdown", "code") and isinstance(cell["source"], list)
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None  # committed clean
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _execute(cells: list[str], run_dir=None) -> dict:
    matplotlib.use("Agg")
    ns: dict = {"__name__": "__main__"}
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        for i, src in enumerate(cells):
            exec(compile(src, f"{NOTEBOOK.name}[{i}]", "exec"), ns)  # noqa: S102
            if i == 0 and run_dir is not None:
                ns["RUN_DIR"] = str(run_dir)
    finally:
        os.chdir(old)
        import matplotlib.pyplot as plt
        plt.close("all")
    return ns


def test_every_cell_runs_on_the_committed_reference():
    ns = _execute(_cells())
    assert set(ns["verdicts"]["claim"]) >= {"burst_speedup", "train_time_cut", "accuracy"}
    assert {"normal round p50 (ms)", "burst round p50 (ms)"} <= set(ns["by_arm"].columns)
    assert (ns["per_seed"]["over_bound"] > 0).all() and len(ns["final"]) > 0


def test_its_own_run_cell_reads_a_run_directory(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    build_outputs(run, figures=False)
    ns = _execute(_cells(), run_dir=run)
    assert ns["run"].run_dir == run and len(ns["mine"]) > 0
    assert "dblp" in capsys.readouterr().out
