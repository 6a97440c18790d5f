"""The figures of a run and of a run reference, drawn from the derived tables only.

A run's report (`testbed.analysis.report`) draws each figure twice, a PNG at
print resolution (``PRINT_DPI``) and an SVG beside it for papers and slides;
a run reference keeps the SVG alone, drawn from its kept files
(`testbed.analysis.reference_figures`): ``_save`` writes both for a path
ending in .png and the SVG only for one ending in .svg. Matplotlib runs
headless (Agg), every input is sorted, the SVG's element ids are salted with
a constant, its text stays text and neither file carries a date, so drawing
again from the same tables gives byte-identical files: the report's rebuild
check and the references' page test rely on it.

Every figure says what the verdicts say: a unit the fidelity check flagged
(``valid`` false) decides nothing, so no figure draws it; each unit's time
series starts at its own first round (an arm's seeds ran at different times,
between other arms' units); and a series over rounds is one line per seed,
in round order, with the mean over seeds beside it where one is drawn.
"""
from __future__ import annotations

import io
import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

# No version string or date: rebuilds stay identical across upgrades and days.
_META = {"png": {"Software": "dblp-testbed"}, "svg": {"Creator": "dblp-testbed", "Date": None}}
#: The SVG settings that make a file a function of its figure alone: fixed element ids, text
#: as text (no glyph outlines, which follow the installed font's version) naming the one font
#: it was laid out with (not the whole fallback list in every text element).
_SVG_RC: dict = {"svg.hashsalt": "dblp-testbed", "svg.fonttype": "none",
                 "font.sans-serif": ["DejaVu Sans"]}
PRINT_DPI = 300
#: The most points one line draws. A longer series (a unit's 1,240 rounds) is cut into this
#: many runs of consecutive rounds, one point each (their mean, or the run's slowest round
#: where a spike is what the figure shows), and the figure says so: a kept SVG stays small.
MAX_POINTS = 100
#: Where an SVG holds coordinates (path data, a marker's position), and a coordinate's digits
#: past 1/100 of a point (matplotlib writes six decimals; nothing on a page shows them).
_COORDS = re.compile(rb'(?<= d=")[^"]*|(?<= [xy]=")[^"]*')
_DIGITS = re.compile(rb"(\d\.\d\d)\d+")


def _short_svg(svg: bytes) -> bytes:
    """``svg`` with every coordinate cut to two decimals: a third of a dense figure's bytes."""
    return _COORDS.sub(lambda m: _DIGITS.sub(rb"\1", m.group(0)), svg)


def _colors(arms):
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {a: cycle[i % len(cycle)] for i, a in enumerate(arms)}


def _save(fig, path, tight=True):
    """Write PATH.svg, and PATH itself at PRINT_DPI when it is a PNG; return PATH.

    ``tight``: lay the figure out with tight_layout (not for figures with a shared
    colour bar, which it cannot place: those are cropped to their contents instead)."""
    path = pathlib.Path(path)
    box = {} if tight else {"bbox_inches": "tight"}
    if tight:
        fig.tight_layout()
    if path.suffix != ".svg":
        fig.savefig(path, dpi=PRINT_DPI, metadata=_META["png"], **box)
    buf = io.BytesIO()
    with matplotlib.rc_context(_SVG_RC):
        fig.savefig(buf, format="svg", metadata=_META["svg"], **box)
    path.with_suffix(".svg").write_bytes(_short_svg(buf.getvalue()))
    plt.close(fig)
    return path


def _per_arm_axes(arms, height=1.9, sharey=True):
    """One row of axes per arm (the per-arm plots), sharing the y axis unless told not to."""
    n = max(1, len(arms))
    fig, axes = plt.subplots(n, 1, figsize=(8, height * n + 0.6), sharey=sharey, squeeze=False)
    return fig, axes[:, 0]


def _valid(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of valid units: a unit that broke an invariant is drawn nowhere."""
    if len(df) and "valid" in df.columns:
        return df[df["valid"].astype(bool)]
    return df


def _valid_units(rounds: pd.DataFrame) -> set:
    """(arm, seed) of every valid unit with rounds."""
    r = _valid(rounds)
    return set(zip(r["arm"], r["seed"], strict=True)) if len(r) and "seed" in r else set()


def _of_units(df: pd.DataFrame, units: set) -> pd.DataFrame:
    """The rows of ``df`` (a table with arm and seed) that belong to ``units``."""
    if not len(df) or "seed" not in df:
        return df
    keep = [(a, s) in units for a, s in zip(df["arm"], df["seed"], strict=True)]
    return df[np.asarray(keep, dtype=bool)]


def _thin(x, y, how: str = "mean", limit: int = MAX_POINTS):
    """(x, y, k): the series in runs of k consecutive points, one point per run (k = 1: as is).

    ``how`` "mean": each run's mean x and mean y (a curve's level); "peak": the point of
    each run with the largest y (a latency's spikes stay, at their own time)."""
    d = pd.DataFrame({"x": np.asarray(x, dtype=float), "y": np.asarray(y, dtype=float)})
    d = d[d["y"].notna()].reset_index(drop=True)
    if len(d) <= limit:
        return d["x"].to_numpy(), d["y"].to_numpy(), 1
    k = -(-len(d) // limit)
    runs = np.arange(len(d)) // k
    if how == "peak":
        d = d.loc[d.groupby(runs)["y"].idxmax()]
    else:
        d = d.groupby(runs).mean()
    return d["x"].to_numpy(), d["y"].to_numpy(), k


def _every(k: int, how: str) -> str:
    """What a thinned line's point is, for a title; empty when nothing was thinned."""
    if k <= 1:
        return ""
    return f"; each point the {'slowest' if how == 'peak' else 'mean'} of {k} rounds"


def _log_y(ax, subs=(1.0, 2.0, 5.0)):
    """A log y axis labelled at ``subs`` of each decade, without minor ticks (each one an SVG
    element): 1, 2 and 5 where an axis spans a decade or two, 1 alone where it spans more."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.yaxis.set_minor_locator(ticker.NullLocator())


def _shade_bursts(ax, bursts: pd.DataFrame, arm, t0: int):
    """The arm's actual burst windows, shaded, on an axis of seconds since t0."""
    b = bursts[bursts["arm"] == arm] if len(bursts) else bursts
    for bb in b.itertuples(index=False):
        if pd.notna(bb.actual_start_ns) and pd.notna(bb.actual_end_ns):
            ax.axvspan((bb.actual_start_ns - t0) / 1e9, (bb.actual_end_ns - t0) / 1e9,
                       color="crimson", alpha=0.2, lw=0)


def _unit_windows(r: pd.DataFrame) -> dict:
    """Seed -> (the unit's first round start, its last round end) in ns: each unit's series
    starts at its own zero and ends with its rounds.

    The seeds of one arm run at different times, between other arms' units, so
    one zero per arm would leave most of the axis empty and lay the seeds end
    to end; one per unit overlays them, as the per-seed verdicts compare them.
    Samples outside the unit's rounds (its start-up, its tear-down) are left
    out, so the axis is the rounds' time and no more."""
    return {s: (int(g["t_start_ns"].min()), int(g["t_end_ns"].max()))
            for s, g in r.groupby("seed", sort=True)}


def _unit_starts(r: pd.DataFrame) -> dict:
    """Seed -> the unit's first round start (ns)."""
    return {s: w[0] for s, w in _unit_windows(r).items()}


def _of_seed(df: pd.DataFrame, seed) -> pd.DataFrame:
    return df[df["seed"] == seed] if len(df) and "seed" in df else df


def _in_window(df: pd.DataFrame, window: tuple[int, int], col: str = "t_ns") -> pd.DataFrame:
    t = df[col].to_numpy(dtype=float)
    return df[(t >= window[0]) & (t <= window[1])]


def latency_over_time(rounds: pd.DataFrame, bursts: pd.DataFrame, arms, path):
    """Round latency against time since each unit's first round, one line per valid unit
    (seed); the units' burst windows shaded, their burst rounds circled."""
    rounds = _valid(rounds)
    fig, axes = _per_arm_axes(arms)
    col = _colors(arms)
    thinned = 1
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        if not len(r):
            ax.set_title(f"{arm}: no rounds of a valid unit", fontsize=9)
            continue
        for seed, t0 in _unit_starts(r).items():
            u = _of_seed(r, seed).sort_values("round")
            x, y, k = _thin((u["t_end_ns"].to_numpy(dtype=float) - t0) / 1e9, u["latency_ms"],
                            "peak")
            thinned = max(thinned, k)
            ax.plot(x, y, "-", lw=0.6, alpha=0.7, color=col[arm])
            hit = u[u["in_burst"].astype(bool)]
            ax.plot((hit["t_end_ns"].to_numpy(dtype=float) - t0) / 1e9, hit["latency_ms"], "o",
                    ms=5, mfc="none", color="crimson")
            _shade_bursts(ax, _of_seed(bursts, seed), arm, t0)
        _log_y(ax)
        ax.set_ylabel("ms")
        ax.set_title(f"{arm}: round latency, one line per seed (shaded: burst windows, "
                     "circled: burst rounds)", fontsize=9)
    axes[-1].set_xlabel("seconds since the unit's first round" + _every(thinned, "peak"))
    return _save(fig, path)


def bottleneck_over_time(link: pd.DataFrame, rounds: pd.DataFrame, bursts: pd.DataFrame, arms,
                         path):
    """The bottleneck's transmit rate per sampling interval, burst windows shaded.

    Drawn from port counters: the rate towards the server against the
    shaped rate, and the switch's own drops (what `queue_over_time`, the
    occupancy, does not show); every panel says how coarse the sampling was.
    Each valid unit on its own clock, over its rounds' time.
    """
    rounds = _valid(rounds)
    fig, axes = _per_arm_axes(arms, height=2.1)
    col = _colors(arms)
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        s = link[link["arm"] == arm] if len(link) else link
        s = s[s["tx_mbps"].notna()] if len(s) else s
        if not len(r) or not len(s):
            ax.set_title(f"{arm}: no port statistics of the bottleneck in this arm\n"
                         "(monitor off or no placement in the manifest)", fontsize=8)
            ax.set_axis_off()
            continue
        for i, (seed, window) in enumerate(_unit_windows(r).items()):
            t0 = window[0]
            u = _in_window(_of_seed(s, seed), window)
            x = (u["t_ns"].to_numpy(dtype=float) - t0) / 1e9
            ax.step(x, u["tx_mbps"].to_numpy(dtype=float), where="pre", color=col[arm], lw=0.8,
                    alpha=0.7, label=None if i else "tx rate towards the server, per seed")
            drops = u[u["d_tx_dropped"].fillna(0) > 0]
            if len(drops):
                ax.plot((drops["t_ns"].to_numpy(dtype=float) - t0) / 1e9,
                        drops["tx_mbps"].to_numpy(dtype=float), "x", color="crimson",
                        label=None if i else "switch tx drops in the interval")
            _shade_bursts(ax, _of_seed(bursts, seed), arm, t0)
        ax.axhline(float(s["shaped_mbps"].iloc[0]), color="k", ls="--", lw=0.8, label="shaped rate")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("Mbit/s")
        ax.legend(fontsize=7, loc="lower right")
        first = s.iloc[0]
        ax.set_title(f"{arm}: bottleneck {first['switch']} port {first['port']}, mean tx rate per "
                     f"{float(s['interval_s'].median()):.3g} s sample (OpenFlow port counters)\n"
                     "shaded: burst windows. Queue occupancy: queue_over_time", fontsize=8)
    axes[-1].set_xlabel("seconds since the unit's first round")
    return _save(fig, path)


def queue_over_time(queue: pd.DataFrame, rounds: pd.DataFrame, bursts: pd.DataFrame, arms,
                    path):
    """The bottleneck queue's occupancy per sample against its limit, burst windows shaded.

    Tail drops are marked at the limit in the samples where the queue's
    drop counter rose, so a burst that overflowed the queue shows as a
    plateau at the line with crosses on it. Each valid unit on its own
    clock, over its rounds' time.
    """
    rounds = _valid(rounds)
    fig, axes = _per_arm_axes(arms, height=2.1)
    col = _colors(arms)
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        q = queue[queue["arm"] == arm] if len(queue) else queue
        if not len(r) or not len(q):
            ax.set_title(f"{arm}: no queue samples of the bottleneck in this arm\n"
                         f"(no raw/{arm}/queue.jsonl: run before raw-log schema 2, or tc failed)",
                         fontsize=8)
            ax.set_axis_off()
            continue
        for i, (seed, window) in enumerate(_unit_windows(r).items()):
            t0 = window[0]
            u = _in_window(_of_seed(q, seed), window)
            x = (u["t_ns"].to_numpy(dtype=float) - t0) / 1e9
            ax.step(x, u["backlog_packets"].to_numpy(dtype=float), where="post", lw=0.8,
                    alpha=0.7, color=col[arm], label=None if i else "packets queued, per seed")
            drops = u[u["d_dropped"].fillna(0) > 0]
            if len(drops):
                ax.plot((drops["t_ns"].to_numpy(dtype=float) - t0) / 1e9,
                        drops["limit_packets"].fillna(drops["backlog_packets"])
                        .to_numpy(dtype=float), "x", color="crimson", ms=4,
                        label=None if i else "tail drops since the previous sample")
            _shade_bursts(ax, _of_seed(bursts, seed), arm, t0)
        limit = q["limit_packets"].dropna()
        if len(limit):
            ax.axhline(float(limit.max()), color="k", ls="--", lw=0.8, label="queue limit")
        top = max(float(limit.max()) if len(limit) else 0.0, float(q["backlog_packets"].max()), 1.0)
        ax.set_ylim(0, top * 1.4)   # room above the limit line for the legend
        ax.set_ylabel("packets")
        ax.legend(fontsize=7, loc="upper right", ncol=3)
        period_ms = float(q["t_ns"].diff().median()) / 1e6 if len(q) > 1 else float("nan")
        ax.set_title(f"{arm}: bottleneck {q['interface'].iloc[0]} queue occupancy, sampled every "
                     f"{period_ms:.3g} ms (tc qdisc backlog of the pfifo)\n"
                     "shaded: burst windows", fontsize=8)
    axes[-1].set_xlabel("seconds since the unit's first round")
    return _save(fig, path)


def latency_cdf(rounds: pd.DataFrame, arms, path):
    """Round latency CDF per arm, burst rounds (dashed) apart from normal ones (solid).

    Valid units only, as every interval and verdict: a unit the fidelity check
    flagged decides nothing, so it is drawn nowhere either."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    col = _colors(arms)
    valid = rounds[rounds["valid"].astype(bool)] if "valid" in rounds and len(rounds) else rounds
    for arm in arms:
        r = valid[valid["arm"] == arm] if len(valid) else valid
        hit = r["in_burst"].astype(bool) if len(r) else pd.Series(dtype=bool)
        for part, style, what in ((r[~hit], "-", "normal"), (r[hit], "--", "burst")):
            v = np.sort(part["latency_ms"].to_numpy(dtype=float)) if len(part) else np.array([])
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", ls=style,
                        label=f"{arm}, {what} rounds ({v.size})", color=col[arm])
    ax.set_xscale("log")
    ax.set_xlabel("round latency (ms)")
    ax.set_ylabel("fraction of rounds")
    ax.set_title("valid units only; solid: normal rounds, dashed: burst rounds", fontsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return _save(fig, path)


def burst_rounds(summary: dict, arms, path):
    """Burst-round p50 (bar) and max (tick) per arm, the physical bound, DBLP's speedups."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    col = _colors(arms)
    a = summary["arms"]
    xs = np.arange(len(arms))
    p50 = [a[x]["burst_round_ms_p50"] or 0 for x in arms]
    mx = [a[x]["burst_round_ms_max"] for x in arms]
    ax.bar(xs, p50, color=[col[x] for x in arms])
    for i, arm in enumerate(arms):
        if mx[i]:
            ax.plot([i - 0.3, i + 0.3], [mx[i]] * 2, color="k", lw=1)
        bound = a[arm]["burst_round_phys_bound_ms_p50"]
        if bound:
            ax.plot([i - 0.4, i + 0.4], [bound] * 2, color="crimson", ls="--", lw=1.2)
    ax.set_xticks(xs, arms)
    ax.set_ylabel("burst-round latency (ms)")
    notes = []
    for _, s in sorted(summary["speedups"].items()):
        if a[s["arm"]]["transport"] == "dblp" and s["burst_round"]:
            notes.append(f"{s['arm']} vs {s['baseline']}: {s['burst_round']:.2f}x")
    ax.set_title("bar: p50, black: max, red dashed: physical bound\n" + "; ".join(notes),
                 fontsize=8)
    return _save(fig, path)


def _per_seed(df: pd.DataFrame, column: str) -> pd.Series:
    """``column`` per (seed, round), the mean over ranks, in round order."""
    return df.groupby(["seed", "round"], sort=True)[column].mean().dropna()


#: The panels of the learning curves: (table, column, label).
CURVES = (("evals", "test_accuracy", "test accuracy"), ("evals", "test_loss", "test loss"),
          ("rounds", "loss", "training loss (workers' mean)"))


def learning_curves(evals: pd.DataFrame, rounds: pd.DataFrame, arms, path):
    """Test accuracy, test loss and training loss against the round: each seed thin, the mean
    over seeds thick, valid units only.

    Against rounds, not time: the arms train the same rounds in different times
    (the training-time figures say how long), and each unit's clock restarts,
    so a line over time would run back at every unit. Each seed's line is in
    round order; the mean is over the seeds that reached that round.
    """
    fig, axes = plt.subplots(1, len(CURVES), figsize=(13, 3.6), squeeze=False)
    col = _colors(arms)
    tables = {"evals": _valid(evals), "rounds": _valid(rounds)}
    thinned = 1
    for ax, (table, column, label) in zip(axes[0], CURVES, strict=True):
        t = tables[table]
        for arm in arms:
            d = t[t["arm"] == arm] if len(t) else t
            if not len(d) or column not in d or not d[column].notna().any():
                continue
            per = _per_seed(d, column)
            for seed in per.index.get_level_values(0).unique():
                s = per.loc[seed]
                x, y, k = _thin(s.index, s.to_numpy(dtype=float))
                thinned = max(thinned, k)
                ax.plot(x, y, lw=0.5, alpha=0.5, color=col[arm])
            mean = per.groupby(level=1).mean()
            x, y, _ = _thin(mean.index, mean.to_numpy(dtype=float))
            ax.plot(x, y, lw=1.6, label=arm, color=col[arm])
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if axes[0, 0].get_legend_handles_labels()[0]:
        axes[0, 0].legend(fontsize=7)
    fig.suptitle("per seed thin, the mean over seeds thick (valid units)"
                 + _every(thinned, "mean"), fontsize=8)
    return _save(fig, path)


def bytes_per_round(rounds: pd.DataFrame, packets: pd.DataFrame, arms, path):
    """Wire bytes per round from the captures when present, else the transport's counters:
    one line per valid unit, in round order."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    col = _colors(arms)
    units = _valid_units(rounds)
    rounds, packets = _valid(rounds), _of_units(packets, units)
    sources = set()
    for arm in arms:
        p = packets[packets["arm"] == arm] if len(packets) else packets
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        if len(p):
            per = p.groupby(["seed", "round"], sort=True)["sent_bytes"].sum(min_count=1)
            label = f"{arm} (capture)"
            sources.add("captures: bytes the captured hosts sent")
        elif "stats_bytes_sent" in r and r["stats_bytes_sent"].notna().any():
            per = r.groupby(["seed", "round"], sort=True)["stats_bytes_sent"].sum(min_count=1)
            label = f"{arm} (transport)"
            sources.add("transport: stats.bytes_sent summed over workers")
        else:
            continue
        for i, seed in enumerate(per.index.get_level_values(0).unique()):
            s = per.loc[seed].dropna()
            x, y, _ = _thin(s.index, s.to_numpy(dtype=float))
            ax.plot(x, y / 1e3, "-", lw=0.8, label=None if i else label, color=col[arm])
    source = "; ".join(sorted(sources)) or "no byte counts in this run"
    ax.set_xlabel("round")
    ax.set_ylabel("kB per round")
    ax.set_title(source + " (one line per seed)", fontsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


#: The fraction of a round's chunks missing, as the transport's counters give it (rounds.csv):
#: (column, line style, what it is). Each is the worst over workers (the counters' maximum).
MISSING = (("stats_missing_at_stop", "-",
            "pushed chunks the aggregator lacked at STOP, worst worker"),
           ("stats_pull_missing", ":", "aggregate zero-filled on a replica, worst replica"))


def _bounded(rounds: pd.DataFrame, arms) -> list:
    """The arms whose rounds carry a loss bound and the transport's counters of what was
    missing (the DBLP transports, static and phase-aware; not gloo)."""
    cols = [c for c, _, _ in MISSING if c in rounds]
    if not len(rounds) or "bound" not in rounds or not cols:
        return []
    return [a for a in arms if (rounds.loc[rounds["arm"] == a, ["bound", *cols]].notna().sum()
                                > 0).all()]


def bound_missing(rounds: pd.DataFrame, arms, path):
    """Each bounded arm's loss bound P per round against the fraction actually missing.

    The bound is what the transport may leave out of a round; the counters say
    what it did leave out: the share of each worker's pushed chunks the
    aggregator still lacked when it stopped the push, and the share of the
    aggregate a replica zero-filled on the pull. A relaxed round that used its
    allowance sits near its bound; one far below it paid for a looser bound it
    did not need. One line per valid unit (seed), burst rounds circled.
    """
    rounds = _valid(rounds)
    arms = _bounded(rounds, arms)
    fig, axes = _per_arm_axes(arms, height=2.0, sharey=False)  # 0.8 % beside 40.8 %
    if not arms:
        axes[0].set_title("no arm with a loss bound in this run", fontsize=9)
        axes[0].set_axis_off()
        return _save(fig, path)
    col = _colors(arms)
    cols = [(c, m, w) for c, m, w in MISSING if c in rounds and rounds[c].notna().any()]
    thinned = 1
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm]
        for i, (_, u) in enumerate(r.groupby("seed", sort=True)):
            u = u.sort_values("round")
            x, y, k = _thin(u["round"], 100 * u["bound"].astype(float), "peak")
            thinned = max(thinned, k)
            ax.step(x, y, where="post", color="k", lw=0.7, alpha=0.6,
                    label=None if i else "bound P")
            for c, style, what in cols:
                x, y, _ = _thin(u["round"], 100 * u[c].astype(float), "peak")
                ax.plot(x, y, style, lw=0.7, color=col[arm], alpha=0.6,
                        label=None if i else what)
            hit = u[u["in_burst"].astype(bool)]
            if len(hit) and cols:
                ax.plot(hit["round"], 100 * hit[cols[0][0]].astype(float), "o", ms=6,
                        mfc="none", color="crimson", label=None if i else "burst rounds")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("% of chunks")
        ax.grid(alpha=0.3)
        ax.set_title(f"{arm}: loss bound per round against the chunks actually missing, "
                     "one line per seed", fontsize=9)
    axes[0].legend(fontsize=6, loc="best")
    axes[-1].set_xlabel("round" + _every(thinned, "peak").replace("slowest", "largest"))
    return _save(fig, path)


def compute_exchange(rounds: pd.DataFrame, arms, path):
    """Per round, the longest worker's compute against its exchange, per arm.

    The mean over valid seeds, on a log scale so a model whose rounds are
    all exchange shows its compute too. The
    title gives the exchange's share of the rounds' time: a training-time cut
    can only come from that share.
    """
    rounds = _valid(rounds)
    fig, axes = _per_arm_axes(arms, height=1.9)
    col = _colors(arms)
    parts = (("compute_ms_max", "compute (forward, backward, step)", "0.35"),
             ("comm_ms_max", "exchange", None))
    thinned = 1
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        if not len(r) or any(c not in r for c, _, _ in parts):
            ax.set_title(f"{arm}: no compute and exchange times of a valid unit", fontsize=9)
            ax.set_axis_off()
            continue
        for c, what, colour in parts:
            mean = r.groupby("round", sort=True)[c].mean()
            x, y, k = _thin(mean.index, mean.to_numpy(dtype=float))
            thinned = max(thinned, k)
            ax.plot(x, y, lw=1.0, color=colour or col[arm], label=what)
        total = float(r["duration_ms"].sum()) if "duration_ms" in r else 0.0
        share = f", the exchange {r['comm_ms_max'].sum() / total:.0%} of the rounds' time" \
            if total > 0 else ""
        _log_y(ax, subs=(1.0,))   # compute and exchange lie decades apart
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        if ax is axes[0]:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(f"{arm}: the longest worker's compute and exchange per round{share}\n"
                     f"(the mean over {r['seed'].nunique()} seeds)", fontsize=8)
    axes[-1].set_xlabel("round" + _every(thinned, "mean"))
    return _save(fig, path)


def all_plots(out_dir, rounds, bursts, packets, evals, summary, arms, link,
              queue) -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        latency_over_time(rounds, bursts, arms, out / "latency_over_time.png"),
        latency_cdf(rounds, arms, out / "latency_cdf.png"),
        burst_rounds(summary, arms, out / "burst_rounds.png"),
        learning_curves(evals, rounds, arms, out / "curves.png"),
        bytes_per_round(rounds, packets, arms, out / "bytes_per_round.png"),
        bound_missing(rounds, arms, out / "bound_missing.png"),
        compute_exchange(rounds, arms, out / "compute_exchange.png"),
        bottleneck_over_time(link, rounds, bursts, arms, out / "bottleneck_over_time.png"),
        queue_over_time(queue, rounds, bursts, arms, out / "queue_over_time.png"),
    ]


def phase_timeline(rounds: pd.DataFrame, arms, path):
    """Each phase-aware arm's phase per round, with its burst rounds shaded.

    Shows whether the detector calls critical where it matters, and whether it
    flaps (each step is a switch that summary.json counts as phase_switches).
    ``arms``: the arms that have a phase (the caller picks the dblp ones).
    """
    rounds = _valid(rounds)
    fig, axes = _per_arm_axes(arms, height=1.3)
    col = _colors(arms)
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[(rounds["arm"] == arm) & rounds["phase"].notna()].sort_values("round")
        if not len(r):
            ax.set_title(f"{arm}: no phase logged", fontsize=9)
            continue
        # One step line per seed, stacked a little apart: seeds never interleave.
        seeds = sorted(r["seed"].unique()) if "seed" in r.columns else [None]
        for i, seed in enumerate(seeds):
            rs = r if seed is None else r[r["seed"] == seed]
            off = 0.08 * i
            ax.step(rs["round"].to_numpy(dtype=float),
                    (rs["phase"] == "critical").astype(float) + off, where="post", lw=1.2,
                    color=col[arm], alpha=1.0 - 0.25 * min(i, 3),
                    label=None if seed is None else f"seed {seed}")
        for rnd in sorted(set(r[r["in_burst"].astype(bool)]["round"])):
            ax.axvspan(rnd, rnd + 1, color="crimson", alpha=0.2, lw=0)
        ax.set_yticks([0, 1], ["relaxed", "critical"])
        ax.set_ylim(-0.2, 1.2 + 0.08 * (len(seeds) - 1))
        if len(seeds) > 1:
            ax.legend(fontsize=7, loc="center right")
        ax.set_title(f"{arm}: detector phase per round (shaded: burst rounds)", fontsize=9)
    axes[-1].set_xlabel("round")
    return _save(fig, path)


def forest(summary: dict, path):
    """Every compared pair's figures as point + 95 % interval, one panel per figure.

    A claim's region (what reproduces it) is shaded green behind the pairs
    the claim judges, so the verdict reads off the picture: inside, outside
    or across the edge. A pair without an interval is listed with "no
    interval" (summary.json says why).
    """
    pairs = summary.get("intervals", {})
    names = list(next(iter(pairs.values()), {"figures": {}})["figures"])
    regions = {(v["estimator"], v["pair"]): v["region"] for v in summary.get("verdicts", [])}
    keys = list(pairs)
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(3.2 * max(1, len(names)),
                                                            0.45 * len(keys) + 1.4),
                             sharey=True, squeeze=False)
    axes = axes[0]
    if not keys:
        axes[0].set_title("no compared pairs of arms in this run", fontsize=9)
        axes[0].set_axis_off()
        return _save(fig, path)
    ys = np.arange(len(keys))[::-1]
    for ax, name in zip(axes, names, strict=True):
        unit = pairs[keys[0]]["figures"][name]["unit"]
        ends = []
        for y, key in zip(ys, keys, strict=True):
            iv = pairs[key]["figures"][name]["interval"]
            if iv is None:
                ax.text(0.02, y, "no interval", transform=ax.get_yaxis_transform(),
                        va="center", fontsize=7, color="0.4")
                continue
            ends += [iv["lo"], iv["hi"]]
            ax.errorbar([iv["point"]], [y], xerr=[[iv["point"] - iv["lo"]], [iv["hi"] - iv["point"]]],
                        fmt="o", ms=4, color="k", capsize=3, lw=1)
        for key in keys:
            ends += [x for x in regions.get((name, key), ()) if x is not None]
        if ends:
            lo, hi = min(ends), max(ends)
            pad = 0.1 * (hi - lo) or 0.5
            ax.set_xlim(lo - pad, hi + pad)
        left, right = ax.get_xlim()
        for y, key in zip(ys, keys, strict=True):
            region = regions.get((name, key))
            if region is not None:
                a = left if region[0] is None else region[0]
                b = right if region[1] is None else region[1]
                ax.fill_betweenx([y - 0.4, y + 0.4], a, b, color="green", alpha=0.15, lw=0)
        ax.set_xlim(left, right)
        ax.axvline(1.0 if unit == "x" else 0.0, color="0.6", lw=0.8, ls=":")
        ax.set_title(f"{name} ({unit})", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys, keys, fontsize=8)
    axes[0].set_ylim(-0.7, len(keys) - 0.3)
    fig.suptitle("point and 95 % interval per pair; green: the paper's claim reproduces there",
                 fontsize=9)
    return _save(fig, path)
