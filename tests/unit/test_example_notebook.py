"""examples/explore_run.ipynb: a valid notebook whose every code cell runs.

Its cells are executed in order, in one namespace, from the repository's
root, as a Jupyter kernel would (matplotlib without a display): first on the
committed default reference, which it reads with `load_run`, then with
``RUN_DIR`` set to a run directory built by the analysis tests.
"""
import json
import os
import pathlib

import matplotlib
import pytest

from testbed.analysis import datasets, load_run
from testbed.analysis.pipeline import build_outputs
from testbed.testing.captures import write_captures
from testbed.testing.rundirs import make_run

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "explore_run.ipynb"


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
            if i == 0 and run_dir is not None:
                src = src.replace("RUN_DIR = None", f"RUN_DIR = {str(run_dir)!r}", 1)
            exec(compile(src, f"{NOTEBOOK.name}[{i}]", "exec"), ns)  # noqa: S102
    finally:
        os.chdir(old)
        import matplotlib.pyplot as plt
        plt.close("all")
    return ns


def test_every_cell_runs_on_the_committed_reference():
    ns = _execute(_cells())
    run = ns["run"]
    assert run.reference and run.run_dir == ROOT / "results" / "reference" / "default"
    assert set(ns["verdicts"]["claim"]) >= {"burst_speedup", "train_time_cut", "accuracy"}
    # The verdict chart draws every verdict that has a point, one marker each.
    drawn = sum(len(ax.lines) for ax in ns["axes"][0])
    assert drawn >= len(ns["shown"]) > 0
    assert {"normal round p50 (ms)", "burst round p50 (ms)"} <= set(ns["by_arm"].columns)
    assert (ns["per_seed"]["over_bound"] > 0).all() and len(ns["final"]) > 0
    assert len(run.packets) == 0 and list(run.packets.columns[:3]) == \
        [c.name for c in datasets.PACKETS.columns[:3]]


def test_load_run_reads_a_committed_reference_with_the_declared_kinds():
    run = load_run(ROOT / "results" / "reference" / "default")
    assert run.reference and run.manifest == {}
    assert str(run.rounds["t_start_ns"].dtype) == "Int64" and run.rounds["valid"].dtype == bool
    assert set(run.rounds["arm"]) == set(run.summary["arms"]) and len(run.evals) > 0
    assert run.spec["topology"]["kind"] == "fattree"


def test_every_cell_reads_a_run_directory_when_run_dir_is_set(tmp_path, capsys):
    run = write_captures(make_run(tmp_path / "run"))
    build_outputs(run, figures=False)
    ns = _execute(_cells(), run_dir=run)
    assert ns["run"].run_dir == run and not ns["run"].reference
    assert len(ns["by_arm"]) > 0 and len(ns["run"].packets) > 0
    assert "dblp" in capsys.readouterr().out
