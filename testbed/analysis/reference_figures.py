"""A run reference's figures, drawn again from the files it keeps, and the markdown that shows them.

A run reference keeps its derived tables, not its raw logs
(`testbed.references.KEPT_FILES`: summary.json, rounds.csv, bursts.csv,
evals.csv, spec.toml), so its figures are the run report's figures that
those files can make: the same functions (`testbed.analysis.plots`), given
the kept tables instead of the run's, each written as one small,
byte-stable SVG beside them (`FIGURES`). `dblp-testbed reproduce` draws
them after it keeps a reference's files and again on ``--readme-only`` and
``--rejudge`` (`draw`), and the results pages show them from there
(`markdown`, through the ``figures`` block of `testbed.analysis.pages.figures`).

Not here: the bottleneck's rate and queue over time. They need the run's
``bottleneck`` and ``queue`` tables (port counters and queue samples per
10 ms), which a reference does not keep.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING

# The learning curves' file: the `curves` block (`testbed.analysis.design.curves_table`)
# shows it beside the plateau table.
from testbed.analysis.design import CURVES
from testbed.errors import InputError

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class Kept:
    """A run reference's kept tables, as the figures read them."""

    summary: dict
    rounds: pd.DataFrame
    bursts: pd.DataFrame
    evals: pd.DataFrame

    @property
    def arms(self) -> list[str]:
        return self.summary.get("arms_order") or sorted(self.rounds["arm"].unique())


#: The columns kept as True/False text that the figures read as booleans.
_BOOLS = {"rounds": ("valid", "in_burst"), "evals": ("valid",), "bursts": ()}


def _table(ref_dir: pathlib.Path, name: str) -> pd.DataFrame:
    import pandas as pd  # only when drawing
    df = pd.read_csv(ref_dir / f"{name}.csv")
    for c in _BOOLS[name]:
        if c in df.columns:
            df[c] = df[c].astype(str).str.lower().eq("true")
    return df


def load(ref_dir: pathlib.Path) -> Kept:
    """The kept files of a run reference (``results/reference/NAME``)."""
    ref_dir = pathlib.Path(ref_dir)
    return Kept(json.loads((ref_dir / "summary.json").read_text()), _table(ref_dir, "rounds"),
                _table(ref_dir, "bursts"), _table(ref_dir, "evals"))


@dataclasses.dataclass(frozen=True)
class Figure:
    """One kept figure: its file, what it shows (the page's caption) and how it is drawn."""

    file: str
    caption: str
    draw: Callable[[Kept, pathlib.Path], pathlib.Path]


def _plots():
    from testbed.analysis import plots  # matplotlib: only when drawing
    return plots


#: Every figure a run reference keeps, in the order its page shows them.
FIGURES = (
    Figure("verdicts.svg", "every compared pair's figures, point and 95 % interval, the claim's "
           "region shaded green where the paper's claim reproduces",
           lambda k, p: _plots().forest(k.summary, p)),
    Figure(CURVES, "test accuracy, test loss and training loss per seed and round, the mean "
           "over seeds thick",
           lambda k, p: _plots().learning_curves(k.evals, k.rounds, k.arms, p)),
    Figure("latency_over_time.svg", "round latency against the time since each unit's first "
           "round, one line per seed, burst windows shaded",
           lambda k, p: _plots().latency_over_time(k.rounds, k.bursts, k.arms, p)),
    Figure("latency_cdf.svg", "round latency, burst rounds apart from normal ones",
           lambda k, p: _plots().latency_cdf(k.rounds, k.arms, p)),
    Figure("bound_missing.svg", "each bounded arm's loss bound per round against the chunks "
           "actually missing",
           lambda k, p: _plots().bound_missing(k.rounds, k.arms, p)),
    Figure("compute_exchange.svg", "the longest worker's compute against its exchange per round",
           lambda k, p: _plots().compute_exchange(k.rounds, k.arms, p)),
)
#: The figure the README shows beside its headline verdicts: the verdicts as a picture.
HEADLINE = FIGURES[0]


def files() -> tuple[str, ...]:
    """The file of every kept figure."""
    return tuple(f.file for f in FIGURES)


def draw(ref_dir: pathlib.Path) -> list[pathlib.Path]:
    """Draw every figure of a run reference from its kept files, beside them; their paths."""
    ref_dir = pathlib.Path(ref_dir)
    kept = load(ref_dir)
    return [f.draw(kept, ref_dir / f.file) for f in FIGURES]


def link(ref_dir: pathlib.Path, figure: Figure, root: str) -> str:
    """The markdown image of ``figure`` of the reference at ``ref_dir``, its path after ``root``
    (the reference root as the page reaches it: ``../../results/reference`` from docs/results/).

    A figure not drawn yet is an InputError naming the command that draws it."""
    if not (ref_dir / figure.file).is_file():
        raise InputError(f"{ref_dir / figure.file} does not exist; run `dblp-testbed reproduce "
                         f"--readme-only {ref_dir.name}` to draw it from the kept files")
    return f"![{figure.caption}]({root}/{ref_dir.name}/{figure.file})"
