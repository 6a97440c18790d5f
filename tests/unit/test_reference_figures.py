"""A run reference's figures, drawn from the files it keeps, say what its verdicts say.

A small synthetic run directory (`testbed.testing.rundirs.make_run`: three
arms, three seeds whose units run 1,000 s apart, bursts at rounds 3 and 7)
is analysed as a run is; its kept files are all the figures read. Then: each
figure is a small SVG that draws again to the same bytes; the latency axis
is each unit's own time, so no half of it is empty; an invalid unit is in no
figure; every curve runs forward in rounds, seed by seed.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from testbed import references as refs
from testbed.analysis import datasets, pipeline, plots
from testbed.analysis import reference_figures as rf
from testbed.analysis import summary as sm
from testbed.analysis.formats import write_summary
from testbed.analysis.pages import figures as page_figures
from testbed.errors import InputError
from testbed.testing.rundirs import make_run

pytestmark = pytest.mark.unit
REF = pathlib.Path(__file__).resolve().parents[2] / "results" / "reference"
#: What the invalid unit's rows carry, so a test can look for them in every figure.
MARK = {"latency_ms": 54321.0, "comm_ms_max": 54321.0, "compute_ms_max": 4321.0, "loss": 77.0,
        "stats_missing_at_stop": 0.777, "stats_pull_missing": 0.777}
MARK_EVAL = {"test_accuracy": 0.0123, "test_loss": 77.0}
#: The most bytes one figure of the synthetic reference may take.
SMALL = 60_000


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> pathlib.Path:
    """A reference folder of the kept files of a three-seed synthetic run, dblp's seed 3 invalid."""
    run = make_run(tmp_path_factory.mktemp("run"), seeds=(1, 2, 3))
    # The pipeline's tables and summary (the verdicts' figure is the committed references'
    # test below): what a reference keeps of a run.
    t = pipeline.tables(pipeline.load_raw(run))
    ref = tmp_path_factory.mktemp("reference") / "tiny"
    ref.mkdir()
    write_summary(ref / "summary.json", sm.summarize(t))
    for table, df in ((datasets.ROUNDS, t.rounds), (datasets.BURSTS, t.bursts),
                      (datasets.EVALS, t.evals)):
        datasets.write(ref, table, df)
    shutil.copy(run / "spec.toml", ref / "spec.toml")
    rounds = pd.read_csv(ref / "rounds.csv")
    # The transport's counters of what was missing: a little under the bound.
    for c in ("stats_missing_at_stop", "stats_pull_missing"):
        rounds[c] = np.where(rounds["arm"] == "gloo", np.nan, 0.9 * rounds["bound"])
    bad = (rounds["arm"] == "dblp") & (rounds["seed"] == 3)
    rounds.loc[bad, "valid"] = False
    for c, v in MARK.items():
        rounds.loc[bad, c] = v
    rounds.to_csv(ref / "rounds.csv", index=False)
    evals = pd.read_csv(ref / "evals.csv")
    bad = (evals["arm"] == "dblp") & (evals["seed"] == 3)
    evals.loc[bad, "valid"] = False
    for c, v in MARK_EVAL.items():
        evals.loc[bad, c] = v
    evals.to_csv(ref / "evals.csv", index=False)
    return ref


@pytest.fixture
def drawn(kept, monkeypatch) -> dict:
    """Each figure's matplotlib figure by file name, drawn from the kept files and kept open."""
    figs = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path, tight=True: figs.setdefault(
        pathlib.Path(path).name, fig) and path)
    rf.draw(kept)
    yield figs
    for fig in figs.values():
        plt.close(fig)


def test_every_figure_is_a_small_svg_that_draws_again_to_the_same_bytes(kept):
    paths = rf.draw(kept)
    assert [p.name for p in paths] == list(rf.files())
    first = {p.name: p.read_bytes() for p in paths}
    for name, svg in first.items():
        assert svg.startswith(b"<?xml") and b"<svg" in svg, name
        assert b"<dc:date>" not in svg and len(svg) < SMALL, (name, len(svg))
    rf.draw(kept)
    assert {p.name: p.read_bytes() for p in paths} == first


def test_the_latency_axis_is_each_units_own_time_with_no_empty_half(kept, drawn):
    """Seed k runs 1,000 s after seed k-1 here: one zero per arm would leave two thirds of
    the axis empty; each unit on its own zero fills it."""
    rounds = rf.load(kept).rounds
    for ax in drawn["latency_over_time.svg"].axes:
        lo, hi = ax.get_xlim()
        units = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
        assert units, ax.get_title()
        for ln in units:
            x = np.asarray(ln.get_xdata(), float)
            assert (x.max() - x.min()) >= 0.8 * (hi - lo), ax.get_title()
        span_s = max((g["t_end_ns"].max() - g["t_start_ns"].min()) / 1e9
                     for _, g in rounds.groupby(["arm", "seed"]))
        assert hi - lo < 1.2 * span_s


def _values(fig) -> np.ndarray:
    """Every y value a figure draws: its lines' points and its patches' corners."""
    out = [np.asarray(ln.get_ydata(), float) for ax in fig.axes for ln in ax.get_lines()]
    out += [np.asarray(p.get_path().vertices[:, 1], float) for ax in fig.axes for p in ax.patches]
    return np.concatenate(out) if out else np.array([])


def test_an_invalid_unit_is_in_no_figure(kept, drawn):
    assert set(drawn) == set(rf.files())
    for name, fig in drawn.items():
        v = _values(fig)
        for mark in (54321.0, 4321.0, 77.0, 77.7, 0.0123):
            assert not np.isclose(v, mark).any(), (name, mark)
    dblp = [ax for ax in drawn["latency_over_time.svg"].axes if ax.get_title().startswith("dblp:")]
    assert len([ln for ln in dblp[0].get_lines() if ln.get_linestyle() == "-"]) == 2
    cdf = [ln.get_label() for ln in drawn["latency_cdf.svg"].axes[0].get_lines()]
    assert "dblp, normal rounds (16)" in cdf   # 2 valid seeds x 8 normal rounds


def test_every_curve_runs_forward_in_rounds_seed_by_seed(drawn):
    acc, test_loss, train_loss = drawn[rf.CURVES].axes
    for ax in (acc, test_loss, train_loss):
        lines = ax.get_lines()
        assert lines
        for ln in lines:
            x = np.asarray(ln.get_xdata(), float)
            assert (np.diff(x) > 0).all(), (ax.get_ylabel(), x)
    # gloo and static: 3 seeds and the mean; dblp: its 2 valid seeds and the mean
    assert len(train_loss.get_lines()) == 4 + 4 + 3


def test_the_bound_and_the_missing_share_are_drawn_per_bounded_arm(drawn):
    axes = drawn["bound_missing.svg"].axes
    assert [ax.get_title().split(":")[0] for ax in axes] == ["static", "dblp"]  # gloo: no bound
    static, dblp = axes
    assert static.get_ylim()[1] < 1.0 < dblp.get_ylim()[1]  # 0.8 % and 40.8 %, each readable
    bound = next(ln for ln in dblp.get_lines() if ln.get_label() == "bound P")
    assert set(np.round(bound.get_ydata(), 1)) == {0.8, 40.8}


def test_compute_and_exchange_give_the_exchange_share(kept, drawn):
    axes = drawn["compute_exchange.svg"].axes
    assert len(axes) == 3 and all("of the rounds' time" in ax.get_title() for ax in axes)
    labels = [ln.get_label() for ln in axes[0].get_lines()]
    assert labels == ["compute (forward, backward, step)", "exchange"]


def test_the_page_and_the_readme_link_the_figures_relative_to_themselves(kept):
    rf.draw(kept)
    block = page_figures.figures_block(kept)
    links = [line for line in block.splitlines() if line.startswith("![")]
    assert [line.rsplit("/", 1)[1].rstrip(")") for line in links] == [
        f for f in rf.files() if f != rf.CURVES]
    assert all(f"](../../results/reference/{kept.name}/" in line for line in links)
    head = page_figures.headline_block(kept)
    assert head.startswith("![") and f"](results/reference/{kept.name}/verdicts.svg)" in head
    (kept / "verdicts.svg").unlink()
    with pytest.raises(InputError, match="reproduce --readme-only tiny"):
        page_figures.headline_block(kept)


# -- the committed references -------------------------------------------------------------

RUNS = [name for name, ref in refs.REFERENCES.items() if isinstance(ref, refs.RunReference)]
#: The most bytes one committed figure may take (the largest run keeps 1,240 rounds a unit).
COMMITTED = 160_000


@pytest.mark.parametrize("name", RUNS)
def test_every_run_reference_keeps_its_figures_small(name):
    for f in rf.files():
        path = REF / name / f
        assert path.is_file(), f"{path} missing: `dblp-testbed reproduce --readme-only {name}`"
        assert path.stat().st_size < COMMITTED, (path, path.stat().st_size)


def test_the_default_references_figures_are_what_its_kept_files_draw(tmp_path):
    """Drawn again from the committed files, every figure is the committed bytes."""
    d = tmp_path / "default"
    shutil.copytree(REF / "default", d)
    for p in rf.draw(d):
        assert hashlib.sha256(p.read_bytes()).digest() == \
            hashlib.sha256((REF / "default" / p.name).read_bytes()).digest(), p.name
    assert json.loads((d / "summary.json").read_text())["arms_order"]
