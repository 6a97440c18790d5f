"""What an ablation's runs say: each point against the baselines, with intervals.

The runs of `dblp-testbed ablate` (`testbed.run.ablation`) share a preset,
seeds and burst schedule, so their tables join: each point's varied arm is
renamed ``ARM@FIELD=VALUE`` and the base run's copy of the arm (the
preset's own settings) stands for that value on every axis. Each point is
then compared with every baseline by the run verdicts' own estimators
(`testbed.analysis.intervals.ESTIMATORS`: accuracy difference, training-time
cut, time-to-target speedup, burst-round speedup), paired by seed, with the
same bootstrap, and described by what the detector did (phase switches,
share of rounds relaxed). The target metric is one for all points: the
spec's, or derived over every arm and point of the ablation
(`claims.target_metric`), so time to target compares like with like.

Files written to the ablation's directory: ``ablation-summary.json``
(``SCHEMA``), ``points.csv`` (one row per point), ``report.md`` and
``plots/ablation-FIELD.png`` per axis.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pandas as pd

from testbed.analysis import claims, datasets, formats
from testbed.analysis import intervals as iv
from testbed.errors import InputError

#: Version of ablation-summary.json.
#: 1: first version (points with per-baseline intervals, the target, the axes).
SCHEMA = 1
#: The figures each point is compared with each baseline by.
FIGURES = ("accuracy_delta", "train_time_cut", "time_to_target", "burst_speedup")


def _read(run_dir: pathlib.Path, name: str) -> pd.DataFrame:
    return datasets.read(run_dir, datasets.TABLES[name])


def _label(arm: str, setting: str, value) -> str:
    return f"{arm}@{setting.rsplit('.', 1)[-1]}={value}"


def _kept(run_dir: pathlib.Path, name: str) -> pd.DataFrame:
    """A run's table, or, where only a committed reference's CSV is kept beside the summary
    (no Parquet), that CSV."""
    if not (run_dir / f"{name}.parquet").exists() and (run_dir / f"{name}.csv").exists():
        return pd.read_csv(run_dir / f"{name}.csv")
    return _read(run_dir, name)


def join(out: pathlib.Path, plan: dict, read=_read) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every finished run's rounds and evals in one pair of frames, points' arms relabelled.

    ``read(run_dir, name)``: the run's Parquet tables, or `_kept` for a reference's CSVs.
    """
    rounds, evals = [], []
    for name, run in plan["runs"].items():
        if run["status"] != "ok":
            continue
        d = out / name
        r, e = read(d, "rounds"), read(d, "evals")
        if run["setting"] is not None:
            lab = _label(plan["arm"], run["setting"], run["value"])
            r = r[r["arm"] == plan["arm"]].assign(arm=lab)
            e = e[e["arm"] == plan["arm"]].assign(arm=lab)
        rounds.append(r)
        evals.append(e)
    if not rounds or "base" not in plan["runs"] or plan["runs"]["base"]["status"] != "ok":
        raise InputError(f"{out}: the base run has not finished; rerun the ablation")
    return pd.concat(rounds, ignore_index=True), pd.concat(evals, ignore_index=True)


def _phase(rounds: pd.DataFrame, arm: str) -> dict:
    """Mean phase switches per seed and the share of rounds the detector ran relaxed."""
    r = rounds[(rounds["arm"] == arm) & rounds["phase"].notna()]
    if not len(r):
        return {"switches": None, "relaxed_share": None}
    switches = [int((g.sort_values("round")["phase"].astype(str).to_numpy()[1:]
                     != g.sort_values("round")["phase"].astype(str).to_numpy()[:-1]).sum())
                for _, g in r.groupby("seed")]
    return {"switches": float(np.mean(switches)),
            "relaxed_share": float((r["phase"] != "critical").mean())}


def _critical_by_round(rounds: pd.DataFrame, arm: str) -> dict:
    """round -> share of the seeds whose detector was critical in it (only rounds with a phase)."""
    r = rounds[(rounds["arm"] == arm) & rounds["phase"].notna()]
    share = (r["phase"] == "critical").groupby(r["round"]).mean()
    return {int(k): float(v) for k, v in share.items()}


def harm(out: pathlib.Path) -> dict | None:
    """Where drops hurt: the ablation's loss-tolerance sweep per window, or None if it has none.

    Per phase window (its rounds), the mean change of final accuracy and the
    gap right after the window, against the same seed without drops, at the
    sweep's non-zero drop fraction.
    """
    path = out / "harm" / "sweep.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    meta, rows = doc["meta"], doc["runs"]
    frac = max(meta["fractions"])
    windows = []
    for phase in meta["phases"]:
        sel = [r for r in rows if r["phase"] == phase and r["drop_fraction"] == frac]
        if sel:
            windows.append({"phase": phase, "start": sel[0]["window_start"], "stop": sel[0]["window_end"],
                            "final_delta": float(np.mean([r["final_accuracy"] - b["final_accuracy"]
                                                          for r in sel for b in rows
                                                          if b["drop_fraction"] == 0
                                                          and b["phase"] == phase
                                                          and b["seed"] == r["seed"]])),
                            "gap_after": float(np.mean([r["gap_after_window"] for r in sel])),
                            "seeds": len(sel)})
    return {"model": meta["model"], "workers": meta["workers"], "rounds": meta["rounds"],
            "drop_fraction": frac, "order": meta["order"], "elapsed_s": meta["elapsed_s"],
            "windows": windows}


def _point(frames: iv.RunFrames, arm: str, baselines: list[str], **kw) -> dict:
    """One point (or baseline): its own figures, and each estimator against each baseline."""
    r = frames.rounds[frames.rounds["arm"] == arm]
    finals = iv.final_metric(frames.evals, arm) if frames.evals is not None else {}
    losses = iv.final_metric(frames.evals, arm, "test_loss") if frames.evals is not None else {}
    ttt = iv.time_to_target(r, frames.evals, frames.target) if frames.target is not None else None
    reached = ttt[ttt["round"].notna()] if ttt is not None else pd.DataFrame()
    out = {"arm": arm, "seeds": sorted(int(s) for s in r["seed"].unique()),
           "final_accuracy": finals, "final_accuracy_mean": _mean(finals.values()),
           "final_loss_mean": _mean(losses.values()),
           "train_time_s_mean": _mean(g["duration_ms"].sum() / 1e3 for _, g in r.groupby("seed")),
           "time_to_target_s_median": float(reached["t_s"].median()) if len(reached) else None,
           "reached_target": f"{len(reached)}/{0 if ttt is None else len(ttt)}",
           **_phase(frames.rounds, arm),
           "critical_by_round": _critical_by_round(frames.rounds, arm), "against": {}}
    for base in baselines:
        figs = {}
        for name in FIGURES:
            try:
                figs[name] = {"interval": iv.ESTIMATORS[name](frames, arm, base, **kw).to_dict(),
                              "reason": None}
            except ValueError as exc:
                figs[name] = {"interval": None, "reason": str(exc)}
        out["against"][base] = figs
    return out


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(vals)) if vals else None


def analyse(out: pathlib.Path, plan: dict, **kw) -> dict:
    """ablation-summary.json's content (``SCHEMA``) from the finished runs of ``plan``."""
    from testbed.analysis.raw import load_spec

    rounds, evals = join(out, plan)
    target, source = claims.target_metric(load_spec(out / "base"), evals)
    frames = iv.RunFrames(rounds, evals, target)
    baselines = list(plan["baselines"])
    axes = []
    for axis in plan["axes"]:
        points = []
        for v in axis["values"]:
            if v == axis["base"]:
                arm = plan["arm"]
            else:
                run = plan["runs"].get(f"{axis['setting'].rsplit('.', 1)[-1]}={v}")
                if not run or run["status"] != "ok":
                    points.append({"value": v, "arm": None, "missing": True})
                    continue
                arm = _label(plan["arm"], axis["setting"], v)
            points.append({"value": v, "base": v == axis["base"], **_point(frames, arm, baselines, **kw)})
        axes.append({**axis, "points": points})
    return {"schema": SCHEMA, "ablation": plan["ablation"], "preset": plan["preset"],
            "arm": plan["arm"], "baselines": baselines,
            # Each baseline against the ones before it (static-high vs static: what
            # the loose bound alone buys).
            "baseline_points": {b: _point(frames, b, baselines[:i], **kw)
                                for i, b in enumerate(baselines)},
            "target": {"metric": frames.metric, "value": target, "source": source},
            "axes": axes, "harm": harm(out),
            "runs": {n: {k: r[k] for k in ("status", "wall_s")} for n, r in plan["runs"].items()}}


def _fmt(fig: dict | None, unit: str) -> str:
    if not fig or not fig["interval"]:
        return "-"
    i = fig["interval"]
    return f"{i['point']:.2f} [{i['lo']:.2f}, {i['hi']:.2f}]{unit}"


def points_table(doc: dict) -> pd.DataFrame:
    """One row per point: its figures, and each against each baseline with its interval."""
    rows = []
    for axis in doc["axes"]:
        for p in axis["points"]:
            if p.get("missing"):
                rows.append({"axis": axis["label"], "value": p["value"], "arm": None})
                continue
            row = {"axis": axis["label"], "value": p["value"], "arm": p["arm"],
                   "base": p["base"], "seeds": len(p["seeds"]),
                   "final_accuracy_pct": _pct(p["final_accuracy_mean"]),
                   "final_loss": p["final_loss_mean"], "train_time_s": p["train_time_s_mean"],
                   "time_to_target_s": p["time_to_target_s_median"],
                   "reached_target": p["reached_target"], "phase_switches": p["switches"],
                   "relaxed_share": p["relaxed_share"]}
            for base, figs in p["against"].items():
                for name, fig in figs.items():
                    i = fig["interval"]
                    for k in ("point", "lo", "hi"):
                        row[f"{name}_vs_{base}_{k}"] = i[k] if i else None
            rows.append(row)
    return pd.DataFrame(rows)


def _pct(v):
    return None if v is None else 100.0 * v


def _cell(fig: dict | None, name: str) -> str:
    unit = {"x": "x", "%": "", "points": ""}[iv.ESTIMATORS[name].unit]
    return _fmt(fig, unit)


def axis_table(doc: dict, axis: dict) -> str:
    """One axis as a Markdown table: each point's figures, and against the baselines.

    Accuracy is compared with every baseline (phase-awareness is judged
    against static-high above all); time, time to target and burst rounds
    with the first (static, the paper's baseline). Every figure against
    every baseline is in ablation-summary.json and points.csv.
    """
    first = doc["baselines"][0]
    head = ["value", "final acc %", *[f"acc vs {b} (points)" for b in doc["baselines"]],
            "train s", f"time cut vs {first} (%)", "to target s", f"to target vs {first} (x)",
            f"burst rounds vs {first} (x)", "relaxed", "switches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in axis["points"]:
        if p.get("missing"):
            lines.append(f"| {p['value']} | not run |" + " |" * (len(head) - 2))
            continue
        vs = p["against"]
        cells = [f"**{p['value']}**" if p["base"] else str(p["value"]),
                 _num(p["final_accuracy_mean"], 100, ".2f"),
                 *[_cell(vs[b]["accuracy_delta"], "accuracy_delta") for b in doc["baselines"]],
                 _num(p["train_time_s_mean"], 1, ".0f"), _cell(vs[first]["train_time_cut"], "train_time_cut"),
                 _num(p["time_to_target_s_median"], 1, ".0f") + f" ({p['reached_target']})",
                 _cell(vs[first]["time_to_target"], "time_to_target"),
                 _cell(vs[first]["burst_speedup"], "burst_speedup"),
                 _num(p["relaxed_share"], 100, ".0f") + " %", _num(p["switches"], 1, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def baselines_table(doc: dict) -> str:
    """The baselines' own figures (what every point is compared with)."""
    first = doc["baselines"][0]
    lines = [f"| baseline | final acc % | acc vs {first} (points) | train s | time cut vs {first} (%) "
             f"| burst rounds vs {first} (x) | to target s |", "|---|---|---|---|---|---|---|"]
    for b, p in doc["baseline_points"].items():
        vs = p["against"].get(first, {})
        lines.append(f"| {b} | {_num(p['final_accuracy_mean'], 100, '.2f')} | "
                     f"{_cell(vs.get('accuracy_delta'), 'accuracy_delta')} | "
                     f"{_num(p['train_time_s_mean'], 1, '.0f')} | "
                     f"{_cell(vs.get('train_time_cut'), 'train_time_cut')} | "
                     f"{_cell(vs.get('burst_speedup'), 'burst_speedup')} | "
                     f"{_num(p['time_to_target_s_median'], 1, '.0f')} ({p['reached_target']}) |")
    return "\n".join(lines) + "\n"


def harm_table(doc: dict) -> str:
    """Where drops hurt: the loss-tolerance sweep's cost per drop window, in points."""
    h = doc.get("harm")
    if not h:
        return "(no loss-tolerance sweep in this ablation)\n"
    lines = ["| window | rounds | gap right after | at the end |", "|---|---|---|---|"]
    lines += [f"| {w['phase']} | {w['start']}-{w['stop'] - 1} | {100 * w['gap_after']:+.2f} | "
              f"{100 * w['final_delta']:+.2f} |" for w in h["windows"]]
    return "\n".join(lines) + "\n"


def text(doc: dict) -> str:
    """The report: the target, the baselines, each axis's table and where drops hurt."""
    lines = [f"# Ablation `{doc['ablation']}` ({doc['preset']} preset, arm {doc['arm']})", ""]
    t = doc["target"]
    lines += [f"Target {t['metric']}: {t['value']:.4f} ({t['source']})." if t["value"] is not None
              else f"No target ({t['source']}).", "", baselines_table(doc)]
    for axis in doc["axes"]:
        lines += [f"## {axis['label']} (`{axis['setting']}`; the preset's: {axis['base']})", "",
                  axis_table(doc, axis)]
    h = doc.get("harm")
    if h:
        lines += [f"## Where drops hurt ({h['model']}, {h['workers']} workers, no network)", "",
                  f"Drop {h['drop_fraction']:.1%} of every worker's chunks in one window; change "
                  "against the same seed without drops, in points (`harm/report.md`):", "",
                  harm_table(doc)]
    return "\n".join(lines)


def _num(v, scale, spec) -> str:
    return "-" if v is None else format(v * scale, spec)


def write(out: pathlib.Path, plan: dict) -> dict:
    """Analyse the finished runs and write the summary, table, report and plots; return the summary."""
    from testbed.analysis import study_plots

    out = pathlib.Path(out)
    doc = analyse(out, plan)
    (out / "ablation-summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    points_table(doc).to_csv(out / "points.csv", index=False)
    (out / "plots").mkdir(exist_ok=True)
    for axis in doc["axes"]:
        field = axis["setting"].rsplit(".", 1)[-1]
        study_plots.ablation_axis(doc, axis, out / "plots" / f"ablation-{field}.png")
        study_plots.ablation_phases(doc, axis, out / "plots" / f"phases-{field}.png")
    (out / "report.md").write_text(text(doc) + "\n")
    return doc


def _accuracy_figure(finals: dict, base_finals: dict) -> dict:
    """The accuracy difference of one point against one baseline from their per-seed finals:
    what ``accuracy_delta`` gives on the evaluations (`intervals.mean_difference` of
    `intervals.final_metric`), so the summary's finals are enough to compute it again."""
    try:
        return {"interval": iv.mean_difference(finals, base_finals, scale=100.0).to_dict(),
                "reason": None}
    except ValueError as exc:
        return {"interval": None, "reason": str(exc)}


def rejudge(out: pathlib.Path) -> dict:
    """The ablation's intervals computed again with today's estimators; summary, points.csv
    and report rewritten. Returns the new summary.

    Every figure comes again from the rounds and evaluations each run keeps
    beside the summary (``<run>/rounds.csv``, ``evals.csv``: `join`), against
    the summary's own target, so a change to how an interval is computed (the
    seed as the unit) reaches the ablation without running it again. Where the
    runs' tables are not kept, only the accuracy difference can be computed
    again: it needs each seed's final accuracy, which the summary has for
    every point and baseline; the figures of rounds then stay as they were.
    """
    out = pathlib.Path(out)
    doc = read_summary(out)
    def by_seed(p):   # JSON keys are strings; the analysis paired integer seeds, in order
        return {int(s): v for s, v in p["final_accuracy"].items()}
    finals = {b: by_seed(p) for b, p in doc["baseline_points"].items()}
    points = [*doc["baseline_points"].values(),
              *(p for axis in doc["axes"] for p in axis["points"] if not p.get("missing"))]
    try:
        # The plan the run side wrote (testbed.run.ablation, PLAN_SCHEMA 1): its runs and arm.
        plan = json.loads((out / "ablation.json").read_text())
        rounds, evals = join(out, plan, read=_kept)
        frames = iv.RunFrames(rounds, evals, doc["target"]["value"])
    except (InputError, OSError, KeyError, ValueError):
        frames = None
    for p in points:
        for base, figs in p["against"].items():
            if frames is None:
                figs["accuracy_delta"] = _accuracy_figure(by_seed(p), finals[base])
                continue
            for name in FIGURES:
                try:
                    figs[name] = {"interval": iv.ESTIMATORS[name](frames, p["arm"], base)
                                  .to_dict(), "reason": None}
                except ValueError as exc:
                    figs[name] = {"interval": None, "reason": str(exc)}
    (out / "ablation-summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    points_table(doc).to_csv(out / "points.csv", index=False)
    (out / "report.md").write_text(text(doc) + "\n")
    return doc


def accuracy_verdicts(doc: dict) -> str:
    """Each point's accuracy against the first baseline, judged as the run verdicts judge the
    paper's accuracy claim (`claims.CLAIMS`: its region, Student's t, "too few seeds").

    Generated, so the page's prose never has to say which intervals lie
    where (it once said "wholly below -0.5" of an interval that was not).
    """
    claim = claims.CLAIMS["accuracy"]
    first = doc["baselines"][0]
    groups: dict[str, list[str]] = {}
    for axis in doc["axes"]:
        for p in axis["points"]:
            if p.get("missing") or (p["base"] and axis is not doc["axes"][0]):
                continue
            fig = p["against"][first]["accuracy_delta"]
            got = iv.Interval(**fig["interval"]) if fig["interval"] else None
            v, why = claims.enough_seeds(got, claims.verdict(got, claim.region, fig["reason"] or ""))
            short = claims.too_few_seeds(got, claim.region, (v, why), None)
            label = v + (": too few seeds" if short else "")
            name = f"{axis['label']} {p['value']}" + (" (the preset's)" if p["base"] else "")
            cell = _fmt(fig, "") if got else f"no interval: {fig['reason']}"
            if short and short[1]["needed"]:
                cell += f" (about {short[1]['needed']} seeds needed)"
            groups.setdefault(label, []).append(f"{name}, {cell}")
    seeds = sorted({len(p["seeds"]) for a in doc["axes"] for p in a["points"]
                    if not p.get("missing")})
    head = (f"By the rule of the paper's accuracy claim (the difference against {first} "
            f"{claim.region.text('points')}; 95 % Student's t intervals over "
            f"{'/'.join(map(str, seeds))} paired seeds, from the per-seed final accuracies "
            "ablation-summary.json keeps):")
    order = (claims.REPRODUCED, claims.REFUTED, f"{claims.UNRESOLVED}: too few seeds",
             claims.UNRESOLVED)
    lines = [head, ""] + [f"- **{label}**: " + "; ".join(groups[label]) + "."
                          for label in order if label in groups]
    return "\n".join(lines) + "\n"


def read_summary(out: pathlib.Path) -> dict:
    """ablation-summary.json, refusing a version this code does not know (one line)."""
    rebuild = f"rebuild it (`dblp-testbed ablate NAME --report-only --out {out}`)"
    return formats.read_versioned(pathlib.Path(out) / "ablation-summary.json", SCHEMA, rebuild, rebuild)
