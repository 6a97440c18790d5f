"""The tight bound's round trip over the loose one's, over repeated `bench transport` runs.

The paper's burst-round speedup (4.0-5.9x) is, in the bench's terms, the
round trip of the tight bound (0.8 %) over the loose one's (40.8 %) while
the loss lasts every pass of the round. Two references measure it: the
paper's burst levels (60-90 %) on the data path only, with this
transport's costs and with the prototype's (`bound_levels_table`), and the
same ratio at line rate, 1 and 10 Gbit/s with 64-256 MiB gradients
(`bound_ratio_table`). Each sets the measured ratio beside the ratio of
the bounds' pass counts, ceil(ln P_tight / ln p) / ceil(ln P_loose / ln p)
(`pass_count_ratio`): what a round would show if every pass cost the same
fixed time whatever its bytes (a probe wait, a retransmission timer),
where a pass that costs its bytes gives about (1 - P_tight) / (1 - P_loose)
= 1.68x instead.

The run is the unit of an interval: one run's repetitions share the
machine's state of the moment (`testbed.analysis.pages.line_rate`), so the
ratio is taken within each run and the interval is Student's t over the
runs' log ratios (`testbed.analysis.intervals.over_seeds`, the run in the
seed's place). A row is capped in a run where one of its repetitions
reached the round deadline: such a run gives no ratio, and the table says
in how many runs that happened instead of leaving it out.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import statistics

from testbed.analysis.intervals import T_LOG_METHOD, Interval, over_seeds
from testbed.analysis.pages.cells import interval, num, pct
from testbed.analysis.pages.files import read_jsons
from testbed.analysis.pages.line_rate import over_runs
from testbed.analysis.pages.registry import register
from testbed.analysis.pages.transport import COSTS, loose_bound_pairs, trip
from testbed.analysis.regime import PAPER_RANGE
from testbed.physics import passes


def pass_count_ratio(tight: float, loose: float, loss: float) -> float | None:
    """The ideal passes of the tight bound over the loose one's at loss ``loss`` (None: undefined).

    `testbed.physics.passes`, the formula of the bench's ``ideal_passes``:
    ceil(ln P / ln p), at least one pass.
    """
    a, b = passes(tight, loss), passes(loose, loss)
    return a / b if math.isfinite(a) and math.isfinite(b) else None


def capped(row: dict) -> bool:
    """Whether a repetition of a bench row reached its round deadline (or the row has no median)."""
    return bool(row.get("timeouts")) or row.get("round_trip_s") is None


@dataclasses.dataclass
class Level:
    """One (loss, mode, control, costs) of a set of runs: its tight and loose rows per run."""

    loss: float
    mode: str
    control: str
    costs: str
    pairs: list[dict]  # `loose_bound_pairs` entries, one per run

    @property
    def tight_bound(self) -> float:
        return self.pairs[0]["tight"]["bound"]

    @property
    def loose_bound(self) -> float:
        return self.pairs[0]["loose"]["bound"]

    @property
    def capped(self) -> int:
        """The runs in which the tight or the loose row reached its deadline."""
        return sum(capped(p["tight"]) or capped(p["loose"]) for p in self.pairs)

    @property
    def ratios(self) -> list[float]:
        """Per run whose rows met every deadline, the tight round trip over the loose one."""
        return [p["ratio"] for p in self.pairs
                if p["ratio"] and not (capped(p["tight"]) or capped(p["loose"]))]

    @property
    def point(self) -> float | None:
        """The geometric mean of the runs' ratios (the point of the log-scale interval)."""
        r = self.ratios
        return math.exp(statistics.fmean(math.log(x) for x in r)) if r else None

    @functools.cached_property
    def interval(self) -> Interval | None:
        """Student t over the runs' log ratios; None with fewer than two runs or no spread."""
        try:
            return over_seeds(dict(enumerate(self.ratios)), method=T_LOG_METHOD)
        except ValueError:  # fewer than two runs, or runs without spread (TooFewSeeds)
            return None

    @property
    def ideal(self) -> tuple[float, float]:
        return passes(self.tight_bound, self.loss), passes(self.loose_bound, self.loss)

    @property
    def pass_ratio(self) -> float | None:
        return pass_count_ratio(self.tight_bound, self.loose_bound, self.loss)


def levels(docs: list[dict]) -> list[Level]:
    """The runs' tight/loose pairs (`loose_bound_pairs`) gathered by loss, mode, control and
    costs: by loss, PS first, UDP control first (the bench's own order), ours first."""
    by: dict[tuple, Level] = {}
    for doc in docs:
        for p in loose_bound_pairs(doc):
            key = (p["loss"], p["mode"], p["control"], p["costs"])
            by.setdefault(key, Level(*key, pairs=[])).pairs.append(p)
    return sorted(by.values(), key=lambda x: (x.loss, x.mode != "ps", x.control != "udp",
                                              COSTS.index(x.costs)))


def _span(vals: list[float]) -> str:
    """``lo-hi`` of some ratios at two decimals, one figure when they round alike."""
    lo, hi = f"{min(vals):.2f}", f"{max(vals):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _bound_label(bound: float) -> str:
    return f"P {pct(bound)}"


def _where(level: Level) -> str:
    mode = "PS" if level.mode == "ps" else level.mode
    return f"{mode}, {level.control.upper()}"


def _ratio_cell(level: Level) -> str:
    """The interval over runs; with one run, its ratio and the range at its repetitions' extremes."""
    iv = level.interval
    if iv is not None:
        return interval(iv.to_dict(), "{:.2f}", "x")
    if level.point is None:
        return "–"
    if len(level.pairs) == 1:
        p = level.pairs[0]
        return f"{level.point:.2f}x ({num(p['lo'], '{:.2f}')}-{num(p['hi'], '{:.2f}', none='')})"
    return f"{level.point:.2f}x"


def _level_cells(level: Level) -> list[str]:
    """The cells every table of this module shows of a level, after the ones that say where."""
    a, b = level.ideal
    pass_ratio = level.pass_ratio
    pass_cell = "–" if pass_ratio is None else f"{pass_ratio:.2f}x ({a:.0f} / {b:.0f})"

    def measured(side: str) -> str:
        vals = [p[side].get("passes") for p in level.pairs]
        vals = [v for v in vals if v is not None]
        return num(statistics.median(vals) if vals else None)

    n = len(level.pairs)
    capped_cell = "none" if not level.capped else f"capped in {level.capped} of {n} runs"
    return [trip(over_runs([p["tight"] for p in level.pairs])),
            trip(over_runs([p["loose"] for p in level.pairs])), _ratio_cell(level), pass_cell,
            f"{measured('tight')} / {measured('loose')}", capped_cell]


def _level_head(level: Level, one_run: bool) -> list[str]:
    """The columns of `_level_cells`; ``one_run``: every level has one run (ranges, no intervals)."""
    t, lo = _bound_label(level.tight_bound), _bound_label(level.loose_bound)
    what = "(range)" if one_run else "[95 % interval]"
    return [f"{t} round trip", f"{lo} round trip", f"{t} / {lo} {what}",
            "pass-count ratio (ideal passes)", f"measured passes {t} / {lo}", "capped"]


def _runs_phrase(n_runs: list[int]) -> str:
    runs = sorted(set(n_runs))
    if len(runs) == 1:
        return f"{runs[0]} run" + ("s" if runs[0] > 1 else "")
    return f"{runs[0]}-{runs[-1]} runs"


def _method(docs: list[dict], n_runs: list[int], size: str = "") -> str:
    """What the cells are: runs, repetitions, the loss, the interval, capped rows, pass counts.

    ``size``: the gradient and link every run shares ("4 MiB at 100 Mbit/s"), if they do.
    """
    first = docs[0]
    deadlines = sorted({r["round_timeout_s"] for d in docs for r in d["rows"]})
    deadline = "/".join(f"{x:g}" for x in deadlines)
    text = (f"{_runs_phrase(n_runs).capitalize()} of one `bench transport` each, "
            + (f"{size}, " if size else "") + "medians of "
            f"{first['reps']} round trips per row; loss on `{first.get('loss_on', 'all')}` "
            f"({first.get('loss_applies_to', 'every packet')}), lasting every pass of the "
            "round. A round-trip cell is the median over the runs of each run's median, in "
            "seconds (time / `bound_s`). The ratio is taken within each run: the geometric "
            "mean over the runs with its 95 % Student t interval on the log ratios (the run is "
            "the unit), over the runs where neither row reached its "
            f"{deadline} s deadline; with one run, the ratio of its medians and its range at "
            "the repetitions' extremes. A row is capped in a run where a repetition reached the "
            "deadline: that run gives no ratio, and its median counts the repetition as "
            "slowest. The pass-count ratio is that of each bound's ideal passes, ceil(ln P / "
            "ln p), from the rows' bounds; measured passes are the median over the runs of each row's median "
            "(the larger of push and pull).")
    proto = next((d["prototype_costs"] for d in docs if d.get("prototype_costs")), None)
    if proto:
        settings = ", ".join(f"`{k} = {_setting(v)}`" for k, v in proto["settings"].items())
        text += (f" Prototype costs: the cost table's step `{proto['reference']}` "
                 f"({proto['adds']}), run as {settings}.")
    steal = [r["cpu_steal_frac"] for d in docs for r in d["rows"]
             if r.get("cpu_steal_frac") is not None]
    if steal:
        text += (f" CPU steal over the rows: median {pct(statistics.median(steal))}, "
                 f"highest {pct(max(steal))}.")
    return text


def _setting(v) -> str:
    """A setting as the transport's JSON writes it (true, null, 1.0, fixed)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def bound_levels_table(ref_dir: pathlib.Path) -> str:
    """Per loss level, control path and costs: the tight bound's round trip over the loose one's.

    Each ``bench-transport-*.json`` is one run of the whole set; the table
    has one row per (loss, mode, control, costs), the ratio's interval over
    the runs beside the pass-count ratio, and says where a row was capped.
    """
    docs = read_jsons(ref_dir, "bench-transport-*.json")
    lv = levels(docs)
    if not lv:
        raise ValueError(f"{ref_dir}: the bench has no pair of static-bound rows")
    one_run = all(len(x.pairs) == 1 for x in lv)
    head = ["loss p", "mode, control", "costs", *_level_head(lv[0], one_run)]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for level in lv:
        cells = [pct(level.loss), _where(level), level.costs, *_level_cells(level)]
        out.append("| " + " | ".join(cells) + " |")
    sizes = {f"{d['bytes'] / (1 << 20):g} MiB at {d['rate_bps'] / 1e6:g} Mbit/s" for d in docs}
    size = sizes.pop() if len(sizes) == 1 else ""
    return "\n".join(out) + "\n\n" + _method(docs, [len(x.pairs) for x in lv], size) + "\n"


def bound_ratio_table(ref_dir: pathlib.Path) -> str:
    """Per link rate, gradient size, loss and control: the tight bound's round trip over the loose one's.

    Each ``bench-transport-*.json`` is one run at one rate and size (several
    runs of one make the interval); rows slowest link first, then smallest
    gradient.
    """
    groups: dict[tuple[float, int], list[dict]] = {}
    for doc in read_jsons(ref_dir, "bench-transport-*.json"):
        groups.setdefault((doc["rate_bps"], doc["bytes"]), []).append(doc)
    out: list[str] = []
    n_runs: list[int] = []
    one_run = all(len(docs) == 1 for docs in groups.values())
    for (rate, nbytes), docs in sorted(groups.items()):
        for level in levels(docs):
            if not out:
                head = ["link, gradient", "loss p", "mode, control", *_level_head(level, one_run)]
                out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
            costs = "" if level.costs == "ours" else ", prototype costs"
            cells = [f"{rate / 1e9:g} Gbit/s, {nbytes / (1 << 20):g} MiB", pct(level.loss),
                     _where(level) + costs, *_level_cells(level)]
            out.append("| " + " | ".join(cells) + " |")
            n_runs.append(len(level.pairs))
    if not out:
        raise ValueError(f"{ref_dir}: the bench has no pair of static-bound rows")
    docs = [d for ds in groups.values() for d in ds]
    return "\n".join(out) + "\n\n" + _method(docs, n_runs) + "\n"


#: Where a bench's loss fell (its ``loss_on``), as the sentence says it.
_LOSS_ON = {"all": " on every packet", "data": " on the data path alone",
            "control": " on the control path alone"}


def _level_where(level: Level) -> str:
    costs = "this transport's costs" if level.costs == "ours" else "the prototype's costs"
    return f"{pct(level.loss)} ({level.control.upper()} control, {costs})"


def paper_range_sentence(ref_dir: pathlib.Path) -> str:
    """One sentence, for the README: where the paper's 4.0-5.9x comes from, as the rows say.

    Built from the committed runs alone (`bound_levels_table`'s levels): the
    range of the measured ratio against the range of the pass-count ratio,
    then the levels whose whole interval lies at or above the paper's least
    speedup (there the range can come from the passes), those whose interval
    only reaches it, or that none does; and the capped rows, if any.
    """
    docs = read_jsons(ref_dir, "bench-transport-*.json")
    lv = levels(docs)
    if not lv:
        raise ValueError(f"{ref_dir}: the bench has no pair of static-bound rows")
    least, most = PAPER_RANGE
    points = [x.point for x in lv if x.point is not None]
    ideal = [x.pass_ratio for x in lv if x.pass_ratio is not None]
    losses = ", ".join(pct(x) for x in sorted({x.loss for x in lv}))
    on = _LOSS_ON.get(docs[0].get("loss_on", "all"), "")
    text = (f"In `{ref_dir.name}` ({losses} loss{on}, lasting every pass of the round), the "
            f"{pct(lv[0].tight_bound)} bound's round trip over the {pct(lv[0].loose_bound)} "
            "bound's is ")
    text += f"{_span(points)}x" if points else "not measured (every row capped)"
    if ideal:
        text += f", where the bounds' pass counts alone give {_span(ideal)}x"
    text += ". "
    whole = [x for x in lv if x.interval is not None and x.interval.lo >= least]
    reach = [x for x in lv if x not in whole and x.interval is not None
             and x.interval.hi >= least]

    def listed(group: list[Level]) -> str:
        return ", ".join(f"{_level_where(x)} {interval(x.interval.to_dict(), '{:.2f}', 'x')}"
                         for x in group if x.interval is not None)
    if whole:
        text += (f"The paper's {least:.1f}-{most:.1f}x can come from the bound's passes where "
                 f"the interval lies at or above {least:.1f}x: {listed(whole)}.")
    elif reach:
        text += (f"No interval lies at or above {least:.1f}x; {listed(reach)} only reach it, so "
                 f"these rows cannot say that the paper's {least:.1f}-{most:.1f}x comes from "
                 "the passes.")
    elif all(x.interval is None for x in lv):
        text += ("No level has an interval (fewer than two runs whose rows met their deadlines, "
                 f"or runs without spread): these rows cannot say where the paper's "
                 f"{least:.1f}-{most:.1f}x comes from.")
    else:
        text += (f"No interval reaches {least:.1f}x: these rows do not show where the paper's "
                 f"{least:.1f}-{most:.1f}x comes from.")
    caps = [x for x in lv if x.capped]
    if caps:
        text += (" Capped (a repetition reached the round deadline, its run left out of the "
                 "interval): " + ", ".join(f"{_level_where(x)} in {x.capped} of "
                                           f"{len(x.pairs)} runs" for x in caps) + ".")
    return text + "\n"


register("bound-levels", bound_levels_table)
register("bound-ratio", bound_ratio_table)
register("paper-range", paper_range_sentence)
