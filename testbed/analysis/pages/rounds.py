"""The tables of a run reference's rounds and evaluations: loss levels, phases and seeds.

These read the kept per-round tables (rounds.csv, bursts.csv, evals.csv)
rather than the summary, because they cut the rounds in ways the summary
does not: by the loss a burst asked for, by the phase DBLP was in at the
burst, by seed. The arms' order is still the summary's.
"""
from __future__ import annotations

import pathlib

from testbed.analysis.pages.cells import figure, num
from testbed.analysis.pages.files import load_summary
from testbed.analysis.pages.registry import register


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
    order = load_summary(ref_dir).get("arms_order") or sorted(rounds["arm"].unique())
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
    order = load_summary(ref_dir).get("arms_order") or sorted(rounds["arm"].unique())
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
            "seed): " + ", ".join(f"{a} {num(m, '{:.2f}')}" for a, m in moved.items())
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

    summary = load_summary(ref_dir)
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
        cells = [f"{num(None if seed not in acc[a] else 100 * acc[a][seed], '{:.2f} %')} "
                 f"({num(span[a].get(seed), '{:.1f} s')})" for a in order]
        if diff:
            d = (100 * (acc[arm][seed] - acc[base][seed])
                 if seed in acc[arm] and seed in acc[base] else None)
            cells.append(num(d, "{:+.2f} points"))
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    out = "\n".join(rows) + "\n"
    if diff:
        out += "\n" + _seed_pair_sentence(summary, rounds, evals, arm, base, span) + "\n"
    out += "\n" + _last_evals_sentence(evals, order) + "\n"
    for pair in summary.get("intervals", {}).values():
        fig = pair.get("figures", {}).get("accuracy_delta")
        if fig and fig.get("interval"):
            i = fig["interval"]
            out += (f"\nFinal accuracy, {pair['arm']} minus {pair['baseline']}: {figure(fig)} "
                    f"(95 % interval, {i.get('method', 'bootstrap')}, over "
                    f"{i.get('n_seeds', '–')} seeds, summary.json).\n")
        elif fig and fig.get("reason"):
            out += (f"\nFinal accuracy, {pair['arm']} minus {pair['baseline']}: no interval, "
                    f"{fig['reason']} (summary.json).\n")
    return out


register("levels", levels_table)
register("phases", phases_table)
register("seeds", seeds_table)
