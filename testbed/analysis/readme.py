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
    path = ref_dir / "summary.json"
    if not path.is_file():
        from testbed.errors import InputError
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {ref_dir.name}`")
    return json.loads(path.read_text())


def _num(x, fmt: str = "{:.0f}", none: str = "–") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


def _interval(iv: dict | None, fmt: str = "{:.2f}", unit: str = "") -> str:
    """``point [lo, hi] unit`` of an interval dict; a dash when it could not be computed."""
    if not iv or iv.get("point") is None:
        return "–"
    p, lo, hi = (iv.get(k) for k in ("point", "lo", "hi"))
    if lo is None or hi is None:
        return _num(p, fmt) + unit
    return f"{_num(p, fmt)} [{_num(lo, fmt)}, {_num(hi, fmt)}]{unit}"


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


#: How each estimator's unit is printed.
UNIT_FMT = {"x": ("{:.2f}", "x"), "%": ("{:.1f}", " %"), "points": ("{:+.2f}", " points")}
#: The figures of the intervals table, in column order: (estimator, heading).
FIGURES = (("burst_speedup", "burst-round speedup"), ("train_time_cut", "training-time cut"),
           ("accuracy_delta", "final accuracy, difference"),
           ("time_to_target", "time-to-target speedup"))


def _figure(fig: dict | None) -> str:
    if not fig:
        return "–"
    fmt, unit = UNIT_FMT.get(fig.get("unit", ""), ("{:.2f}", ""))
    return _interval(fig.get("interval"), fmt, unit) if fig.get("interval") else "–"


def verdicts_table(summary: dict) -> str:
    """One row per claim of the paper and pair of arms: the measured interval and the verdict."""
    rows = ["| claim | arm vs baseline | paper | measured, point [95 % interval] | seeds | verdict |",
            "|---|---|---|---|---|---|"]
    for v in summary.get("verdicts", []):
        iv = v.get("interval") or {}
        pair = f"{v['arm']} vs {v['baseline']}" if v.get("pair") else "(did not run)"
        rows.append(f"| {v['claim']} | {pair} | {v['paper']} | {_figure(v)} "
                    f"| {iv.get('n_seeds', '–')} | {v['verdict']} |")
    return "\n".join(rows) + "\n"


def intervals_table(summary: dict) -> str:
    """Every compared pair's headline figures, each a point and its 95 % interval."""
    rows = ["| arm vs baseline | " + " | ".join(h for _, h in FIGURES) + " |",
            "|---" * (len(FIGURES) + 1) + "|"]
    for pair in summary.get("intervals", {}).values():
        figs = pair.get("figures", {})
        rows.append(f"| {pair['arm']} vs {pair['baseline']} | "
                    + " | ".join(_figure(figs.get(e)) for e, _ in FIGURES) + " |")
    return "\n".join(rows) + "\n"


def _median_rows(hit, key: str, groups: list[tuple[str, object]], order: list[str]) -> list[str]:
    """One row per (label, value) of ``key``: each arm's median burst-round latency and count."""
    rows = []
    for label, value in groups:
        at = hit[hit[key] == value]
        cells = []
        for arm in order:
            lat = at.loc[at["arm"] == arm, "latency_ms"]
            cells.append(f"{lat.median():.0f} ms (n={len(lat)})" if len(lat) else "–")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


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
    levels = sorted(hit["level"].dropna().unique())
    rows += _median_rows(hit, "level", [(f"{100 * x:.0f} %", x) for x in levels], order)
    return "\n".join(rows) + "\n"


def phases_table(ref_dir: pathlib.Path) -> str:
    """Burst-round latency p50 per arm, split by the phase DBLP was in at that round and seed.

    Every arm met the same bursts at the same rounds of the same seeds; the
    phase-aware arm's phase there says which bound it could use, so this is
    where the phase-aware bound can and cannot beat the static one.
    """
    import pandas as pd

    rounds = pd.read_csv(ref_dir / "rounds.csv")
    order = _load(ref_dir).get("arms_order") or sorted(rounds["arm"].unique())
    phased = rounds[rounds["phase"].notna()]
    if not len(phased):
        return "| no arm with a phase detector ran |\n|---|\n"
    dblp = phased["arm"].iloc[0]
    phase = phased[phased["arm"] == dblp].set_index(["seed", "round"])["phase"]
    hit = rounds[rounds["in_burst"].astype(bool)].copy()
    hit["dblp_phase"] = [phase.get((s, r)) for s, r in zip(hit["seed"], hit["round"], strict=True)]
    rows = [f"| {dblp}'s phase at the burst | " + " | ".join(order) + " |",
            "|---" * (len(order) + 1) + "|"]
    rows += _median_rows(hit, "dblp_phase", [(ph, ph) for ph in ("critical", "relaxed")], order)
    return "\n".join(rows) + "\n"


#: Tables rendered from summary.json alone.
TABLES: dict[str, Callable[[dict], str]] = {
    "arms": arms_table,
    "verdicts": verdicts_table,
    "intervals": intervals_table,
}
#: Tables that read the reference folder's other files.
FILE_TABLES: dict[str, Callable[[pathlib.Path], str]] = {
    "levels": levels_table,
    "phases": phases_table,
}


def render(ref: str, table: str, reference_dir: pathlib.Path) -> str:
    """The markdown of one marked block."""
    if table in FILE_TABLES:
        return FILE_TABLES[table](reference_dir / ref)
    if table not in TABLES:
        raise ValueError(f"README block names table {table!r}; known: "
                         f"{', '.join([*TABLES, *FILE_TABLES])}")
    return TABLES[table](_load(reference_dir / ref))


def update(text: str, reference_dir: pathlib.Path, only: tuple[str, ...] = ()) -> str:
    """``text`` with every marked block (of the ``only`` references, if given) rendered afresh."""
    def one(m):
        if only and m["ref"] not in only:
            return m.group(0)
        return m.group(1) + render(m["ref"], m["table"], reference_dir) + m.group(5)
    return BLOCK_RE.sub(one, text)


def stale(text: str, reference_dir: pathlib.Path, only: tuple[str, ...] = ()) -> list[str]:
    """``ref table`` of every marked block whose text is not what the files give."""
    return [f"{m['ref']} {m['table']}" for m in BLOCK_RE.finditer(text)
            if (not only or m["ref"] in only)
            and m["body"] != render(m["ref"], m["table"], reference_dir)]


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m["ref"], m["table"]) for m in BLOCK_RE.finditer(text)]
