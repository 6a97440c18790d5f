"""Tables whose renderers live with their own analysis: the design's, an ablation's, a regime map's.

`testbed.analysis.design`, `.ablation` and `.regime` each render the
tables of what they analyse (they know its summary's fields); this module
only adapts them to a reference's folder and registers them under their
block names, so a page names them like every other table.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable

from testbed.analysis import ablation, design, regime
from testbed.analysis.pages.registry import Renderer, register

#: The axes an ablation reference's README blocks may name (``ablation-FIELD``).
ABLATION_AXES = ("p_high", "threshold", "signal")


def _of_ablation(table: Callable[[dict], str]) -> Renderer:
    """A table of an ablation reference's ablation-summary.json (`testbed.analysis.ablation`)."""
    def render(ref_dir: pathlib.Path) -> str:
        return table(ablation.read_summary(ref_dir))
    return render


def _ablation_axis(field: str) -> Renderer:
    """The table of one axis (by its setting's field) of an ablation reference."""
    def table(doc: dict) -> str:
        axes = [a for a in doc["axes"] if a["setting"].rsplit(".", 1)[-1] == field]
        if not axes:
            raise ValueError(f"ablation {doc['ablation']} has no axis {field!r}")
        return ablation.axis_table(doc, axes[0])
    return _of_ablation(table)


def _of_regime(table: Callable[[dict], str]) -> Renderer:
    """A table of a regime reference's regime-summary.json (`testbed.analysis.regime`)."""
    def render(ref_dir: pathlib.Path) -> str:
        return table(regime.read_summary(ref_dir)) + "\n"
    return render


register("design", design.design_table)
register("curves", design.curves_table)
register("cut-vs-relaxed", design.cut_vs_relaxed_table, every=True)
register("ablation-baselines", _of_ablation(ablation.baselines_table))
register("ablation-harm", _of_ablation(ablation.harm_table))
register("ablation-accuracy", _of_ablation(ablation.accuracy_verdicts))
for _field in ABLATION_AXES:
    register(f"ablation-{_field}", _ablation_axis(_field))
register("regime-map", _of_regime(regime.markdown))
register("regime-why", _of_regime(regime.sentences))
register("regime-breakdowns", _of_regime(regime.breakdowns))
register("regime-wall", _of_regime(regime.wall_sentence))
