"""The line-rate table: `bench transport` at several link rates over repeated runs, DBLP beside gloo.

Its own module because it is the one table that pools runs: each cell is a
median over runs of that run's median, each ratio is taken within a run
(both transports measured on the same pair), and a run whose rows ran
under CPU steal is set aside from the claims rather than mixed in, since a
neighbour's load reads, in a round trip, exactly like a slower transport.
"""
from __future__ import annotations

import math
import pathlib
import statistics

from testbed.analysis.pages.cells import num, pct
from testbed.analysis.pages.files import read_jsons
from testbed.analysis.pages.registry import register
from testbed.analysis.pages.transport import trip
from testbed.cpustat import STEAL_FLAG


def _over_runs(rows: list[dict | None]) -> dict | None:
    """One bench row standing for the same row of several runs: the median of each figure.

    A run whose row missed its deadline counts as infinitely slow, so a median
    that is a missed deadline shows as one.
    """
    rows = [r for r in rows if r is not None]
    if not rows:
        return None

    def med(key):
        vals = [r.get(key) for r in rows]
        if key in ("round_trip_s", "ratio"):
            vals = [math.inf if v is None else v for v in vals]
        vals = [v for v in vals if v is not None]
        m = statistics.median(vals) if vals else None
        return None if m is None or not math.isfinite(m) else m

    keys = ("round_trip_s", "ratio", "cpu_s_per_gb_worker", "cpu_s_per_gb_server")
    return {**rows[0], **{k: med(k) for k in keys}}


def _in_runs(vals: list[float], limit: float, below: bool = False, aside: int = 0) -> str:
    """How many of the runs' values are at most ``limit`` (under it: ``below``): every run,
    no run, or k of n; with runs set aside for CPU steal, always k of the n left and how
    many were set aside."""
    k = sum((v < limit) if below else (v <= limit) for v in vals)
    if aside:
        return f"{k} of {len(vals)} runs left ({aside} set aside for CPU steal)"
    return "every run" if k == len(vals) else "no run" if k == 0 else f"{k} of {len(vals)} runs"


def _range(vals: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}-{fmt.format(hi)}"


def _stolen(row: dict) -> bool:
    """Whether a bench row ran under enough CPU steal that a neighbour may have set its time."""
    return (row.get("cpu_steal_frac") or 0.0) >= STEAL_FLAG


def _claim(vals: list[float], limit: float, aside: int, below: bool = False,
           fmt: str | None = "{:.2f}") -> str:
    """"in every run (range)", "in k of n runs left (m set aside ...) (range)"."""
    where = f"in {_in_runs(vals, limit, below, aside)}"
    return where if fmt is None or not vals else f"{where} ({_range(vals, fmt)}x)"


def line_rate_table(ref_dir: pathlib.Path) -> str:
    """`bench transport` at several link rates, over repeated runs: DBLP sharded beside gloo.

    One row per link rate, slowest first; each ``bench-transport-*.json`` is one
    run at one rate, and a cell is the median over the runs of that run's median
    round trip (its ratio to ``bound_s``). "sharded / gloo" is computed within
    each run, both measured on the same pair (their round trips interleaved, where
    the document's ``order`` says so), and shown as the
    median and the range over the runs. After the table, each of the line-rate
    claims read from its range over the runs: within 1.2x of gloo without loss,
    within 1.2x (1.1x at 0.1 Gbit/s) of its bound, faster than gloo under loss.
    Runs made with ``--auth both`` add what a secret costs, also within each
    run: keyed over unkeyed (PS and sharded) and keyed sharded over gloo, each
    without loss, with the claims within 1.1x of unkeyed and 1.2x of gloo.
    """
    by_rate: dict[float, list[dict]] = {}
    for doc in read_jsons(ref_dir, "bench-transport-*.json"):
        by_rate.setdefault(doc["rate_bps"], []).append(doc)
    groups = [by_rate[r] for r in sorted(by_rate)]
    first = groups[0][0]
    losses = first["losses"]
    lossy = [x for x in losses if x > 0]

    keyed = any(r.get("auth") for docs in groups for d in docs for r in d["rows"])

    def find(doc, impl, mode, loss, auth=False):
        return next((r for r in doc["rows"] if r["impl"] == impl and r["loss"] == loss
                     and r.get("mode") == mode and r["policy"] == "reliable"
                     and bool(r.get("auth")) == auth), None)

    def runs_of(docs, *rows):
        """Per run, the ``rows`` (impl, mode, loss) a claim reads, and how many runs it sets
        aside because one of them ran under CPU steal (a run lacking one is left out)."""
        per = [tuple(find(d, *r) for r in rows) for d in docs]
        per = [t for t in per if all(x is not None for x in t)]
        kept = [t for t in per if not any(_stolen(x) for x in t)]
        return kept, len(per) - len(kept)

    def cpu(row):
        if row is None:
            return "–"
        return f"{num(row.get('cpu_s_per_gb_worker'), '{:.1f}')} / " \
               f"{num(row.get('cpu_s_per_gb_server'), '{:.1f}')}"

    def gbit(docs):
        return f"{docs[0]['rate_bps'] / 1e9:g}"

    head = ["link, gradient", "reliable PS, 0 %", "reliable sharded, 0 %", "gloo, 0 %",
            "sharded / gloo, 0 % (range)"]
    for x in lossy:
        head += [f"reliable sharded, {pct(x)}", f"gloo, {pct(x)}"]
    head += ["CPU s/GB sharded", "CPU s/GB gloo"]
    if keyed:
        head += ["keyed / unkeyed PS, 0 % (range)", "keyed / unkeyed sharded, 0 % (range)",
                 "keyed sharded / gloo, 0 % (range)"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    vs_gloo, vs_bound, beats, tight = [], [], [], []
    key_cost: dict[str, list[str]] = {"ps": [], "sharded": []}
    keyed_vs_gloo: list[str] = []

    def within_run(docs, a_row, b_row):
        """Per run, ``a_row``'s round trip over ``b_row``'s (rows as ``find``'s arguments),
        and the runs set aside for CPU steal."""
        per = [(find(d, *a_row), find(d, *b_row)) for d in docs]
        per = [(a, b) for a, b in per if a is not None and b is not None]
        kept = [(a, b) for a, b in per if not (_stolen(a) or _stolen(b))]
        return ([a["round_trip_s"] / b["round_trip_s"] for a, b in kept
                 if a["round_trip_s"] and b["round_trip_s"]], len(per) - len(kept))

    def median_range(vals):
        return f"{statistics.median(vals):.2f}x ({_range(vals)})" if vals else "–"

    sharded, gloo = ("dblp", "sharded"), ("gloo", "allreduce")
    for docs in groups:
        link = f"{gbit(docs)} Gbit/s"
        over = {(impl, mode, x): _over_runs([r for (r,) in runs_of(docs, (impl, mode, x))[0]])
                for impl, mode in (("dblp", "ps"), sharded, gloo) for x in losses}
        both, aside = runs_of(docs, (*sharded, 0.0), (*gloo, 0.0))
        per_run = [a["round_trip_s"] / b["round_trip_s"] for a, b in both
                   if a["round_trip_s"] and b["round_trip_s"]]
        ratio = (f"{statistics.median(per_run):.2f}x ({_range(per_run)})" if per_run else "–")
        cells = [f"{link}, {docs[0]['bytes'] / (1 << 20):g} MiB",
                 trip(over["dblp", "ps", 0.0]), trip(over[(*sharded, 0.0)]),
                 trip(over[(*gloo, 0.0)]), ratio]
        if per_run or aside:
            vs_gloo.append(f"{link} {_claim(per_run, 1.2, aside)}")
        gloo_near = [b["ratio"] for _, b in both if b["ratio"]]
        own = [a["ratio"] for a, _ in both if a["ratio"]]
        if own and gloo_near and statistics.median(gloo_near) <= 1.2:
            limit = 1.1 if docs[0]["rate_bps"] <= 100e6 else 1.2
            vs_bound.append(f"{link} within {limit:g}x {_claim(own, limit, aside, fmt=None)} "
                            f"({_range(own, '{:.3f}')}x; gloo {_range(gloo_near)}x)")
        for x in lossy:
            cells += [trip(over[(*sharded, x)]), trip(over[(*gloo, x)])]
            # Per run, sharded's time over gloo's (a gloo row past its deadline: 0).
            pairs, aside_x = runs_of(docs, (*sharded, x), (*gloo, x))
            won = [a["round_trip_s"] / b["round_trip_s"] if b["round_trip_s"] else 0.0
                   for a, b in pairs if a["round_trip_s"] is not None]
            if won or aside_x:
                beats.append(f"{link} at {pct(x)} {_claim(won, 1.0, aside_x, below=True, fmt=None)}")
        if docs[0]["rate_bps"] <= 100e6:
            for impl, mode in (("dblp", "ps"), sharded):
                for x in losses:
                    rows, aside_t = runs_of(docs, (impl, mode, x))
                    v = [r["ratio"] for (r,) in rows if r["ratio"]]
                    if v or aside_t:
                        tight.append(f"{'PS' if mode == 'ps' else mode} at {pct(x)} "
                                     f"{_claim(v, 1.1, aside_t, fmt='{:.3f}')}")
        cells += [cpu(over[(*sharded, 0.0)]), cpu(over[(*gloo, 0.0)])]
        if keyed:
            for mode in ("ps", "sharded"):
                cost, aside_k = within_run(docs, ("dblp", mode, 0.0, True), ("dblp", mode, 0.0))
                cells.append(median_range(cost))
                if cost or aside_k:
                    key_cost[mode].append(f"{link} {_claim(cost, 1.1, aside_k)}")
            vs, aside_g = within_run(docs, (*sharded, 0.0, True), (*gloo, 0.0))
            cells.append(median_range(vs))
            if vs or aside_g:
                keyed_vs_gloo.append(f"{link} {_claim(vs, 1.2, aside_g)}")
        out.append("| " + " | ".join(cells) + " |")
    n_runs = sorted({len(docs) for docs in groups})
    runs = (f"{n_runs[0]} run" + ("s" if n_runs[0] > 1 else "") if len(n_runs) == 1
            else f"{n_runs[0]}-{n_runs[-1]} runs")
    text = "\n".join(out) + "\n\n"
    reps = f"{first['reps']} round trip" + ("s" if first["reps"] > 1 else "")
    order = (", the rows' round trips interleaved (each row's k-th before any row's k+1-th)"
             if all(d.get("order", "").startswith("interleaved") for docs in groups for d in docs)
             else "")
    secret = "with and without a secret" if keyed else "no secret"
    text += (f"{runs.capitalize()} of one `bench transport` per link (UDP control, {secret}), "
             f"each giving medians of {reps}{order}; a cell is the median over the runs, in seconds "
             f"(time / `bound_s`); sharded / gloo is taken within each run. CPU s/GB: CPU "
             f"seconds of each side's process (rank 0 / rank 1) in the collective alone, per "
             f"GB it sent and received. ")
    text += f"Sharded within 1.2x of gloo without loss: {'; '.join(vs_gloo) or 'none'}. "
    if vs_bound:
        text += f"Where gloo is within 1.2x of its bound, sharded is: {'; '.join(vs_bound)}. "
    if lossy:
        text += f"Sharded faster than gloo under loss: {'; '.join(beats) or 'none'}. "
    if tight:
        text += f"The 0.1 Gbit/s rows within 1.1x of their bound: {'; '.join(tight)}. "
    if keyed:
        text += (f"Keyed within 1.1x of unkeyed without loss: PS {'; '.join(key_cost['ps']) or 'none'}"
                 f"; sharded {'; '.join(key_cost['sharded']) or 'none'}. Keyed sharded within "
                 f"1.2x of gloo without loss: {'; '.join(keyed_vs_gloo) or 'none'}. ")
    text += _gro_sentence(groups)
    text += _steal_sentence(groups)
    return text.rstrip() + "\n"


def _gro_sentence(groups: list[list[dict]]) -> str:
    """The veths' offloads, and which rows ran with receive offload (empty before recorded).

    Why: GRO takes most of the receiving stack's per-datagram work off both
    transports, so a loss-free row and a lossy one differ by more than the loss.
    """
    offloads = sorted({d["offloads"] for docs in groups for d in docs if "offloads" in d})
    text = ""
    if len(offloads) == 1:
        text = f"The veths' offloads: {offloads[0]}. "
    elif offloads:
        text = f"The runs' veths differ in offloads ({'; '.join(offloads)}). "
    rows = [r for docs in groups for d in docs for r in d["rows"] if "gro" in r]
    if not rows:
        return text
    free = [r["gro"] for r in rows if r["loss"] == 0]
    lossy = [r["gro"] for r in rows if r["loss"] > 0]
    return text + (f"Receive offload (GRO) was on at both ends in {sum(free)} of the {len(free)} "
                   f"loss-free rows and in {sum(lossy)} of the {len(lossy)} lossy ones (the "
                   f"bench's loss hook sits behind it). ")


def _steal_sentence(groups: list[list[dict]]) -> str:
    """CPU steal over every row of every run, and where it was highest (empty before it was recorded).

    Why: on a shared host a neighbour's load looks, in a round's wall time, exactly like
    a slower transport; a reader can only tell the two apart from this.
    """
    steals = [(r["cpu_steal_frac"], f"{d['rate_bps'] / 1e9:g} Gbit/s run {i}, {r['impl']} "
               f"{r.get('mode')} at {pct(r['loss'])}")
              for docs in groups for i, d in enumerate(docs, 1) for r in d["rows"]
              if r.get("cpu_steal_frac") is not None]
    if not steals:
        return ""
    top = max(steals)
    aside = sum(s >= STEAL_FLAG for s, _ in steals)
    return (f"CPU steal (time the host gave other guests) over the rows: median "
            f"{pct(statistics.median(s for s, _ in steals))}, highest {pct(top[0])} "
            f"({top[1]}); the cells and claims above set aside the {aside} of {len(steals)} "
            f"rows with {pct(STEAL_FLAG)} or more, whose time a neighbour may have set.")


register("line-rate", line_rate_table)
