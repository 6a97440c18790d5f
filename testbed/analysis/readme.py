"""The README's result tables, rendered from the committed reference runs.

The README marks each generated table with a pair of comments::

    <!-- reference:default arms -->
    | arm | ... |
    <!-- /reference -->

naming the reference folder (``results/reference/default``) and the table
(a key of `TABLES`). `update` rewrites every marked block from the files;
`stale` lists the blocks whose text differs from what the files give, which
is what the README test asserts to be empty. No figure in a marked block is
typed by hand.
"""
from __future__ import annotations

import json
import math
import pathlib
import re
from collections.abc import Callable

BLOCK_RE = re.compile(r"(<!-- reference:(?P<ref>[\w.-]+) (?P<table>[\w.-]+) -->\n)(?P<body>.*?)"
                      r"(<!-- /reference -->)", re.S)


def _load(ref_dir: pathlib.Path) -> dict:
    return json.loads((ref_dir / "summary.json").read_text())


def _num(x, fmt: str = "{:.0f}", none: str = "–") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


def _interval(iv: dict | None, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """``point [lo, hi]`` of an interval dict; a dash when it could not be computed."""
    if not iv or iv.get("point") is None:
        return "–"
    p, lo, hi = (None if iv.get(k) is None else iv[k] * scale for k in ("point", "lo", "hi"))
    if lo is None or hi is None:
        return _num(p, fmt)
    return f"{_num(p, fmt)} [{_num(lo, fmt)}, {_num(hi, fmt)}]"


def arms_table(summary: dict) -> str:
    """One row per arm: burst and normal rounds, training time, final metric."""
    rows = ["| arm | burst-round p50 (over its bound) | normal round p50 | training time "
            "| final accuracy | time to target |",
            "|---|---|---|---|---|---|"]
    for name in summary.get("arms_order") or sorted(summary["arms"]):
        a = summary["arms"][name]
        over = a.get("burst_round_over_phys_bound")
        burst = _num(a.get("burst_round_ms_p50"), "{:.0f} ms")
        if over is not None:
            burst += f" ({_num(over, '{:.2f}x')})"
        acc = _num(None if a.get("final_accuracy") is None else 100 * a["final_accuracy"],
                   "{:.2f} %")
        rows.append(f"| {name} | {burst} | {_num(a.get('normal_round_ms_p50'), '{:.0f} ms')} "
                    f"| {_num(a.get('train_time_s'), '{:.1f} s')} | {acc} "
                    f"| {_num(a.get('time_to_target_s'), '{:.1f} s')} |")
    return "\n".join(rows) + "\n"


def verdicts_table(summary: dict) -> str:
    """One row per claim of the paper: its value, the measured interval, the verdict."""
    rows = ["| claim | paper | measured, point [95 % interval] | seeds | verdict |",
            "|---|---|---|---|---|"]
    for v in summary.get("verdicts", []):
        iv = v.get("interval") or {}
        rows.append(f"| {v['what']} | {v['paper']} | {_interval(iv, v.get('fmt', '{:.2f}'))} "
                    f"| {iv.get('n_seeds', '–')} | {v['verdict']} |")
    return "\n".join(rows) + "\n"


def levels_table(ref_dir: pathlib.Path) -> str:
    """Burst-round latency p50 per loss level (rows) and arm (columns), with the rounds counted."""
    import pandas as pd

    rounds = pd.read_csv(ref_dir / "rounds.csv")
    # The level a burst was asked for (the measured loss of each burst is in bursts.csv).
    asked = pd.read_csv(ref_dir / "bursts.csv").groupby("id")["requested_loss"].first()
    order = _load(ref_dir).get("arms_order") or sorted(rounds["arm"].unique())
    hit = rounds[rounds["in_burst"].astype(bool) & rounds["burst_id"].notna()].copy()
    hit["level"] = hit["burst_id"].map(asked).round(2)
    rows = ["| burst loss | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for loss in sorted(hit["level"].dropna().unique()):
        at = hit[hit["level"] == loss]
        cells = []
        for arm in order:
            lat = at.loc[at["arm"] == arm, "latency_ms"]
            cells.append(f"{lat.median():.0f} ms (n={len(lat)})" if len(lat) else "–")
        rows.append(f"| {100 * loss:.0f} % | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


#: Tables rendered from summary.json alone.
TABLES: dict[str, Callable[[dict], str]] = {
    "arms": arms_table,
    "verdicts": verdicts_table,
}
#: Tables that read the reference folder's other files.
FILE_TABLES: dict[str, Callable[[pathlib.Path], str]] = {
    "levels": levels_table,
}


def render(ref: str, table: str, reference_dir: pathlib.Path) -> str:
    """The markdown of one marked block."""
    if table in FILE_TABLES:
        return FILE_TABLES[table](reference_dir / ref)
    if table not in TABLES:
        raise ValueError(f"README block names table {table!r}; known: "
                         f"{', '.join([*TABLES, *FILE_TABLES])}")
    return TABLES[table](_load(reference_dir / ref))


def update(text: str, reference_dir: pathlib.Path) -> str:
    """``text`` with every marked block rendered afresh from ``reference_dir``."""
    return BLOCK_RE.sub(lambda m: m.group(1) + render(m["ref"], m["table"], reference_dir)
                        + m.group(5), text)


def stale(text: str, reference_dir: pathlib.Path) -> list[str]:
    """``ref table`` of every marked block whose text is not what the files give."""
    return [f"{m['ref']} {m['table']}" for m in BLOCK_RE.finditer(text)
            if m["body"] != render(m["ref"], m["table"], reference_dir)]


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m["ref"], m["table"]) for m in BLOCK_RE.finditer(text)]
