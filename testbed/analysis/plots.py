"""The report's figures, drawn from the derived tables only (so they rebuild from raw/).

Each function writes one figure twice, a PNG at print resolution
(``PRINT_DPI``) for the report and an SVG beside it for papers and slides,
and returns the PNG's path. Matplotlib runs headless (Agg), every input is
sorted, the SVG's element ids are salted with a constant and neither file
carries a date, so re-running on the same tables gives byte-identical files:
the report's rebuild check relies on it.
"""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

# No version string or date: rebuilds stay identical across upgrades and days.
_META = {"png": {"Software": "dblp-testbed"}, "svg": {"Creator": "dblp-testbed", "Date": None}}
PRINT_DPI = 300


def _colors(arms):
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {a: cycle[i % len(cycle)] for i, a in enumerate(arms)}


def _save(fig, path):
    """Write PATH (PNG, PRINT_DPI) and PATH.svg; return the PNG's path."""
    path = pathlib.Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=PRINT_DPI, metadata=_META["png"])
    with matplotlib.rc_context({"svg.hashsalt": "dblp-testbed"}):  # fixed element ids
        fig.savefig(path.with_suffix(".svg"), metadata=_META["svg"])
    plt.close(fig)
    return path


def _per_arm_axes(arms, height=1.9):
    """One row of axes per arm, sharing the y axis (the per-arm time plots)."""
    n = max(1, len(arms))
    fig, axes = plt.subplots(n, 1, figsize=(8, height * n + 0.6), sharey=True, squeeze=False)
    return fig, axes[:, 0]


def _shade_bursts(ax, bursts: pd.DataFrame, arm, t0: int):
    """The arm's actual burst windows, shaded, on an axis of seconds since t0."""
    b = bursts[bursts["arm"] == arm] if len(bursts) else bursts
    for bb in b.itertuples(index=False):
        if pd.notna(bb.actual_start_ns) and pd.notna(bb.actual_end_ns):
            ax.axvspan((bb.actual_start_ns - t0) / 1e9, (bb.actual_end_ns - t0) / 1e9,
                       color="crimson", alpha=0.2, lw=0)


def _unit_starts(r: pd.DataFrame) -> dict:
    """Seed -> the unit's first round start (ns): each unit's series starts at its own zero.

    The seeds of one arm run at different times, between other arms' units, so
    one zero per arm would leave most of the axis empty and lay the seeds end
    to end; one per unit overlays them, as the per-seed verdicts compare them."""
    return {s: int(g["t_start_ns"].min()) for s, g in r.groupby("seed", sort=True)}


def _of_seed(df: pd.DataFrame, seed) -> pd.DataFrame:
    return df[df["seed"] == seed] if len(df) and "seed" in df else df


def latency_over_time(rounds: pd.DataFrame, bursts: pd.DataFrame, arms, path):
    """Round latency against time since each unit's first round, one line per seed;
    the units' burst windows shaded."""
    fig, axes = _per_arm_axes(arms)
    col = _colors(arms)
    for ax, arm in zip(axes, arms, strict=True):
        r = rounds[rounds["arm"] == arm]
        if not len(r):
            ax.set_title(f"{arm}: no rounds", fontsize=9)
            continue
        for seed, t0 in _unit_starts(r).items():
            u = _of_seed(r, seed)
            x = (u["t_end_ns"].to_numpy(dtype=float) - t0) / 1e9
            ax.plot(x, u["latency_ms"], ".-", ms=2, lw=0.6, alpha=0.7, color=col[arm])
            hit = u[u["in_burst"]]
            ax.plot((hit["t_end_ns"].to_numpy(dtype=float) - t0) / 1e9, hit["latency_ms"], "o",
                    ms=5, mfc="none", color="crimson")
            _shade_bursts(ax, _of_seed(bursts, seed), arm, t0)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_ylabel("ms")
        ax.set_title(f"{arm}: round latency, one line per seed (shaded: burst windows, "
                     "circled: burst rounds)", fontsize=9)
    axes[-1].set_xlabel("seconds since the unit's first round")
    return _save(fig, path)


def bottleneck_over_time(link: pd.DataFrame, rounds: pd.DataFrame, bursts: pd.DataFrame, arms,
                         path):
    """The bottleneck's transmit rate per sampling interval, burst windows shaded.

    Drawn from port counters: the rate towards the server against the
    shaped rate, and the switch's own drops (what `queue_over_time`, the
    occupancy, does not show); every panel says how coarse the sampling was.
    """
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
        for i, (seed, t0) in enumerate(_unit_starts(r).items()):
            u = _of_seed(s, seed)
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
    plateau at the line with crosses on it.
    """
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
        for i, (seed, t0) in enumerate(_unit_starts(r).items()):
            u = _of_seed(q, seed)
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


def accuracy(evals: pd.DataFrame, arms, path):
    """Test accuracy and test loss against rounds: each seed thin, the mean over seeds thick.

    Against rounds, not time: the arms train the same rounds in different times
    (the training-time figures say how long), and each unit's clock restarts."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), squeeze=False)
    col = _colors(arms)
    e_all = evals
    if len(evals) and "valid" in evals:
        e_all = evals[evals["valid"].astype(bool)]
    for ax, column, label in ((axes[0, 0], "test_accuracy", "test accuracy"),
                              (axes[0, 1], "test_loss", "test loss")):
        for arm in arms:
            e = e_all[e_all["arm"] == arm] if len(e_all) else e_all
            if not len(e) or column not in e or not e[column].notna().any():
                continue
            per = e.groupby(["seed", "round"], sort=True)[column].mean()
            for seed in per.index.get_level_values(0).unique():
                s = per.loc[seed]
                ax.plot(s.index, s.to_numpy(dtype=float), lw=0.6, alpha=0.5, color=col[arm])
            mean = per.groupby(level=1).mean()
            ax.plot(mean.index, mean.to_numpy(dtype=float), "o-", ms=3, lw=1.6, label=arm,
                    color=col[arm])
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("per seed thin, mean over seeds thick (valid units)", fontsize=8)
    return _save(fig, path)


def bytes_per_round(rounds: pd.DataFrame, packets: pd.DataFrame, arms, path):
    """Wire bytes per round from the captures when present, else the transport's counters."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    col = _colors(arms)
    sources = set()
    for arm in arms:
        p = packets[packets["arm"] == arm] if len(packets) else packets
        r = rounds[rounds["arm"] == arm] if len(rounds) else rounds
        if len(p):
            s = p.groupby("round")["sent_bytes"].sum(min_count=1)
            x, y = s.index.to_numpy(dtype=float), s.to_numpy(dtype=float)
            label = f"{arm} (capture)"
            sources.add("captures: bytes the captured hosts sent")
        elif "stats_bytes_sent" in r and r["stats_bytes_sent"].notna().any():
            x, y = r["round"].to_numpy(dtype=float), r["stats_bytes_sent"].to_numpy(dtype=float)
            label = f"{arm} (transport)"
            sources.add("transport: stats.bytes_sent summed over workers")
        else:
            continue
        ax.plot(x, y / 1e3, ".-", ms=2, lw=0.8, label=label, color=col[arm])
    source = "; ".join(sorted(sources)) or "no byte counts in this run"
    ax.set_xlabel("round")
    ax.set_ylabel("kB per round")
    ax.set_title(source, fontsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


def all_plots(out_dir, rounds, bursts, packets, evals, summary, arms, link,
              queue) -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        latency_over_time(rounds, bursts, arms, out / "latency_over_time.png"),
        latency_cdf(rounds, arms, out / "latency_cdf.png"),
        burst_rounds(summary, arms, out / "burst_rounds.png"),
        accuracy(evals, arms, out / "accuracy.png"),
        bytes_per_round(rounds, packets, arms, out / "bytes_per_round.png"),
        bottleneck_over_time(link, rounds, bursts, arms, out / "bottleneck_over_time.png"),
        queue_over_time(queue, rounds, bursts, arms, out / "queue_over_time.png"),
    ]


def phase_timeline(rounds: pd.DataFrame, arms, path):
    """Each phase-aware arm's phase per round, with its burst rounds shaded.

    Shows whether the detector calls critical where it matters, and whether it
    flaps (each step is a switch that summary.json counts as phase_switches).
    ``arms``: the arms that have a phase (the caller picks the dblp ones).
    """
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


def ablation_axis(doc: dict, axis: dict, path):
    """One axis of an ablation: final accuracy, and each point against each baseline.

    Left, the final metric of every seed (dots) and its mean (line), with
    the baselines' means as dashed lines; then the training-time cut and the
    time-to-target speedup against each baseline, point and 95 % interval.
    The preset's own value is marked: it is the point every axis shares.
    """
    pts = [p for p in axis["points"] if not p.get("missing")]
    xs = np.arange(len(pts), dtype=float)
    labels = [f"{p['value']}*" if p["base"] else str(p["value"]) for p in pts]
    bases = list(doc["baselines"])
    col = _colors(["point", *bases])
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    ax = axes[0]
    for x, p in zip(xs, pts, strict=True):
        vals = [100 * v for v in p["final_accuracy"].values()]
        ax.scatter([x] * len(vals), vals, s=12, color=col["point"], alpha=0.6)
    ax.plot(xs, [100 * (p["final_accuracy_mean"] or np.nan) for p in pts], color=col["point"],
            label=doc["arm"])
    for b in bases:
        m = doc["baseline_points"][b]["final_accuracy_mean"]
        if m is not None:
            ax.axhline(100 * m, color=col[b], ls="--", lw=1, label=b)
    ax.set_ylabel("final accuracy (%)")
    ax.legend(fontsize=7)
    for ax, name, ylabel, ref in ((axes[1], "train_time_cut", "training-time cut vs baseline (%)", 0.0),
                                  (axes[2], "time_to_target", "time-to-target speedup (x)", 1.0)):
        for j, b in enumerate(bases):
            off = (j - (len(bases) - 1) / 2) * 0.15
            ivs = [p["against"][b][name]["interval"] for p in pts]
            ok = [(x + off, i) for x, i in zip(xs, ivs, strict=True) if i]
            if ok:
                ax.errorbar([x for x, _ in ok], [i["point"] for _, i in ok],
                            yerr=[[i["point"] - i["lo"] for _, i in ok],
                                  [i["hi"] - i["point"] for _, i in ok]],
                            fmt="o", ms=4, capsize=3, color=col[b], label=f"vs {b}")
        ax.axhline(ref, color="grey", lw=0.8)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(xs, labels)
        ax.set_xlabel(f"{axis['label']} (* the preset's)")
    fig.suptitle(f"ablation {doc['ablation']}: {doc['arm']} over {axis['label']} "
                 f"({doc['preset']} preset; 95 % intervals)", fontsize=10)
    return _save(fig, path)


def ablation_phases(doc: dict, axis: dict, path):
    """Where each point's detector called critical, under where drops actually hurt.

    Top (when the ablation ran its loss-tolerance sweep): each drop window's
    accuracy cost right after it and at the end, in points. Below, one row
    per point of the axis: the share of seeds whose detector was critical in
    each round. A detector that matters calls critical where the top panel
    shows drops hurt, and relaxes elsewhere.
    """
    pts = [p for p in axis["points"] if not p.get("missing")]
    h = doc.get("harm")
    rows = len(pts) + (1 if h else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(9, 0.6 + 1.1 * rows), sharex=True, squeeze=False)
    axes = axes[:, 0]
    if h:
        ax = axes[0]
        for w in h["windows"]:
            mid = (w["start"] + w["stop"]) / 2
            ax.bar(mid - 1.5, 100 * w["gap_after"], width=3, color="crimson", alpha=0.7,
                   label="right after" if w is h["windows"][0] else None)
            ax.bar(mid + 1.5, 100 * w["final_delta"], width=3, color="grey", alpha=0.8,
                   label="at the end" if w is h["windows"][0] else None)
            ax.axvspan(w["start"], w["stop"], color="crimson", alpha=0.06, lw=0)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_ylabel("points", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"cost of dropping {h['drop_fraction']:.0%} in one window (no network)",
                     fontsize=9)
    for ax, p in zip(axes[1:] if h else axes, pts, strict=True):
        crit = p.get("critical_by_round") or {}
        xs = sorted(int(k) for k in crit)
        ax.step(xs, [crit[k] if k in crit else crit[str(k)] for k in xs], where="post", lw=1.2)
        ax.set_ylim(-0.1, 1.1)
        ax.set_yticks([0, 1], ["relaxed", "critical"], fontsize=7)
        name = f"{axis['label']} = {p['value']}" + (" (the preset's)" if p["base"] else "")
        ax.set_title(f"{name}: share of seeds critical", fontsize=8)
        if h:
            for w in h["windows"]:
                ax.axvspan(w["start"], w["stop"], color="crimson", alpha=0.06, lw=0)
    axes[-1].set_xlabel("round")
    return _save(fig, path)


def _regime_grid(doc: dict):
    """The heat-maps' axes: durations (ms, then round-locked) x losses, drop on the downlink only."""
    cells = [c for c in doc["cells"] if c["target"] == "server-downlink" and c["kind"] == "loss"]
    durs = sorted({c["duration"] for c in cells}, key=lambda d: (isinstance(d, str), d if not
                                                                   isinstance(d, str) else 0))
    losses = sorted({c["p"] for c in cells})
    return cells, durs, losses


def _heat(ax, grid: np.ndarray, durs, losses, title: str, fmt: str, vmin: float, vmax: float,
          cmap: str, notes: np.ndarray | None = None):
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                   aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            note = notes[i, j] if notes is not None else ""
            if np.isfinite(grid[i, j]):
                r, g, b, _ = im.cmap(im.norm(grid[i, j]))
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                ax.text(j, i, fmt.format(grid[i, j]) + note, ha="center", va="center", fontsize=7,
                        color=ink)
            elif note:
                ax.text(j, i, note, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(durs)), [f"{d:g} ms" if not isinstance(d, str) else d for d in durs],
                  fontsize=7)
    ax.set_yticks(range(len(losses)), [f"{p:.0%}" for p in losses], fontsize=7)
    ax.set_title(title, fontsize=8)
    return im


def regime_speedup(doc: dict, path):
    """Burst-round speedup of each bounded pair over burst duration x loss, per control path.

    The colour scale runs from 1x to the pass-bound ratio, with the
    bandwidth-bound ratio in each title: a cell's colour says where it sits
    in the physics envelope. "cap" marks a cell whose figure a round-locked
    burst's cap decided (not reported).
    """
    cells, durs, losses = _regime_grid(doc)
    panels = [(ctl, arm, base) for ctl, arm, base in (
        ("udp", "static-high", "static"), ("udp", "static-high-sharded", "static-sharded"),
        ("udp", "static-high-sharded", "gloo"), ("tcp", "static-high-tcp", "static-tcp"))
        if any(c["control"] == ctl and any(p["arm"] == arm and p["baseline"] == base
                                           for p in c["pairs"]) for c in cells)]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(3.6 * max(1, len(panels)), 3.1),
                             squeeze=False)
    hi = 1.0
    for c in cells:
        for p in c["pairs"]:
            for v in (p["pass_ratio"], p["speedup"]):
                if v is not None and np.isfinite(v):
                    hi = max(hi, v)
    for ax, (ctl, arm, base) in zip(axes[0], panels, strict=False):
        grid = np.full((len(losses), len(durs)), np.nan)
        notes = np.full(grid.shape, "", dtype=object)
        bw = None
        for c in cells:
            if c["control"] != ctl:
                continue
            p = next((p for p in c["pairs"] if p["arm"] == arm and p["baseline"] == base), None)
            if p is None:
                continue
            i, j = losses.index(c["p"]), durs.index(c["duration"])
            if p["capped"]:
                notes[i, j] = "cap"
            elif p["speedup"] is not None:
                grid[i, j] = p["speedup"]
            bw = bw or p["bandwidth_ratio"]
        env = f", bandwidth ratio {bw:.2f}x" if bw else ""
        im = _heat(ax, grid, durs, losses, f"{arm} vs {base}\n({ctl} control{env})", "{:.2f}x",
                   0.5, hi, "viridis", notes)
        ax.set_xlabel("burst", fontsize=7)
        ax.set_ylabel("loss", fontsize=7)
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="burst-round speedup (x)")
    fig.suptitle(f"regime map {doc['map']}: burst-round speedup (median ratio)", fontsize=9,
                 y=1.06)
    return _save_loose(fig, path)


def regime_over_bound(doc: dict, path):
    """Each arm's burst-round latency over its physical bound, burst duration x loss.

    Grey above ``bound_factor``; "†" marks an arm whose run's fidelity
    check flagged the emulator.
    """
    cells, durs, losses = _regime_grid(doc)
    arms = [a for ctl in ("udp", "tcp") for a in doc["arms"].get(ctl, [])
            if any(c["control"] == ctl for c in cells)]
    n = max(1, len(arms))
    cols = min(n, 5)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.7 * cols, 2.8 * rows), squeeze=False)
    im = None
    for k, arm in enumerate(arms):
        ax = axes[k // cols][k % cols]
        grid = np.full((len(losses), len(durs)), np.nan)
        notes = np.full(grid.shape, "", dtype=object)
        for c in cells:
            a = next((a for a in c["arms"] if a["arm"] == arm), None)
            if a is None or a["over_bound"] is None:
                continue
            i, j = losses.index(c["p"]), durs.index(c["duration"])
            grid[i, j] = a["over_bound"]
            notes[i, j] = "" if a["emulator_kept_up"] else "†"
        im = _heat(ax, grid, durs, losses, arm, "{:.2f}", 1.0, 2.0, "magma_r", notes)
    for k in range(len(arms), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if im is not None:
        fig.colorbar(im, ax=[a for row in axes for a in row], shrink=0.8,
                     label="burst-round latency / physical bound")
    fig.suptitle(f"regime map {doc['map']}: each arm over its bound "
                 f"(target {doc['bound_factor']}x; † emulator flagged)", fontsize=9)
    return _save_loose(fig, path)


def _save_loose(fig, path):
    """`_save` for figures with a shared colour bar (tight_layout cannot place those)."""
    path = pathlib.Path(path)
    fig.savefig(path, dpi=PRINT_DPI, metadata=_META["png"], bbox_inches="tight")
    with matplotlib.rc_context({"svg.hashsalt": "dblp-testbed"}):
        fig.savefig(path.with_suffix(".svg"), metadata=_META["svg"], bbox_inches="tight")
    plt.close(fig)
    return path
