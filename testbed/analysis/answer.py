"""A run's answer in a few lines: the verdict on each claim, and the units that did not count.

`dblp-testbed run` ends with these lines and `dblp-testbed report DIR` prints
the same, so a user learns what a run found without opening a file: one row
per claim and pair (the point estimate, its 95 % interval and the verdict),
then every invalid unit with the invariants it broke. They read only
summary.json (any version `formats.read_summary` accepts).
"""
from __future__ import annotations

import math
import pathlib

from testbed.analysis.claims import NOT_JUDGED, NOT_JUDGED_CAUSE

#: How each estimator's unit is printed (claims' estimators: x, %, points).
UNIT_FMT = {"x": "{:.2f}x", "%": "{:.1f} %", "points": "{:+.2f} pt"}
HEAD = ("claim", "pair", "point [95 % interval]", "verdict")


def fmt(x, unit: str) -> str:
    """One value in an estimator's unit; a dash for a missing one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return UNIT_FMT.get(unit, "{:.3g}").format(x)


def point_interval(interval: dict | None, unit: str) -> str:
    """'point [lo, hi]' in the estimator's unit; a dash without an interval."""
    if not interval:
        return "–"
    return (f"{fmt(interval['point'], unit)} "
            f"[{fmt(interval['lo'], unit)}, {fmt(interval['hi'], unit)}]")


def paper_cell(v: dict) -> str:
    """The paper's figure and, where the verdict records it, where the figure comes from."""
    return f"{v['paper']} ({v['source']})" if v.get("source") else v["paper"]


def verdict_label(v: dict) -> str:
    """The verdict as a reader should see it: "not judged" says why in a word, and an
    unresolved verdict of too few seeds how many there were and about how many would do."""
    if v["verdict"] == NOT_JUDGED:
        return f"{NOT_JUDGED} ({NOT_JUDGED_CAUSE})"
    short = v.get("too_few_seeds")
    if short:
        need = f"; about {short['needed']} needed" if short.get("needed") else ""
        return f"{v['verdict']}: too few seeds ({short['seeds']}{need})"
    return v["verdict"]


def verdict_rows(summary: dict) -> list[tuple[str, str, str, str]]:
    """(claim, pair, point [interval], verdict) per verdict; without an interval the verdict
    carries its reason, the only place left to say why."""
    rows = []
    for v in summary.get("verdicts", []):
        label = verdict_label(v)
        if not v["interval"] and v["verdict"] != NOT_JUDGED and not v.get("too_few_seeds"):
            label += f" ({v['reason']})"
        pair = f"{v['arm']} vs {v['baseline']}" if v.get("pair") else "(no pair ran)"
        rows.append((v["claim"], pair, point_interval(v["interval"], v["unit"]), label))
    return rows


def invalid_lines(summary: dict) -> list[str]:
    """One line per invalid unit (summary invalid_units): arm, seed and what it broke."""
    return [f"  {u['arm']} s{u['seed']}: {'; '.join(u['reasons'])}"
            for u in summary.get("invalid_units", [])]


def lines(summary: dict) -> list[str]:
    """The answer: the verdict table, then the invalid units (or that there were none)."""
    rows = [HEAD, *verdict_rows(summary)]
    width = [max(len(r[i]) for r in rows) for i in range(len(HEAD) - 1)]
    out = ["verdicts on the paper's claims:"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, width, strict=False)) + "  " + r[-1]
            for r in rows]
    if len(rows) == 1:
        out.append("  (none: this summary has no verdicts)")
    bad = invalid_lines(summary)
    if bad:
        out.append(f"invalid units ({len(bad)}, left out of every figure, interval and verdict):")
        out += bad
    else:
        out.append("invalid units: none (every unit kept the emulator's invariants)")
    return out



def as_json(summary: dict | None, run_dir, status: str) -> dict:
    """The answer as one JSON object (``run`` and ``report`` with ``--json``), checked
    against its declaration (`formats.RUN_ANSWER_FIELDS`).

    What a script needs without opening the run directory: its status, the
    verdicts (claim, pair, point and interval, label), the invalid units,
    DBLP's speedups, and where the full summary is. ``summary`` None: the
    analysis failed (the manifest says why), and only the status is known.
    """
    from testbed.analysis.formats import ANSWER_SCHEMA, check_answer
    s = summary or {}
    return check_answer({
        "kind": "run", "schema": ANSWER_SCHEMA,
        "run_dir": str(run_dir), "status": status,
        "summary": str(pathlib.Path(run_dir) / "summary.json") if summary else None,
        "verdicts": s.get("verdicts", []),
        "invalid_units": s.get("invalid_units", []),
        "speedups": {pair: {k: sp.get(k) for k in ("burst_round", "normal_round", "train_time")}
                     for pair, sp in s.get("speedups", {}).items()},
        "warnings": s.get("warnings", []),
    }, f"the --json answer of {run_dir}")
