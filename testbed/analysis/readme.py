"""The README's measured tables, rendered from the committed references (runs and commands).

The README marks each generated table with a pair of comments::

    <!-- reference:default arms -->
    | arm | ... |
    <!-- /reference -->

naming the reference folder (``results/reference/default``) and the table
(a key of `TABLES`; each renderer reads its reference's folder: a run's
summary and tables, or the JSON files of a command reference). A block
naming ``all`` renders from every reference at once (`EVERY_TABLES`: the
wall times). A block whose reference has no folder yet fails with one line
naming the `reproduce` command. `update` rewrites every marked block from
the files; `stale` lists the blocks whose text differs from what the files
give, which is what the README test asserts to be empty. No figure in a
marked block is typed by hand.
"""
from __future__ import annotations

import json
import math
import pathlib
import re
import statistics
from collections.abc import Callable

from testbed.analysis import design
from testbed.cpustat import STEAL_FLAG

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


#: The CPU budget's rows, in the order a reader follows a packet and a round:
#: (fidelity cpu_budget key, what it is).
BUDGET_ROWS = (("ovs-vswitchd", "Open vSwitch (every switch's forwarding, one process)"),
               ("workers: training", "workers' training (forward, backward, step; all ranks)"),
               ("workers: exchange", "workers' gradient exchange (all ranks)"),
               ("server: exchange", "aggregation server's exchange"),
               ("controller", "os-ken controller"),
               ("harness", "the harness (supervision, samplers)"),
               ("ovsdb-server", "Open vSwitch's database"))


def cpu_budget_table(summary: dict) -> str:
    """Where each arm's CPU went over its units' rounds: shares of one core, mean over seeds.

    From the units' fidelity records (`testbed.run.budget`); "other" is the
    machine's busy time no process row accounts for (kernel threads,
    short-lived processes, other work on the machine). The kernel's network
    work (softirq: the veths, the shapers, the burst rules) is shown apart:
    the kernel charges it to whichever process it interrupted, so most of it
    is already inside the rows above.
    """
    arms = summary.get("arms_order") or sorted(summary["arms"])
    means: dict[str, dict[str, float]] = {}
    busy: dict[str, list[float]] = {}
    for arm in arms:
        units = [rec.get("fidelity") or {}
                 for rec in (summary.get("fidelity", {}).get(arm) or {}).values()]
        busy[arm] = [u["cpu_busy_frac"] for u in units if u.get("cpu_busy_frac") is not None]
        recs = [u.get("cpu_budget") for u in units]
        recs = [r for r in recs if r]
        keys = {k for r in recs for k in r}
        means[arm] = {k: sum(r.get(k, 0.0) for r in recs) / len(recs) for k in keys} if recs else {}
    rows = ["| component, share of one core | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for key, what in BUDGET_ROWS:
        if any(key in means[a] for a in arms):
            rows.append(f"| {what} | " + " | ".join(
                _num(None if key not in means[a] else 100 * means[a][key], "{:.0f} %")
                for a in arms) + " |")
    def other(m: dict) -> float | None:
        if "machine busy" not in m:
            return None
        return 100 * (m["machine busy"] - sum(m.get(k, 0.0) for k, _ in BUDGET_ROWS))
    rows.append("| other | " + " | ".join(_num(other(means[a]), "{:.0f} %") for a in arms) + " |")
    rows.append("| (kernel network work in softirq, mostly inside the rows above) | " + " | ".join(
        _num(100 * means[a]["kernel softirq"] if "kernel softirq" in means[a] else None, "{:.0f} %")
        for a in arms) + " |")
    rows.append("| **CPU busy, share of the machine's cores (highest unit)** | " + " | ".join(
        _num(100 * max(busy[a]) if busy[a] else None, "{:.0f} %") for a in arms) + " |")
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
    """One row per claim of the paper and pair of arms: the measured interval and the verdict.

    A verdict "not judged" says its cause (every seed of the pair had an
    invalid unit); the units themselves follow the table, one line each.
    """
    from testbed.analysis.answer import invalid_lines, paper_cell, verdict_label
    rows = ["| claim | arm vs baseline | paper | measured, point [95 % interval] | seeds | verdict |",
            "|---|---|---|---|---|---|"]
    for v in summary.get("verdicts", []):
        iv = v.get("interval") or {}
        pair = f"{v['arm']} vs {v['baseline']}" if v.get("pair") else "(did not run)"
        seeds = iv.get("n_seeds", (v.get("too_few_seeds") or {}).get("seeds", "–"))
        rows.append(f"| {v['claim']} | {pair} | {paper_cell(v)} | {_figure(v)} "
                    f"| {seeds} | {verdict_label(v)} |")
    bad = invalid_lines(summary)
    if bad:
        rows += ["", "Invalid units, left out of every figure, interval and verdict:", ""]
        rows += [f"- {line.strip()}" for line in bad]
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


def _seed_span_s(rounds, arm: str) -> dict:
    """seed -> seconds from the arm's first round start to its last round end (rounds.csv)."""
    r = rounds[rounds["arm"] == arm]
    return {int(s): (g["t_end_ns"].max() - g["t_start_ns"].min()) / 1e9
            for s, g in r.groupby("seed", sort=True)}


#: The accuracy difference the seeds table shows per seed (arm, baseline), when both ran.
SEED_DIFFERENCE = ("dblp", "reliable")


def _seed_pair_sentence(summary: dict, rounds, evals, arm: str, base: str, span: dict) -> str:
    """``arm`` against ``base`` seed by seed: training time, relaxed rounds, final test loss."""
    from testbed.analysis.intervals import final_metric

    seeds = sorted(set(span[arm]) & set(span[base]))
    cut = ", ".join(f"{100 * (1 - span[arm][s] / span[base][s]):.0f} %" for s in seeds)
    text = (f"Seeds {', '.join(map(str, seeds))} in turn: {arm}'s training time was {cut} "
            f"shorter than {base}'s")
    r = rounds[rounds["arm"] == arm]
    if "phase" in r.columns and r["phase"].notna().any():
        relaxed = ", ".join(f"{100 * (g['phase'] == 'relaxed').mean():.0f} %"
                            for _, g in r.groupby("seed", sort=True))
        text += f"; {arm} relaxed its bound in {relaxed} of its rounds"
    p50 = [summary.get("arms", {}).get(a, {}).get("round_ms_p50") for a in (arm, base)]
    if None not in p50:
        text += f" (round p50 {p50[0]:.0f} ms against {p50[1]:.0f} ms)"
    if "test_loss" in evals.columns:
        la, lb = final_metric(evals, arm, "test_loss"), final_metric(evals, base, "test_loss")
        text += "; its final test loss " + ", ".join(
            f"{la[s]:.3f} against {lb[s]:.3f}" for s in seeds if s in la and s in lb)
    return text + "."


#: How many of an arm's last evaluations the seeds table's stability sentence spans.
LAST_EVALS = 4


def _last_evals_sentence(evals, order: list[str]) -> str:
    """How far each arm's accuracy moved over its last evaluations (the worst seed)."""
    e = evals.groupby(["arm", "seed", "round"])["test_accuracy"].mean().reset_index()
    moved = {}
    for a in order:
        tails = [g.sort_values("round")["test_accuracy"].tail(LAST_EVALS)
                 for _, g in e[e["arm"] == a].groupby("seed")]
        moved[a] = max((100 * (t.max() - t.min()) for t in tails), default=None)
    return (f"Over its last {LAST_EVALS} evaluations each arm's accuracy moved by at most (worst "
            "seed): " + ", ".join(f"{a} {_num(m, '{:.2f}')}" for a, m in moved.items())
            + " points.")


def seeds_table(ref_dir: pathlib.Path) -> str:
    """Final test accuracy (training time) per seed and arm, and the summary's accuracy intervals.

    The training time of a seed is its rounds' span in rounds.csv (first
    round's start to last round's end); the accuracy is the last
    evaluation's, the mean over evaluating ranks (`intervals.final_metric`,
    which the accuracy intervals use too).
    """
    import pandas as pd

    from testbed.analysis.intervals import final_metric

    summary = _load(ref_dir)
    rounds = pd.read_csv(ref_dir / "rounds.csv")
    evals = pd.read_csv(ref_dir / "evals.csv")
    order = summary.get("arms_order") or sorted(rounds["arm"].unique())
    acc = {a: final_metric(evals, a) for a in order}
    span = {a: _seed_span_s(rounds, a) for a in order}
    arm, base = SEED_DIFFERENCE
    diff = arm in order and base in order
    head = order + ([f"{arm} - {base}"] if diff else [])
    rows = ["| seed | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for seed in sorted({s for a in order for s in span[a]}):
        cells = [f"{_num(None if seed not in acc[a] else 100 * acc[a][seed], '{:.2f} %')} "
                 f"({_num(span[a].get(seed), '{:.1f} s')})" for a in order]
        if diff:
            d = (100 * (acc[arm][seed] - acc[base][seed])
                 if seed in acc[arm] and seed in acc[base] else None)
            cells.append(_num(d, "{:+.2f} points"))
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    out = "\n".join(rows) + "\n"
    if diff:
        out += "\n" + _seed_pair_sentence(summary, rounds, evals, arm, base, span) + "\n"
    out += "\n" + _last_evals_sentence(evals, order) + "\n"
    for pair in summary.get("intervals", {}).values():
        fig = pair.get("figures", {}).get("accuracy_delta")
        if fig and fig.get("interval"):
            i = fig["interval"]
            out += (f"\nFinal accuracy, {pair['arm']} minus {pair['baseline']}: {_figure(fig)} "
                    f"(95 % interval, {i.get('method', 'bootstrap')}, over "
                    f"{i.get('n_seeds', '–')} seeds, summary.json).\n")
        elif fig and fig.get("reason"):
            out += (f"\nFinal accuracy, {pair['arm']} minus {pair['baseline']}: no interval, "
                    f"{fig['reason']} (summary.json).\n")
    return out


# -- tables of command references (testbed.references.CommandReference) -----------------

def _json(path: pathlib.Path) -> dict:
    if not path.is_file():
        from testbed.errors import InputError
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {path.parent.name}`")
    return json.loads(path.read_text())


def _jsons(ref_dir: pathlib.Path, pattern: str) -> list[dict]:
    docs = [_json(p) for p in sorted(ref_dir.glob(pattern))]
    if not docs:
        from testbed.errors import InputError
        raise InputError(f"{ref_dir} holds no {pattern}; run `dblp-testbed reproduce {ref_dir.name}`")
    return docs


def _pct(x: float) -> str:
    return f"{100 * x:.1f}".removesuffix(".0") + " %"


def _bound_label(policy: str, bound: float) -> str:
    return "reliable" if policy == "reliable" else f"P {_pct(bound)}"


def _column(row: dict) -> str:
    """A DBLP bench row's column: its bound and mode."""
    return f"{_bound_label(row['policy'], row['bound'])} {'PS' if row['mode'] == 'ps' else row['mode']}"


def _trip(row: dict | None) -> str:
    """A bench row's median round trip (its ratio to the bound), or its missed deadline."""
    if row is None:
        return "–"
    if row.get("round_trip_s") is None:
        return f"> {row['round_timeout_s']:g} s"
    return f"{row['round_trip_s']:.3f} ({_num(row.get('ratio'), '{:.2f}')})"


def round_trips_table(ref_dir: pathlib.Path) -> str:
    """`bench transport`: one row per loss, one column per DBLP bound and mode, gloo beside them.

    DBLP cells are the authenticated rows when there are any (a deployment
    has a secret); the last column is the range, over the row's DBLP
    columns, of the round trip with a secret over the same one without.
    After the table, what the rows say as a whole: missed deadlines, the
    worst ratio, passes against the ideal, and the loose bound's speedup.
    """
    doc = _json(ref_dir / "bench-transport.json")
    rows = doc["rows"]
    dblp = [r for r in rows if r["impl"] == "dblp"]
    auth = any(r.get("auth") for r in dblp)
    shown = [r for r in dblp if bool(r.get("auth")) == auth]
    cols = sorted({(r["mode"], r["policy"], r["bound"]) for r in shown},
                  key=lambda c: (c[0] != "ps", c[2]))
    gloo = [r for r in rows if r["impl"] == "gloo"]
    twins = auth and any(not r.get("auth") for r in dblp)
    head = [_column({"mode": m, "policy": p, "bound": b}) for m, p, b in cols]
    head += ["gloo all-reduce"] if gloo else []
    head += ["secret on / off (range)"] if twins else []
    out = ["| loss p | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]

    def find(group, loss, mode, policy, bound, with_auth=auth):
        return next((r for r in group if r["loss"] == loss and r["mode"] == mode
                     and r["policy"] == policy and r["bound"] == bound
                     and bool(r.get("auth")) == with_auth), None)

    for loss in doc["losses"]:
        cells = [_trip(find(shown, loss, *c)) for c in cols]
        if gloo:
            cells.append(_trip(next((r for r in gloo if r["loss"] == loss), None)))
        if twins:
            ratios = [on["round_trip_s"] / off["round_trip_s"] for c in cols
                      for on, off in [(find(dblp, loss, *c), find(dblp, loss, *c, with_auth=False))]
                      if on and off and on["round_trip_s"] and off["round_trip_s"]]
            cells.append(f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "–")
        out.append(f"| {_pct(loss)} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n\n"
    text += (f"Medians of {doc['reps']} round trips of {doc['bytes'] / (1 << 20):g} MiB at "
             f"{doc['rate_bps'] / 1e6:g} Mbit/s in seconds (time / `bound_s`; `floor_s` = "
             f"{doc['floor_s']:.3f} s). ")
    late = [r for r in rows if r.get("round_trip_s") is None]
    names = sorted({("gloo" if r["impl"] == "gloo" else _column(r)) + f" at {_pct(r['loss'])}"
                    for r in late})
    deadline = rows[0]["round_timeout_s"] if rows else 0
    text += (f"Missed the {deadline:g} s deadline: {', '.join(names)}. " if names
             else f"No row missed its {deadline:g} s deadline. ")
    timed = [r for r in shown if r.get("ratio") is not None]
    if timed:
        w = max(timed, key=lambda r: r["ratio"])
        text += (f"The worst DBLP round trip is {w['ratio']:.2f}x its bound "
                 f"({_column(w)}, {_pct(w['loss'])} loss).")
    top = max(doc["losses"], default=0)
    passes = [f"{_num(r.get('passes'))} for {_bound_label(r['policy'], r['bound'])} "
              f"(ideal {r['ideal_passes']})" for r in shown
              if r["loss"] == top and r["mode"] == "ps" and r["policy"] == "static"]
    if top and passes:
        text += f" Passes at {_pct(top)} loss (PS): {', '.join(passes)}."
    speed = [a["round_trip_s"] / b["round_trip_s"] for a in shown for b in shown
             if a["policy"] == b["policy"] == "static" and a["bound"] < b["bound"]
             and (a["loss"], a["mode"]) == (b["loss"], b["mode"])
             and a["round_trip_s"] and b["round_trip_s"]]
    if speed:
        both = "" if len(speed) == len({(r["loss"], r["mode"]) for r in shown}) else \
            " where both met the deadline"
        text += (f" The looser static bound's round trips are {min(speed):.2f}-{max(speed):.2f}x "
                 f"faster than the tighter one's at every loss and mode{both}.")
    return text + "\n"


def _ratio_range(tight: dict, loose: dict) -> tuple[float | None, float | None]:
    """The tight bound's round trip over the loose one's, at their repetitions' extremes.

    ``spread_s`` is a row's fastest and slowest round trip, the slowest None
    when one missed its deadline: the range is then open above.
    """
    (t_lo, t_hi), (l_lo, l_hi) = tight.get("spread_s") or (None, None), \
        loose.get("spread_s") or (None, None)
    lo = t_lo / l_hi if t_lo and l_hi else None
    hi = t_hi / l_lo if t_hi and l_lo else None
    return lo, hi


def _loose_bound_pairs(doc: dict) -> list[dict]:
    """Each (loss, mode, control) of a transport bench: its tightest and loosest static rows.

    The authenticated rows when there are any (a deployment has a secret).
    ``ratio`` is the median round trip of the tight bound over the loose one's
    (None when either missed its deadline), ``lo``/``hi`` its range at the
    repetitions' extremes.
    """
    dblp = [r for r in doc["rows"] if r["impl"] == "dblp" and r["policy"] == "static"]
    auth = any(r.get("auth") for r in dblp)
    shown = [r for r in dblp if bool(r.get("auth")) == auth]
    if not shown:
        return []
    tight_b, loose_b = min(r["bound"] for r in shown), max(r["bound"] for r in shown)
    pairs = []
    for loss in doc["losses"]:
        for mode in sorted({r["mode"] for r in shown}, key=lambda m: m != "ps"):
            for ctl in sorted({r["control"] for r in shown}):
                pick = {r["bound"]: r for r in shown
                        if (r["loss"], r["mode"], r["control"]) == (loss, mode, ctl)}
                tight, loose = pick.get(tight_b), pick.get(loose_b)
                if tight is None or loose is None:
                    continue
                t, lt = tight.get("round_trip_s"), loose.get("round_trip_s")
                lo, hi = _ratio_range(tight, loose)
                pairs.append({"loss": loss, "mode": mode, "control": ctl, "tight": tight,
                              "loose": loose, "ratio": t / lt if t and lt else None,
                              "lo": lo, "hi": hi})
    return pairs


def _pair_where(pair: dict) -> str:
    return (f"{_pct(pair['loss'])} loss, {'PS' if pair['mode'] == 'ps' else pair['mode']} "
            f"{pair['control'].upper()}")


def _missed_ratio(pair: dict) -> str | None:
    """``> Nx`` when only the tight bound missed its deadline: the deadline over the loose one's."""
    tight, loose = pair["tight"], pair["loose"]
    if pair["ratio"] is not None or not loose.get("round_trip_s"):
        return None
    return f"> {tight['round_timeout_s'] / loose['round_trip_s']:.1f}x"


def _pair_ratio(pair: dict) -> str:
    """``median x (lo-hi)`` of a pair, or what its missed deadlines leave of it."""
    if pair["ratio"] is not None:
        hi = _num(pair["hi"], "{:.2f}", none="")
        return f"{pair['ratio']:.2f}x ({_num(pair['lo'], '{:.2f}')}-{hi})"
    missed = _missed_ratio(pair)
    if missed:
        return f"{missed} ({_bound_label('static', pair['tight']['bound'])} missed)"
    return "– (both missed)"


def loose_bound_table(ref_dir: pathlib.Path) -> str:
    """`bench transport`: the tightest static bound's round trip over the loosest's, per loss.

    The bench's form of the paper's speedup: one 4 MiB round trip under
    sustained loss, not a burst inside training. Its median ratio, the range
    of the ratio over the repetitions' extremes, the passes each bound made
    (the physics: a round costs its passes, each pass at least a control
    round trip) and, with TCP control, the retransmission timeouts that make
    a pass dear. After the table, where the ratio stands against the paper's
    4.0-5.88x.
    """
    doc = _json(ref_dir / "bench-transport.json")
    pairs = _loose_bound_pairs(doc)
    if not pairs:
        raise ValueError(f"{ref_dir}: the bench has no pair of static-bound rows")
    tight_l = _bound_label("static", pairs[0]["tight"]["bound"])
    loose_l = _bound_label("static", pairs[0]["loose"]["bound"])
    tcp = any(p["control"] == "tcp" for p in pairs)  # TCP's timeouts make its passes dear
    out = [f"| loss p | mode, control | {tight_l} | {loose_l} | {tight_l} / {loose_l} (range) "
           f"| passes {tight_l} / {loose_l} (ideal) |" + (" TCP timeouts |" if tcp else ""),
           "|---" * (7 if tcp else 6) + "|"]
    for pair in pairs:
        tight, loose = pair["tight"], pair["loose"]
        passes = (f"{_num(tight.get('passes'))} / {_num(loose.get('passes'))} "
                  f"({tight['ideal_passes']} / {loose['ideal_passes']})")
        rto = " / ".join(str((r.get("tcp") or {}).get("TcpExtTCPTimeouts", "–"))
                         for r in (tight, loose)) if pair["control"] == "tcp" else "–"
        out.append(f"| {_pct(pair['loss'])} | {'PS' if pair['mode'] == 'ps' else pair['mode']}, "
                   f"{pair['control'].upper()} | {_trip(tight)} | {_trip(loose)} "
                   f"| {_pair_ratio(pair)} | {passes} |" + (f" {rto} |" if tcp else ""))
    text = "\n".join(out) + "\n\n"
    text += (f"Medians of {doc['reps']} round trips of {doc['bytes'] / (1 << 20):g} MiB at "
             f"{doc['rate_bps'] / 1e6:g} Mbit/s in seconds (time / `bound_s`); the range is the "
             "ratio at the repetitions' extremes (slowest over fastest and back), open above "
             "when a repetition missed its deadline. " + _loose_bound_sentence(pairs))
    cpu = [r for p in pairs for r in (p["tight"], p["loose"]) if r.get("cpu_busy_frac") is not None]
    if cpu:
        text += (f" The machine's CPU over these rows' round trips: at most "
                 f"{max(r['cpu_busy_frac'] for r in cpu):.0%} busy and "
                 f"{max(r.get('cpu_steal_frac') or 0 for r in cpu):.1%} stolen.")
    return text + "\n"


def _loose_bound_sentence(pairs: list[dict]) -> str:
    """Where the bench's ratio stands against the paper's least speedup, and where it cannot say."""
    whole = [p for p in pairs if p["lo"] is not None and p["lo"] >= PAPER_LEAST_SPEEDUP]
    median = [p for p in pairs if p not in whole and (p["ratio"] or 0) >= PAPER_LEAST_SPEEDUP]
    missed = [p for p in pairs if p["ratio"] is None]
    said = []
    if whole:
        said.append(f"Every repetition's ratio is at least {PAPER_LEAST_SPEEDUP:.1f}x at "
                    + ", ".join(f"{_pair_where(p)} ({_pair_ratio(p)})" for p in whole) + ".")
    if median:
        said.append(f"The median is at least {PAPER_LEAST_SPEEDUP:.1f}x, but not every "
                    "repetition's, at "
                    + ", ".join(f"{_pair_where(p)} ({_pair_ratio(p)})" for p in median) + ".")
    if not whole and not median:
        said.append(f"No median ratio reaches {PAPER_LEAST_SPEEDUP:.1f}x.")
    if missed:
        said.append("Deadlines leave no ratio at " + ", ".join(
            f"{_pair_where(p)} ({_pair_ratio(p)})" for p in missed) + ".")
    return " ".join(said)


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
    for doc in _jsons(ref_dir, "bench-transport-*.json"):
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
        return f"{_num(row.get('cpu_s_per_gb_worker'), '{:.1f}')} / " \
               f"{_num(row.get('cpu_s_per_gb_server'), '{:.1f}')}"

    def gbit(docs):
        return f"{docs[0]['rate_bps'] / 1e9:g}"

    head = ["link, gradient", "reliable PS, 0 %", "reliable sharded, 0 %", "gloo, 0 %",
            "sharded / gloo, 0 % (range)"]
    for x in lossy:
        head += [f"reliable sharded, {_pct(x)}", f"gloo, {_pct(x)}"]
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
                 _trip(over["dblp", "ps", 0.0]), _trip(over[(*sharded, 0.0)]),
                 _trip(over[(*gloo, 0.0)]), ratio]
        if per_run or aside:
            vs_gloo.append(f"{link} {_claim(per_run, 1.2, aside)}")
        gloo_near = [b["ratio"] for _, b in both if b["ratio"]]
        own = [a["ratio"] for a, _ in both if a["ratio"]]
        if own and gloo_near and statistics.median(gloo_near) <= 1.2:
            limit = 1.1 if docs[0]["rate_bps"] <= 100e6 else 1.2
            vs_bound.append(f"{link} within {limit:g}x {_claim(own, limit, aside, fmt=None)} "
                            f"({_range(own, '{:.3f}')}x; gloo {_range(gloo_near)}x)")
        for x in lossy:
            cells += [_trip(over[(*sharded, x)]), _trip(over[(*gloo, x)])]
            # Per run, sharded's time over gloo's (a gloo row past its deadline: 0).
            pairs, aside_x = runs_of(docs, (*sharded, x), (*gloo, x))
            won = [a["round_trip_s"] / b["round_trip_s"] if b["round_trip_s"] else 0.0
                   for a, b in pairs if a["round_trip_s"] is not None]
            if won or aside_x:
                beats.append(f"{link} at {_pct(x)} {_claim(won, 1.0, aside_x, below=True, fmt=None)}")
        if docs[0]["rate_bps"] <= 100e6:
            for impl, mode in (("dblp", "ps"), sharded):
                for x in losses:
                    rows, aside_t = runs_of(docs, (impl, mode, x))
                    v = [r["ratio"] for (r,) in rows if r["ratio"]]
                    if v or aside_t:
                        tight.append(f"{'PS' if mode == 'ps' else mode} at {_pct(x)} "
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
               f"{r.get('mode')} at {_pct(r['loss'])}")
              for docs in groups for i, d in enumerate(docs, 1) for r in d["rows"]
              if r.get("cpu_steal_frac") is not None]
    if not steals:
        return ""
    top = max(steals)
    aside = sum(s >= STEAL_FLAG for s, _ in steals)
    return (f"CPU steal (time the host gave other guests) over the rows: median "
            f"{_pct(statistics.median(s for s, _ in steals))}, highest {_pct(top[0])} "
            f"({top[1]}); the cells and claims above set aside the {aside} of {len(steals)} "
            f"rows with {_pct(STEAL_FLAG)} or more, whose time a neighbour may have set.")


def _core(doc: dict) -> str:
    return f"{doc['core_switches_used']}/{doc['core_switches']}"


def fat_trees_table(ref_dir: pathlib.Path) -> str:
    """`net check --k K`: one column per fat-tree size (its own JSON file)."""
    docs = sorted(_jsons(ref_dir, "net-check-k*.json"), key=lambda d: d["hosts"])
    flows = docs[0].get("core_flows")
    spread = f"core switches used by {flows} UDP flows" if flows else "core switches used by UDP flows"
    lines = [("process start to routed", lambda d: f"{d['startup_s']:.1f} s"),
             ("switches, hosts", lambda d: f"{d['switches']}, {d['hosts']}"),
             ("host pairs reachable (first, cold probe)",
              lambda d: f"{d['pairs_ok']}/{d['pairs']} ({d['pairs_ok_cold']})"),
             (spread, _core),
             ("one cross-pod TCP flow", lambda d: _num(d.get("tcp_goodput_mbps"), "{:.1f} Mbit/s")
              + f" of {d['shaped_mbps']:g}"),
             ("datapath", lambda d: str(d.get("datapath")))]
    out = ["| | " + " | ".join(d["topology"] for d in docs) + " |",
           "|---" * (len(docs) + 1) + "|"]
    out += [f"| {label} | " + " | ".join(cell(d) for d in docs) + " |" for label, cell in lines]
    return "\n".join(out) + "\n"


def goodput_table(ref_dir: pathlib.Path) -> str:
    """`net check --bw B --flows F`: TCP goodput per shaping rate, one flow and several at once."""
    docs = _jsons(ref_dir, "net-check-bw*.json")
    by = {(d["shaped_mbps"], len(d.get("tcp_flows") or [])): d for d in docs}
    many = max(f for _, f in by)
    rates = sorted({b for b, _ in by})

    def each(d):
        if d is None:
            return "–"
        f = d["tcp_flows"]
        return f"{d['tcp_goodput_mbps']:.1f} ({min(f):.1f}-{max(f):.1f})"

    out = [f"| shaping Mbit/s | 1 flow | {many} flows, each (range) | {many} flows, total |",
           "|---|---|---|---|"]
    for b in rates:
        one, m = by.get((b, 1)), by.get((b, many))
        out.append(f"| {b:g} | {_num(one and one['tcp_goodput_mbps'], '{:.1f}')} | {each(m)} "
                   f"| {_num(m and m['tcp_goodput_total_mbps'], '{:.0f}')} |")
    top = max(docs, key=lambda d: d["tcp_goodput_total_mbps"])
    return ("\n".join(out) + f"\n\nThe most the emulator carried in total: "
            f"{top['tcp_goodput_total_mbps']:.0f} Mbit/s ({len(top['tcp_flows'])} flows at "
            f"{top['shaped_mbps']:g} Mbit/s per link).\n")


def _ms(x) -> str:
    return _num(x, "{:.1f} ms")


def _burst_row(r: dict) -> str:
    from controllers.bursts import HIT_COVER

    if r["kind"] == "loss-round-trigger":
        return (f"| round-triggered | starts in its round, covers >= {100 * HIT_COVER:.0f} % of it "
                f"| {r['hits']}/{r['tries']} | | {_ms(r['start_lag_ms'])} | |")
    params = r.get("params", {})
    if r["kind"] == "loss":
        label, asked = f"loss p={params['p']:g}", f"{r['requested']:.3f}"
    elif r["kind"] == "police":
        offered = params["rate_mbps"] / (1 - r["requested"])
        label = f"police {params['rate_mbps']:g} Mbit/s on {offered:.1f} Mbit/s"
        asked = f"{r['requested']:.3f} (1 - rate/offered)"
    elif r["kind"] == "congest":
        label = f"congest, {params['rate_mbps']:g} Mbit/s cross traffic"
        asked = f"{r['requested']:.3f} ({r.get('requested_basis', 'estimate')})"
    else:
        label, asked = r["kind"], _num(r.get("requested"), "{:.3f}")
    return (f"| {label} | {asked} | {_num(r['measured_in_window'], '{:.3f}')} "
            f"| {_num(r.get('measured_outside'), '{:.3f}')} | {_ms(r['start_lag_ms'])} "
            f"| {_ms(r.get('mechanism_lag_ms'))} |")


def bursts_table(ref_dir: pathlib.Path) -> str:
    """`bench bursts`: requested against measured loss, and start lags, per burst kind."""
    doc = _json(ref_dir / "bench-bursts.json")
    windows = sorted({r["duration_ms"] for r in doc["rows"] if "duration_ms" in r})
    out = [f"{doc['topology']}, {doc['bw_mbps']:g} Mbit/s links, {doc['queue_pkts']}-packet "
           f"queues, {' / '.join(f'{w:g}' for w in windows)} ms windows:", "",
           "| kind | requested | measured in window | outside | start lag | of which the mechanism |",
           "|---|---|---|---|---|---|"]
    out += [_burst_row(r) for r in doc["rows"]]
    return "\n".join(out) + "\n"


def wall_times_table(reference_dir: pathlib.Path) -> str:
    """Every reference's commands and wall time (reproduce.json), and their sum."""
    from testbed.references import REFERENCES, read_record

    out = ["| reference | commands | wall time |", "|---|---|---|"]
    total = 0.0
    for name in REFERENCES:
        rec = read_record(reference_dir / name)
        argvs = [c["argv"] for c in rec["commands"]] if "commands" in rec else [rec["argv"]]
        total += rec["wall_s"]
        # Commands repeated for several runs (the same argv but the file it writes) once.
        runs: dict[tuple, list[list[str]]] = {}
        for a in argvs:
            runs.setdefault(tuple(a[:-1]) if a[-2:-1] == ["--json"] else tuple(a), []).append(a)
        cmds = "<br>".join(f"`dblp-testbed {' '.join(g[0])}`"
                           + (f" and {len(g) - 1} more runs of it" if len(g) > 1 else "")
                           for g in runs.values())
        out.append(f"| {name} | {cmds} | {rec['wall_s'] / 60:.1f} min |")
    out.append(f"| all, one after another | `dblp-testbed reproduce` | {total / 60:.1f} min |")
    return "\n".join(out) + "\n"


#: The pairs of the prototype's cost table: (control path, arm, baseline).
COST_PAIRS = (("UDP", "dblp", "static"), ("TCP", "dblp-tcp", "static-tcp"))


def _burst_speedup(summary: dict, arm: str, baseline: str) -> dict | None:
    """The burst-round speedup verdict of ``arm`` over ``baseline``, if the run judged it."""
    for v in summary.get("verdicts", []):
        if v["claim"] == "burst_speedup" and v.get("arm") == arm and v.get("baseline") == baseline:
            return v
    return None


def _burst_verdict(summary: dict, arm: str, baseline: str) -> str:
    """``point [lo, hi]x verdict`` of the burst-round speedup of ``arm`` over ``baseline``."""
    from testbed.analysis.answer import verdict_label
    v = _burst_speedup(summary, arm, baseline)
    return "–" if v is None else f"{_figure(v)} {verdict_label(v)}"


#: The smallest burst-round speedup the paper reports (its 4.0-5.88x).
PAPER_LEAST_SPEEDUP = 4.0


def _costs_sentence(steps: list[tuple[str, dict]]) -> str:
    """Where the paper's 4.0-5.9x can and cannot come from, read off the table's intervals."""
    judged = [(name, ctl, v["interval"]) for name, summary in steps
              for ctl, arm, base in COST_PAIRS
              if (v := _burst_speedup(summary, arm, base)) and (v.get("interval") or {}).get("hi")]
    if not judged:
        return "No step of the table has an interval yet."
    top = max(judged, key=lambda j: j[2]["point"])
    reach = [f"`{name}` ({ctl})" for name, ctl, iv in judged if iv["hi"] >= PAPER_LEAST_SPEEDUP]
    head = (f"The largest ratio is {_interval(top[2])}x (`{top[0]}`, {top[1]} control). ")
    if not reach:
        return (head + f"No interval reaches {PAPER_LEAST_SPEEDUP:.1f}x: the paper's 4.0-5.9x "
                "cannot come from the costs in these rows (each row keeps the costs above it).")
    return (head + f"The intervals that reach {PAPER_LEAST_SPEEDUP:.1f}x, where the paper's "
            f"4.0-5.9x can come from: {', '.join(reach)}; the other steps' cannot.")


def _burst_rounds(summary: dict, arm: str, baseline: str) -> str:
    """Both arms' burst-round p50, ``baseline / arm`` in seconds."""
    arms = summary.get("arms", {})
    ms = [(arms.get(a) or {}).get("burst_round_ms_p50") for a in (baseline, arm)]
    return " / ".join(_num(None if m is None else m / 1000, "{:.2f}") for m in ms) + " s"


def prototype_costs_table(reference_dir: pathlib.Path) -> str:
    """The burst-round ratio as each of the prototype's costs is added (`PROTOTYPE_COSTS`).

    One row per step, each its own run reference (a run of the same preset,
    seeds and bursts with one more cost): the speedup of dblp over static
    with its interval and verdict, for each control path, and the two arms'
    burst rounds it is the ratio of.
    """
    from testbed.references import PROTOTYPE_COSTS, SUSTAINED_LOSS

    head = ["| costs of the prototype |"]
    for ctl, arm, base in COST_PAIRS:
        head.append(f" {ctl} control: {arm} vs {base}, burst rounds | {base} / {arm} p50 |")
    rows = ["".join(head), "|---" * (1 + 2 * len(COST_PAIRS)) + "|"]
    steps = []
    for step in PROTOTYPE_COSTS:
        summary = _load(reference_dir / step.reference)
        steps.append((step.reference, summary))
        cells = [f"{step.adds} (`{step.reference}`)"]
        for _, arm, base in COST_PAIRS:
            cells += [_burst_verdict(summary, arm, base), _burst_rounds(summary, arm, base)]
        rows.append("| " + " | ".join(cells) + " |")
    text = "\n".join(rows) + "\n\n" + _costs_sentence(steps)
    bench = reference_dir / SUSTAINED_LOSS / "bench-transport.json"
    if bench.is_file():
        text += " " + _sustained_sentence(SUSTAINED_LOSS, _json(bench))
    return text + "\n"


def _sustained_sentence(name: str, doc: dict) -> str:
    """A bench reference's tight-over-loose ratio at each loss, in one sentence for the cost table."""
    pairs = _loose_bound_pairs(doc)
    if not pairs:
        raise ValueError(f"{name}: the bench has no pair of static-bound rows")

    def one(p):
        loss = _pct(p["loss"])
        if p["ratio"] is None:
            missed = _missed_ratio(p)
            return f"{missed} at {loss} (a deadline missed)" if missed else \
                f"none at {loss} (both missed the deadline)"
        lo = _num(p["lo"], "{:.2f}")
        spread = ("" if p["ratio"] < PAPER_LEAST_SPEEDUP
                  else f" (its repetitions {lo}-{p['hi']:.2f}x)" if p["hi"] is not None
                  else f" (its repetitions from {lo}x, one past the deadline)")
        return f"{p['ratio']:.2f}x at {loss}{spread}"
    reach = [_pct(p["loss"]) for p in pairs if (p["ratio"] or 0) >= PAPER_LEAST_SPEEDUP]
    controls = "/".join(sorted({p["control"].upper() for p in pairs}))
    text = (f"Measured outside training, in the transport bench (`{name}`: {controls} control, "
            f"one {doc['bytes'] / (1 << 20):g} MiB round trip under sustained loss), the "
            f"{_pct(pairs[0]['tight']['bound'])} bound's round trip over the "
            f"{_pct(pairs[0]['loose']['bound'])} bound's is " + ", ".join(one(p) for p in pairs) + ". ")
    if reach:
        return text + (f"The median passes {PAPER_LEAST_SPEEDUP:.1f}x at {', '.join(reach)} "
                       "loss: where each extra pass pays TCP's retransmission timeouts, the "
                       "paper's range can come from the bound itself.")
    return text + f"No median reaches {PAPER_LEAST_SPEEDUP:.1f}x there either."


def _of_summary(table: Callable[[dict], str]) -> Callable[[pathlib.Path], str]:
    return lambda ref_dir: table(_load(ref_dir))


def _of_ablation(table: Callable[[dict], str]) -> Callable[[pathlib.Path], str]:
    """A table of an ablation reference's ablation-summary.json (`testbed.analysis.ablation`)."""
    def render(ref_dir: pathlib.Path) -> str:
        from testbed.analysis import ablation
        return table(ablation.read_summary(ref_dir))
    return render


def _ablation_axis(field: str) -> Callable[[pathlib.Path], str]:
    """The table of one axis (by its setting's field) of an ablation reference."""
    def table(doc: dict) -> str:
        from testbed.analysis import ablation
        axes = [a for a in doc["axes"] if a["setting"].rsplit(".", 1)[-1] == field]
        if not axes:
            raise ValueError(f"ablation {doc['ablation']} has no axis {field!r}")
        return ablation.axis_table(doc, axes[0])
    return _of_ablation(table)


def _ablation_tables() -> dict[str, Callable[[pathlib.Path], str]]:
    from testbed.analysis import ablation
    out = {"ablation-baselines": _of_ablation(ablation.baselines_table),
           "ablation-harm": _of_ablation(ablation.harm_table),
           "ablation-accuracy": _of_ablation(ablation.accuracy_verdicts)}
    out.update({f"ablation-{f}": _ablation_axis(f) for f in ABLATION_AXES})
    return out


def _of_regime(table: Callable[[dict], str]) -> Callable[[pathlib.Path], str]:
    """A table of a regime reference's regime-summary.json (`testbed.analysis.regime`)."""
    def render(ref_dir: pathlib.Path) -> str:
        from testbed.analysis import regime
        return table(regime.read_summary(ref_dir)) + "\n"
    return render


def _regime_tables() -> dict[str, Callable[[pathlib.Path], str]]:
    from testbed.analysis import regime
    return {"regime-map": _of_regime(regime.markdown),
            "regime-why": _of_regime(regime.sentences),
            "regime-breakdowns": _of_regime(regime.breakdowns),
            "regime-wall": _of_regime(regime.wall_sentence)}


#: The axes an ablation reference's README blocks may name (``ablation-FIELD``).
ABLATION_AXES = ("p_high", "threshold", "signal")


#: Every table a README block can name, by the name in its marker; each reads
#: its reference's folder (`EVERY_TABLES`: the reference root).
TABLES: dict[str, Callable[[pathlib.Path], str]] = {
    "arms": _of_summary(arms_table),
    "verdicts": _of_summary(verdicts_table),
    "intervals": _of_summary(intervals_table),
    "cpu-budget": _of_summary(cpu_budget_table),
    "levels": levels_table,
    "phases": phases_table,
    "seeds": seeds_table,
    "round-trips": round_trips_table,
    "loose-bound": loose_bound_table,
    "line-rate": line_rate_table,
    "fat-trees": fat_trees_table,
    "goodput": goodput_table,
    "bursts": bursts_table,
    "wall-times": wall_times_table,
    "prototype-costs": prototype_costs_table,
    "design": design.design_table,
    "curves": design.curves_table,
    "cut-vs-relaxed": design.cut_vs_relaxed_table,
    **_ablation_tables(),
    **_regime_tables(),
}
#: Tables that read several references at once, from the reference root: their
#: blocks name `testbed.references.EVERY` ("all").
EVERY_TABLES = ("wall-times", "prototype-costs", "cut-vs-relaxed")


def render(ref: str, table: str, reference_dir: pathlib.Path) -> str:
    """The markdown of one marked block; a reference without a folder is an InputError."""
    from testbed.errors import InputError
    from testbed.references import EVERY

    if table not in TABLES:
        raise ValueError(f"README block names table {table!r}; known: {', '.join(TABLES)}")
    if (ref == EVERY) != (table in EVERY_TABLES):
        raise ValueError(f"README block {ref} {table}: the tables {', '.join(EVERY_TABLES)} "
                         f"and only they belong to reference {EVERY!r}")
    folder = reference_dir if ref == EVERY else reference_dir / ref
    if not folder.is_dir():
        raise InputError(f"{folder} does not exist; run `dblp-testbed reproduce {ref}`")
    return TABLES[table](folder)


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
