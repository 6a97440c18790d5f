"""The phase timeline draws each seed's phases as its own line: seeds never interleave."""
import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from testbed.analysis import plots  # noqa: E402


def test_one_step_line_per_seed(tmp_path, monkeypatch):
    rows = [{"arm": "dblp", "seed": s, "round": r, "in_burst": r == 5,
             "phase": "critical" if (r < 4 + s) else "relaxed"}
            for s in (1, 2, 3) for r in range(10)]
    drawn = {}
    real_save = plots._save

    def keep(fig, path):
        drawn["lines"] = [ln for ax in fig.axes for ln in ax.get_lines()]
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.phase_timeline(pd.DataFrame(rows), ["dblp"], tmp_path / "pt")
    assert [ln.get_label() for ln in drawn["lines"]] == ["seed 1", "seed 2", "seed 3"]
    # Each line holds one seed's ten rounds, in order.
    assert all(list(ln.get_xdata()) == list(range(10)) for ln in drawn["lines"])
    assert (tmp_path / "pt.png").exists()
