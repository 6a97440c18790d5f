"""The line-rate table: `bench transport` at several link rates over repeated runs, DBLP beside gloo.

Its own module because it is the one table that pools runs: each cell is a
median over runs of that run's median, each ratio is taken within a run
(both transports measured on the same pair), and a run whose rows ran
under CPU steal is set aside from the claims rather than mixed in, since a
neighbour's load reads, in a round trip, exactly like a slower transport.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
from collections.abc import Sequence

from testbed.analysis.pages.cells import num, pct
from testbed.analysis.pages.files import read_jsons
from testbed.analysis.pages.registry import register
from testbed.analysis.pages.transport import trip
from testbed.cpustat import STEAL_FLAG


def over_runs(rows: Sequence[dict | None]) -> dict | None:
    """One bench row standing for the same row of several runs: the median of each figure.

    A run whose row missed its deadline counts as infinitely slow, so a median
    that is a missed deadline shows as one.
    """
    kept = [r for r in rows if r is not None]
    if not kept:
        return None

    def med(key: str) -> float | None:
        vals = [r.get(key) for r in kept]
        if key in ("round_trip_s", "ratio"):
            vals = [math.inf if v is None else v for v in vals]
        nums = [v for v in vals if v is not None]
        m = statistics.median(nums) if nums else None
        return None if m is None or not math.isfinite(m) else m

    keys = ("round_trip_s", "ratio", "cpu_s_per_gb_worker", "cpu_s_per_gb_server")
    return {**kept[0], **{k: med(k) for k in keys}}


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


#: The rows a line-rate claim reads, as ``_find``'s arguments after the document.
SHARDED, GLOO = ("dblp", "sharded"), ("gloo", "allreduce")


def _find(doc: dict, impl: str, mode: str, loss: float, auth: bool = False) -> dict | None:
    """A document's reliable row of ``impl`` in ``mode`` at ``loss``, with or without a secret."""
    return next((r for r in doc["rows"] if r["impl"] == impl and r["loss"] == loss
                 and r.get("mode") == mode and r["policy"] == "reliable"
                 and bool(r.get("auth")) == auth), None)


def _runs_of(docs: list[dict], *rows) -> tuple[list[tuple], int]:
    """Per run, the ``rows`` (impl, mode, loss) a claim reads, and how many runs it sets
    aside because one of them ran under CPU steal (a run lacking one is left out)."""
    found = [tuple(_find(d, *r) for r in rows) for d in docs]
    per = [tuple(x for x in t if x is not None) for t in found if None not in t]
    kept = [t for t in per if not any(_stolen(x) for x in t)]
    return kept, len(per) - len(kept)


def _within_run(docs: list[dict], a_row: tuple, b_row: tuple) -> tuple[list[float], int]:
    """Per run, ``a_row``'s round trip over ``b_row``'s (rows as ``_find``'s arguments),
    and the runs set aside for CPU steal."""
    per = [(_find(d, *a_row), _find(d, *b_row)) for d in docs]
    pairs = [(a, b) for a, b in per if a is not None and b is not None]
    kept = [(a, b) for a, b in pairs if not (_stolen(a) or _stolen(b))]
    return ([a["round_trip_s"] / b["round_trip_s"] for a, b in kept
             if a["round_trip_s"] and b["round_trip_s"]], len(pairs) - len(kept))


def _cpu(row: dict | None) -> str:
    """A row's CPU seconds per GB, worker / server."""
    if row is None:
        return "–"
    return f"{num(row.get('cpu_s_per_gb_worker'), '{:.1f}')} / " \
           f"{num(row.get('cpu_s_per_gb_server'), '{:.1f}')}"


def _median_range(vals: list[float]) -> str:
    return f"{statistics.median(vals):.2f}x ({_range(vals)})" if vals else "–"


def _link(docs: list[dict]) -> str:
    return f"{docs[0]['rate_bps'] / 1e9:g} Gbit/s"


@dataclasses.dataclass
class _Claims:
    """What the sentences after the table say, gathered link by link as its rows are made."""

    vs_gloo: list[str] = dataclasses.field(default_factory=list)
    vs_bound: list[str] = dataclasses.field(default_factory=list)
    beats: list[str] = dataclasses.field(default_factory=list)
    tight: list[str] = dataclasses.field(default_factory=list)
    key_cost: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: {"ps": [], "sharded": []})
    keyed_vs_gloo: list[str] = dataclasses.field(default_factory=list)


def _head(lossy: list[float], keyed: bool) -> list[str]:
    head = ["link, gradient", "reliable PS, 0 %", "reliable sharded, 0 %", "gloo, 0 %",
            "sharded / gloo, 0 % (range)"]
    for x in lossy:
        head += [f"reliable sharded, {pct(x)}", f"gloo, {pct(x)}"]
    head += ["CPU s/GB sharded", "CPU s/GB gloo"]
    if keyed:
        head += ["keyed / unkeyed PS, 0 % (range)", "keyed / unkeyed sharded, 0 % (range)",
                 "keyed sharded / gloo, 0 % (range)"]
    return head


def _loss_free_cells(docs: list[dict], over: dict, claims: _Claims) -> list[str]:
    """The link's first cells (its loss-free round trips, sharded / gloo) and its loss-free
    claims: sharded within 1.2x of gloo, and of its bound where gloo is within 1.2x of its."""
    link = _link(docs)
    both, aside = _runs_of(docs, (*SHARDED, 0.0), (*GLOO, 0.0))
    per_run = [a["round_trip_s"] / b["round_trip_s"] for a, b in both
               if a["round_trip_s"] and b["round_trip_s"]]
    ratio = (f"{statistics.median(per_run):.2f}x ({_range(per_run)})" if per_run else "–")
    cells = [f"{link}, {docs[0]['bytes'] / (1 << 20):g} MiB",
             trip(over["dblp", "ps", 0.0]), trip(over[(*SHARDED, 0.0)]),
             trip(over[(*GLOO, 0.0)]), ratio]
    if per_run or aside:
        claims.vs_gloo.append(f"{link} {_claim(per_run, 1.2, aside)}")
    gloo_near = [b["ratio"] for _, b in both if b["ratio"]]
    own = [a["ratio"] for a, _ in both if a["ratio"]]
    if own and gloo_near and statistics.median(gloo_near) <= 1.2:
        limit = 1.1 if docs[0]["rate_bps"] <= 100e6 else 1.2
        claims.vs_bound.append(f"{link} within {limit:g}x {_claim(own, limit, aside, fmt=None)} "
                               f"({_range(own, '{:.3f}')}x; gloo {_range(gloo_near)}x)")
    return cells


def _lossy_cells(docs: list[dict], lossy: list[float], over: dict, claims: _Claims) -> list[str]:
    """Sharded and gloo at each loss, and whether sharded beat gloo there in each run."""
    cells = []
    for x in lossy:
        cells += [trip(over[(*SHARDED, x)]), trip(over[(*GLOO, x)])]
        # Per run, sharded's time over gloo's (a gloo row past its deadline: 0).
        pairs, aside_x = _runs_of(docs, (*SHARDED, x), (*GLOO, x))
        won = [a["round_trip_s"] / b["round_trip_s"] if b["round_trip_s"] else 0.0
               for a, b in pairs if a["round_trip_s"] is not None]
        if won or aside_x:
            claims.beats.append(f"{_link(docs)} at {pct(x)} "
                                f"{_claim(won, 1.0, aside_x, below=True, fmt=None)}")
    return cells


def _tight_claims(docs: list[dict], losses: list[float], claims: _Claims) -> None:
    """At 0.1 Gbit/s (the transport reference's rate), every row within 1.1x of its bound."""
    if docs[0]["rate_bps"] > 100e6:
        return
    for impl, mode in (("dblp", "ps"), SHARDED):
        for x in losses:
            rows, aside_t = _runs_of(docs, (impl, mode, x))
            v = [r["ratio"] for (r,) in rows if r["ratio"]]
            if v or aside_t:
                claims.tight.append(f"{'PS' if mode == 'ps' else mode} at {pct(x)} "
                                    f"{_claim(v, 1.1, aside_t, fmt='{:.3f}')}")


def _keyed_cells(docs: list[dict], claims: _Claims) -> list[str]:
    """What a secret costs without loss, within each run: keyed over unkeyed (PS, sharded),
    keyed sharded over gloo."""
    link, cells = _link(docs), []
    for mode in ("ps", "sharded"):
        cost, aside_k = _within_run(docs, ("dblp", mode, 0.0, True), ("dblp", mode, 0.0))
        cells.append(_median_range(cost))
        if cost or aside_k:
            claims.key_cost[mode].append(f"{link} {_claim(cost, 1.1, aside_k)}")
    vs, aside_g = _within_run(docs, (*SHARDED, 0.0, True), (*GLOO, 0.0))
    cells.append(_median_range(vs))
    if vs or aside_g:
        claims.keyed_vs_gloo.append(f"{link} {_claim(vs, 1.2, aside_g)}")
    return cells


def _link_row(docs: list[dict], losses: list[float], keyed: bool, claims: _Claims) -> str:
    """One link's row of the table (its runs' medians), gathering its claims into ``claims``."""
    over = {(impl, mode, x): over_runs([r for (r,) in _runs_of(docs, (impl, mode, x))[0]])
            for impl, mode in (("dblp", "ps"), SHARDED, GLOO) for x in losses}
    lossy = [x for x in losses if x > 0]
    cells = _loss_free_cells(docs, over, claims) + _lossy_cells(docs, lossy, over, claims)
    _tight_claims(docs, losses, claims)
    cells += [_cpu(over[(*SHARDED, 0.0)]), _cpu(over[(*GLOO, 0.0)])]
    if keyed:
        cells += _keyed_cells(docs, claims)
    return "| " + " | ".join(cells) + " |"


def _method_sentence(groups: list[list[dict]], keyed: bool) -> str:
    """How many runs of what, and what a cell and a ratio are."""
    first = groups[0][0]
    n_runs = sorted({len(docs) for docs in groups})
    runs = (f"{n_runs[0]} run" + ("s" if n_runs[0] > 1 else "") if len(n_runs) == 1
            else f"{n_runs[0]}-{n_runs[-1]} runs")
    reps = f"{first['reps']} round trip" + ("s" if first["reps"] > 1 else "")
    order = (", the rows' round trips interleaved (each row's k-th before any row's k+1-th)"
             if all(d.get("order", "").startswith("interleaved") for docs in groups for d in docs)
             else "")
    secret = "with and without a secret" if keyed else "no secret"
    return (f"{runs.capitalize()} of one `bench transport` per link (UDP control, {secret}), "
            f"each giving medians of {reps}{order}; a cell is the median over the runs, in seconds "
            f"(time / `bound_s`); sharded / gloo is taken within each run. CPU s/GB: CPU "
            f"seconds of each side's process (rank 0 / rank 1) in the collective alone, per "
            f"GB it sent and received. ")


def _claims_sentences(claims: _Claims, lossy: bool, keyed: bool) -> str:
    """Each line-rate claim, read from its range over the runs."""
    text = f"Sharded within 1.2x of gloo without loss: {'; '.join(claims.vs_gloo) or 'none'}. "
    if claims.vs_bound:
        text += f"Where gloo is within 1.2x of its bound, sharded is: {'; '.join(claims.vs_bound)}. "
    if lossy:
        text += f"Sharded faster than gloo under loss: {'; '.join(claims.beats) or 'none'}. "
    if claims.tight:
        text += f"The 0.1 Gbit/s rows within 1.1x of their bound: {'; '.join(claims.tight)}. "
    if keyed:
        ps, sharded = claims.key_cost["ps"], claims.key_cost["sharded"]
        text += (f"Keyed within 1.1x of unkeyed without loss: PS {'; '.join(ps) or 'none'}"
                 f"; sharded {'; '.join(sharded) or 'none'}. Keyed sharded within "
                 f"1.2x of gloo without loss: {'; '.join(claims.keyed_vs_gloo) or 'none'}. ")
    return text


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
    losses = groups[0][0]["losses"]
    lossy = [x for x in losses if x > 0]
    keyed = any(r.get("auth") for docs in groups for d in docs for r in d["rows"])
    head = _head(lossy, keyed)
    claims = _Claims()
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    out += [_link_row(docs, losses, keyed, claims) for docs in groups]
    text = "\n".join(out) + "\n\n"
    text += _method_sentence(groups, keyed)
    text += _claims_sentences(claims, bool(lossy), keyed)
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
