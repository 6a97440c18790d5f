"""How a figure reads in a table's cell: a number, an interval, a percentage.

Shared by every module of the package so that one figure reads alike on
every page: the same dash where a figure could not be computed, the same
``point [lo, hi]`` for an interval.
"""
from __future__ import annotations

import math


def num(x, fmt: str = "{:.0f}", none: str = "–") -> str:
    """``x`` in ``fmt``; ``none`` (a dash) when it is missing or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


def interval(iv: dict | None, fmt: str = "{:.2f}", unit: str = "") -> str:
    """``point [lo, hi] unit`` of an interval dict; a dash when it could not be computed."""
    if not iv or iv.get("point") is None:
        return "–"
    p, lo, hi = (iv.get(k) for k in ("point", "lo", "hi"))
    if lo is None or hi is None:
        return num(p, fmt) + unit
    return f"{num(p, fmt)} [{num(lo, fmt)}, {num(hi, fmt)}]{unit}"


#: How each estimator's unit is printed.
UNIT_FMT = {"x": ("{:.2f}", "x"), "%": ("{:.1f}", " %"), "points": ("{:+.2f}", " points")}


def figure(fig: dict | None) -> str:
    """A summary figure's interval in its estimator's unit (`UNIT_FMT`); a dash without one."""
    if not fig:
        return "–"
    fmt, unit = UNIT_FMT.get(fig.get("unit", ""), ("{:.2f}", ""))
    return interval(fig.get("interval"), fmt, unit) if fig.get("interval") else "–"


def pct(x: float) -> str:
    """A fraction as a percentage, one decimal unless it is whole: 0.05 -> ``5 %``."""
    return f"{100 * x:.1f}".removesuffix(".0") + " %"
