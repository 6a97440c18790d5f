"""The design's own figures, to stand beside each training-time verdict: how much of training
a phase-aware bound spent relaxed, how much of a round the exchange takes, and each seed's cut.

Why: a phase-aware bound saves time only in the rounds it runs relaxed, and only in the
part of a round that is the exchange. So the training-time cut is about the relaxed share
times the saving per relaxed round, scaled by the communication share: a run that stops
soon after the detector first relaxes measures its own horizon, not the transport, and a
model whose rounds are mostly compute cannot show a transport's cut at all. These tables
put those figures next to the cut, per seed (the seed is the unit), from the rounds each
committed reference keeps (``rounds.csv``, valid units only).
"""
from __future__ import annotations

import json
import math
import pathlib

#: The claim whose pairs the tables follow: DBLP against the static bound of its own
#: control path and mode (`testbed.analysis.claims`).
CLAIM = "train_time_cut"


def _summary(ref_dir: pathlib.Path) -> dict:
    return json.loads((ref_dir / "summary.json").read_text())


def _rounds(ref_dir: pathlib.Path):
    import pandas as pd
    r = pd.read_csv(ref_dir / "rounds.csv")
    return r[r["valid"].astype(bool)] if "valid" in r.columns else r


def _relaxed(g) -> float | None:
    ph = g["phase"].dropna() if "phase" in g.columns else g.iloc[0:0]
    ph = ph[ph.isin(["critical", "relaxed"])]
    return float((ph == "relaxed").mean()) if len(ph) else None


def _comm(g) -> float | None:
    if "comm_ms_max" not in g.columns:
        return None
    total = float(g["duration_ms"].sum())
    return float(g["comm_ms_max"].sum()) / total if total > 0 else None


def per_seed(rounds, arm: str, base: str) -> list[dict]:
    """For each seed both arms ran: the arm's relaxed and communication shares, its rounds,
    and its cut against ``base`` in percent (100 x (1 - its summed windows / base's))."""
    out = []
    a, b = rounds[rounds["arm"] == arm], rounds[rounds["arm"] == base]
    for seed in sorted(set(a["seed"]) & set(b["seed"])):
        ga, gb = a[a["seed"] == seed], b[b["seed"] == seed]
        total = float(gb["duration_ms"].sum())
        out.append({"seed": int(seed), "rounds": int(len(ga)), "relaxed": _relaxed(ga),
                    "comm": _comm(ga),
                    "cut": 100 * (1 - float(ga["duration_ms"].sum()) / total) if total else None})
    return out


def _pct(x, fmt="{:.0f} %") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(100 * x)


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _pairs(summary: dict) -> list[dict]:
    return [v for v in summary.get("verdicts", []) if v["claim"] == CLAIM and v.get("pair")]


def _cut(v: dict) -> str:
    iv = v.get("interval")
    if not iv:
        return "–"
    return f"{iv['point']:.1f} [{iv['lo']:.1f}, {iv['hi']:.1f}] %"


def _row_cells(rounds, v: dict) -> list[str]:
    from testbed.analysis.answer import verdict_label
    seeds = per_seed(rounds, v["arm"], v["baseline"])
    relaxed = _mean(s["relaxed"] for s in seeds)
    cut = _mean(s["cut"] for s in seeds)
    saving = (cut / 100 / relaxed) if cut is not None and relaxed else None
    return [f"{v['arm']} vs {v['baseline']}", str(len(seeds)),
            str(seeds[0]["rounds"]) if seeds else "–", _pct(relaxed),
            _pct(_mean(s["comm"] for s in seeds)),
            ", ".join("–" if s["cut"] is None else f"{s['cut']:.1f}" for s in seeds),
            _cut(v), _pct(saving), verdict_label(v)]


HEAD = ("| arm vs baseline | seeds | rounds per seed | relaxed share | communication share "
        "| cut per seed (%) | cut, mean [95 % interval] | cut / relaxed share | verdict |")


def design_table(ref_dir: pathlib.Path) -> str:
    """One row per DBLP pair of a run reference: the design's figures beside its cut."""
    summary = _summary(ref_dir)
    rounds = _rounds(ref_dir)
    rows = [HEAD, "|---" * 9 + "|"]
    rows += ["| " + " | ".join(_row_cells(rounds, v)) + " |" for v in _pairs(summary)]
    return "\n".join(rows) + "\n"


def cut_vs_relaxed_table(reference_dir: pathlib.Path) -> str:
    """Every run reference's DBLP pairs: the training-time cut against the relaxed share.

    "cut / relaxed share" is the saving a relaxed round brought, if every
    saving came from relaxed rounds: where it is alike across references, the
    cut follows the share (the horizon), not the transport.
    """
    from testbed.references import REFERENCES, RunReference
    rows = ["| reference " + HEAD, "|---" * 10 + "|"]
    for name, ref in REFERENCES.items():
        d = reference_dir / name
        if not isinstance(ref, RunReference) or not (d / "rounds.csv").is_file():
            continue
        summary, rounds = _summary(d), _rounds(d)
        rows += [f"| {name} | " + " | ".join(_row_cells(rounds, v)) + " |"
                 for v in _pairs(summary)]
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------ the plateau --

#: A model has reached its plateau when the last fifth of its evaluations (two at least)
#: lie within this much of each other (accuracy, as a fraction), in every seed.
PLATEAU_SPREAD = 0.005
#: Fewer evaluations than this per seed cannot show a plateau: their last fifth is one.
PLATEAU_MIN_EVALS = 10
#: The figure of the per-seed curves, kept beside a run reference's tables.
CURVES = "curves.svg"


def _evals(ref_dir: pathlib.Path):
    import pandas as pd
    e = pd.read_csv(ref_dir / "evals.csv")
    e = e[e["valid"].astype(bool)] if "valid" in e.columns else e
    return e.groupby(["arm", "seed", "round"], as_index=False)[["test_accuracy", "test_loss"]].mean()


def plateau(evals, arm: str) -> list[dict]:
    """Per seed of ``arm``: its final accuracy and the spread of its last fifth of evaluations."""
    out = []
    for seed, g in evals[evals["arm"] == arm].groupby("seed"):
        acc = g.sort_values("round")["test_accuracy"].to_numpy()
        tail = acc[-max(2, len(acc) // 5):]
        out.append({"seed": int(seed), "final": float(acc[-1]),
                    "spread": float(tail.max() - tail.min()), "evaluations": int(len(acc))})
    return out


def curves_table(ref_dir: pathlib.Path) -> str:
    """The per-seed curves (the figure `testbed.analysis.reference_figures` keeps) and, per arm,
    whether every seed reached its plateau: the last fifth of its evaluations within
    `PLATEAU_SPREAD`."""
    summary, evals = _summary(ref_dir), _evals(ref_dir)
    name = ref_dir.name
    rows = [f"![test accuracy, test loss and training loss per seed and round, the mean over "
            f"seeds thick](../../results/reference/{name}/{CURVES})", "",
            "| arm | seeds | final accuracy per seed (%) | last fifth's spread, widest (points) "
            "| plateau |", "|---|---|---|---|---|"]
    for arm in summary.get("arms_order") or sorted(evals["arm"].unique()):
        p = plateau(evals, arm)
        if not p:
            continue
        widest = max(s["spread"] for s in p)
        finals = ", ".join(f"{100 * s['final']:.2f}" for s in p)
        fewest = min(s["evaluations"] for s in p)
        verdict = (f"cannot tell ({fewest} evaluations a seed, fewer than {PLATEAU_MIN_EVALS})"
                   if fewest < PLATEAU_MIN_EVALS else
                   "yes" if widest <= PLATEAU_SPREAD else "no")
        rows.append(f"| {arm} | {len(p)} | {finals} | {100 * widest:.2f} | {verdict} |")
    return "\n".join(rows) + "\n"
