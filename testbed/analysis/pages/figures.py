"""The blocks that show a run reference's kept figures: on its results page, and the README's one.

The figures are SVG files beside the reference's kept tables, drawn from
them (`testbed.analysis.reference_figures`); a block renders markdown
images of them, each path relative to the page that shows it. A block
knows its reference's folder, not its page, so each block is for one place:

- ``figures``: on the reference's page under docs/results/, every kept
  figure but the learning curves (the ``curves`` block shows those beside
  the plateau table);
- ``headline-figure``: on the README, the one figure beside the headline
  verdicts (`reference_figures.HEADLINE`).
"""
from __future__ import annotations

import pathlib

from testbed.analysis import reference_figures as rf
from testbed.analysis.pages.registry import register

#: The reference root as each page reaches it.
FROM_RESULTS_PAGE = "../../results/reference"
FROM_README = "results/reference"


def figures_block(ref_dir: pathlib.Path) -> str:
    """Every kept figure of a run reference but the curves, for its page under docs/results/."""
    shown = [f for f in rf.FIGURES if f.file != rf.CURVES]
    return "\n\n".join(f"{f.caption[0].upper()}{f.caption[1:]} (`{f.file}`):\n\n"
                       + rf.link(ref_dir, f, FROM_RESULTS_PAGE) for f in shown) + "\n"


def headline_block(ref_dir: pathlib.Path) -> str:
    """The README's figure beside its headline verdicts, and where the others are."""
    f = rf.HEADLINE
    return (rf.link(ref_dir, f, FROM_README) + "\n\n"
            f"The verdicts above as a picture (`{f.file}`): each pair's interval against the "
            "region, shaded green, where the paper's claim reproduces. The reference's other "
            f"figures are on [its page](docs/results/{ref_dir.name}.md).\n")


register("figures", figures_block)
register("headline-figure", headline_block)
