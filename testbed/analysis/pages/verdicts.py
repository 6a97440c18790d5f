"""The tables of a run reference's summary.json: its arms, verdicts, intervals, burst levels and
CPU budget.

Each reads only the summary (`of_summary`), never the run's per-round
tables, so these are the figures `dblp-testbed run` printed at its end:
the page shows what the run concluded, not a second computation of it.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable

from testbed.analysis.pages.cells import figure, interval, num, pct
from testbed.analysis.pages.files import load_summary
from testbed.analysis.pages.registry import register


def arms_table(summary: dict) -> str:
    """One row per arm: burst and normal rounds, training time, final metric."""
    rows = ["| arm | burst-round p50 (over its bound) | normal round p50 | training time "
            "| final accuracy | time to target |",
            "|---|---|---|---|---|---|"]
    for name in summary.get("arms_order") or sorted(summary["arms"]):
        a = summary["arms"][name]
        over = a.get("burst_round_over_phys_bound")
        burst = num(a.get("burst_round_ms_p50"), "{:.0f} ms")
        if over is not None:
            burst += f" ({num(over, '{:.2f}x')})"
        acc = num(None if a.get("final_accuracy") is None else 100 * a["final_accuracy"],
                  "{:.2f} %")
        rows.append(f"| {name} | {burst} | {num(a.get('normal_round_ms_p50'), '{:.0f} ms')} "
                    f"| {num(a.get('train_time_s'), '{:.1f} s')} | {acc} "
                    f"| {num(a.get('time_to_target_s'), '{:.1f} s')} |")
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
                num(None if key not in means[a] else 100 * means[a][key], "{:.0f} %")
                for a in arms) + " |")
    def other(m: dict) -> float | None:
        if "machine busy" not in m:
            return None
        return 100 * (m["machine busy"] - sum(m.get(k, 0.0) for k, _ in BUDGET_ROWS))
    rows.append("| other | " + " | ".join(num(other(means[a]), "{:.0f} %") for a in arms) + " |")
    rows.append("| (kernel network work in softirq, mostly inside the rows above) | " + " | ".join(
        num(100 * means[a]["kernel softirq"] if "kernel softirq" in means[a] else None, "{:.0f} %")
        for a in arms) + " |")
    rows.append("| **CPU busy, share of the machine's cores (highest unit)** | " + " | ".join(
        num(100 * max(busy[a]) if busy[a] else None, "{:.0f} %") for a in arms) + " |")
    return "\n".join(rows) + "\n"


#: The figures of the intervals table, in column order: (estimator, heading).
FIGURES = (("burst_speedup", "burst-round speedup"), ("train_time_cut", "training-time cut"),
           ("accuracy_delta", "final accuracy, difference"),
           ("time_to_target", "time-to-target speedup"),
           ("round_p99_speedup", "p99 round speedup"), ("round_mean_speedup", "mean round speedup"))


def pooled(pools: dict | None) -> str:
    """What a pooled burst verdict pools, in words: its bursts, their levels and DBLP's phases."""
    if not pools or not pools["bursts"]:
        return ""
    levels = "/".join(pct(x) for x in pools["levels"]) or "no recorded level"
    phases = ", ".join(f"{n} {ph}" for ph, n in sorted(pools["phases"].items(),
                                                         key=lambda kv: (-kv[1], kv[0])))
    return (f"{pools['bursts']} bursts at {levels} over {pools['seeds']} seeds"
            + (f": {phases}" if phases else ""))


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
        what = pooled(v.get("pools"))
        claim = f"{v['claim']} (pools {what})" if what else v["claim"]
        rows.append(f"| {claim} | {pair} | {paper_cell(v)} | {figure(v)} "
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
                    + " | ".join(figure(figs.get(e)) for e, _ in FIGURES) + " |")
    return "\n".join(rows) + "\n"


def _passes(row: dict) -> str:
    """A level's pass-count ratio and the counts it comes from: ``5.00x (10/2)``."""
    n = row.get("passes") or [None, None]
    if row.get("pass_ratio") is None:
        return "–"
    return f"{row['pass_ratio']:.2f}x ({n[0]}/{n[1]})"


def _level_verdict(row: dict) -> str:
    """A level's verdict as the verdicts table words it: too few seeds says how many."""
    from testbed.analysis.claims import TOO_FEW_BURSTS
    short = row.get("too_few_seeds")
    if short:
        need = f"; about {short['needed']} needed" if short.get("needed") else ""
        return f"{row['verdict']}: too few seeds ({short['seeds']}{need})"
    if row["interval"] is None and row["verdict"] != TOO_FEW_BURSTS:
        return f"{row['verdict']} ({row['reason']})"
    return row["verdict"]


def burst_levels_table(summary: dict) -> str:
    """The burst speedup per requested loss level and DBLP phase, each DBLP arm against its static
    partner (summary burst_levels): the speedup and its 95 % interval (seed as the unit), the
    bursts and seeds behind it, the pass-count ratio of the two bounds at that level, the verdict
    on the burst claim; then what each pair's pooled verdict pools."""
    rows = ["| arm vs baseline | burst loss | DBLP's phase | bursts (seeds) "
            "| speedup, point [95 % interval] | pass-count ratio (passes) | verdict |",
            "|---|---|---|---|---|---|---|"]
    notes = []
    levels = summary.get("burst_levels") or {}
    order = summary.get("arms_order") or []
    # summary.json sorts its keys: the pairs in the run's order of arms, as the verdicts are.
    for entry in sorted(levels.values(), key=lambda e: (
            order.index(e["arm"]) if e["arm"] in order else len(order), e["arm"])):
        pair = f"{entry['arm']} vs {entry['baseline']}"
        for r in entry["rows"]:
            rows.append(f"| {pair} | {pct(r['level'])} | {r['phase']} | {r['bursts']} "
                        f"({r['seeds']}) | {interval(r['interval'], '{:.2f}', 'x')} "
                        f"| {_passes(r)} | {_level_verdict(r)} |")
        if not entry["rows"]:
            rows.append(f"| {pair} | – | – | – | – | – | {entry['reason']} |")
        what = pooled(entry.get("pools"))
        if what:
            notes.append(f"- {pair}: the pooled burst verdict (the verdicts table) pools {what}.")
    if "burst_levels" not in summary:
        rows.append("| (a summary from before version 9: `dblp-testbed reproduce --rejudge` "
                    "judges it again) | – | – | – | – | – | – |")
    elif not levels:
        rows.append("| (no DBLP arm with its static partner ran) | – | – | – | – | – | – |")
    return "\n".join(rows + ([""] + notes if notes else [])) + "\n"


def of_summary(table: Callable[[dict], str]) -> Callable[[pathlib.Path], str]:
    """A table of a run reference's summary.json, as a renderer of its folder."""
    return lambda ref_dir: table(load_summary(ref_dir))


register("arms", of_summary(arms_table))
register("verdicts", of_summary(verdicts_table))
register("intervals", of_summary(intervals_table))
register("burst-levels", of_summary(burst_levels_table))
register("cpu-budget", of_summary(cpu_budget_table))
