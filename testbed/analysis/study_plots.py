"""The figures of the studies: an ablation's axes and the burst regime map's heat-maps.

Apart from a run's figures (`testbed.analysis.plots`) because a study's
document is not a run's tables: an ablation (`testbed.analysis.ablation`)
and a regime map (`testbed.analysis.regime`) each draw theirs from the JSON
document they write. Drawn and saved as a run's are (`plots._save`: PNG and
SVG, byte-identical when drawn again).
"""
from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt

from testbed.analysis import plots


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
    col = plots._colors(["point", *bases])
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
    return plots._save(fig, path)


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
    return plots._save(fig, path)


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
    return plots._save(fig, path, tight=False)


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
    return plots._save(fig, path, tight=False)
