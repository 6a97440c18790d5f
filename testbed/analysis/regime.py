"""What a regime map says: each cell's speedups between the physics ratios, each arm over its bound.

Every cell of `dblp-testbed regime` (`testbed.run.regime`) is an ordinary
run, so its figures come from that run's own summary (`summary.json`) and
per-round table (`rounds.csv`): the burst-round speedup of each pair with
its interval over burst rounds, flagged and not reported when a
round-locked burst ran to its cap; each arm's burst-round latency over its
physical bound (`testbed.physics`). On top of that, per cell:

- the pair's place between the bandwidth-bound ratio (1-P_tight)/(1-P_loose)
  and the pass-bound ratio ln P_tight / ln P_loose, taken with the bounds
  the two arms actually used in their burst rounds (DBLP in a critical
  phase used P_low: no ratio applies);
- where an arm's burst rounds are more than ``BOUND_FACTOR`` x its bound and
  the emulator kept up (no fidelity flag), a breakdown of those rounds from
  the transport's own per-round record: the push until its STOP (with its
  data passes), the wait for the aggregate, and the pull;
- one sentence per cell on who wins and why, from the figures alone.

Files: ``regime-summary.json`` (``SCHEMA``), ``cells.csv`` (one row per
cell x pair), ``arms.csv`` (one row per cell x arm), ``report.md`` and the
heat-maps ``plots/regime-speedup.png`` and ``plots/regime-over-bound.png``.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pandas as pd

from testbed import physics as phys
from testbed.analysis import formats

#: Version of regime-summary.json.
#: 1: first version (cells with pairs, arms, breakdowns and sentences).
SCHEMA = 1
#: An arm further than this from its bound gets a breakdown of its burst rounds.
BOUND_FACTOR = 1.2
#: The pairs each cell compares, by control path: (arm, baseline).
#: The loose bound against the tight one is what DBLP gains in a burst it
#: meets relaxed (`testbed.run.regime`); the sharded bounds against gloo are
#: the transport against what PyTorch users run.
PAIRS = {"udp": (("static-high", "static"), ("static-high-sharded", "static-sharded"),
                 ("static-high-sharded", "gloo"), ("static-sharded", "gloo")),
         "tcp": (("static-high-tcp", "static-tcp"),)}
#: The paper's burst-round range (x).
PAPER_RANGE = (4.0, 5.9)


def _f(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _median(s: pd.Series) -> float | None:
    v = pd.to_numeric(s, errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else None


def breakdown(rounds: pd.DataFrame, arm: str) -> dict | None:
    """Where an arm's burst rounds went, medians over them (seconds; None: no transport record).

    ``push`` runs from the round's start to the last push STOP a worker got,
    ``wait`` from there to the first chunk of the aggregate (the server
    finishing the other workers' pushes), ``pull`` from that chunk to the
    pull's STOP. Passes are the most data passes any stream needed.
    """
    r = rounds[(rounds["arm"] == arm) & rounds["in_burst"].astype(bool)]
    if not len(r) or "stats_push_s" not in r:
        return None
    push = pd.to_numeric(r["stats_push_s"], errors="coerce")
    first = pd.to_numeric(r.get("stats_pull_first_s"), errors="coerce")
    stop = pd.to_numeric(r.get("stats_pull_stop_s"), errors="coerce")
    out = {"rounds": int(len(r)), "latency_s": _median(r["latency_ms"] / 1e3),
           "bound_s": _median(r["phys_bound_ms"] / 1e3), "push_s": _median(push),
           "wait_s": _median(first - push), "pull_s": _median(stop - first),
           "passes_push": _median(r.get("stats_passes_push", pd.Series(dtype=float))),
           "passes_pull": _median(r.get("stats_passes_pull", pd.Series(dtype=float))),
           "probes": _median(r.get("stats_probe_rounds", pd.Series(dtype=float))),
           "retransmitted": _median(r.get("stats_retransmitted", pd.Series(dtype=float)))}
    if out["push_s"] is None:
        return None
    return out


def _why(b: dict) -> str:
    """One sentence from a breakdown: the phase that took the time, and its passes."""
    parts = {"the push": b["push_s"], "waiting for the aggregate": b["wait_s"],
             "the pull": b["pull_s"]}
    known = {k: v for k, v in parts.items() if v is not None}
    if not known:
        return "no phase record"
    top = max(known, key=lambda k: known[k])
    lat = b["latency_s"] or sum(known.values())
    passes = b["passes_push"] if top == "the push" else b["passes_pull"] if top == "the pull" else None
    extra = f" over {passes:.0f} data passes" if passes else ""
    wait = b["wait_s"]
    waited = (f"wait {_s(wait)}" if wait is None or wait >= 0
              else f"the pull began {-wait:.2f} s before the last push STOP")
    return (f"{top} took {known[top]:.2f} s of {lat:.2f} s{extra} "
            f"(push {_s(b['push_s'])}, {waited}, pull {_s(b['pull_s'])}; "
            f"bound {_s(b['bound_s'])})")


def _s(x) -> str:
    return "–" if x is None else f"{x:.2f} s"


def _invalid_reasons(summary: dict, arm: str) -> list[str]:
    """What ``arm``'s units broke (summary invalid_units, "seed N: reason"); a summary from
    before the invariants decided (schema 1-3) has only its fidelity_flags."""
    if "invalid_units" in summary:
        return [f"seed {u['seed']}: {r}" for u in summary["invalid_units"] if u["arm"] == arm
                for r in u["reasons"]]
    return summary.get("fidelity_flags", {}).get(arm) or []


def _cell(out: pathlib.Path, name: str, run: dict) -> dict:
    cell = run["cell"]
    d = out / name
    base = {"name": name, **{k: cell[k] for k in ("duration", "p", "control", "target", "kind")},
            "status": run["status"], "wall_s": run.get("wall_s")}
    # "invalid": the run finished but some unit broke an invariant; its summary says which.
    if run["status"] not in ("ok", "invalid") or not (d / "summary.json").is_file():
        return {**base, "pairs": [], "arms": [], "sentence": f"did not finish ({run['status']})"}
    summary = json.loads((d / "summary.json").read_text())
    rounds = pd.read_csv(d / "rounds.csv") if (d / "rounds.csv").is_file() else pd.DataFrame()
    arms = []
    for arm in summary["arms_order"]:
        a = summary["arms"][arm]
        flags = _invalid_reasons(summary, arm)
        over = _f(a.get("burst_round_over_phys_bound"))
        capped = int((rounds["arm"].eq(arm) & rounds["in_burst"].astype(bool)
                      & rounds["burst_capped"].astype(bool)).sum()) if len(rounds) else 0
        relaxed = None
        if len(rounds):
            hit = rounds[rounds["arm"].eq(arm) & rounds["in_burst"].astype(bool) & rounds["phase"].notna()]
            if len(hit) and a["transport"] == "dblp":
                relaxed = float((hit["phase"] == "relaxed").mean())
        row = {"arm": arm, "transport": a["transport"], "status": a["status"],
               "burst_rounds": a["burst_rounds"], "burst_round_ms": _f(a.get("burst_round_ms_p50")),
               "bound_ms": _f(a.get("burst_round_phys_bound_ms_p50")), "over_bound": over,
               "loss_bound": _f(a.get("burst_round_bound_p50")), "relaxed_share": relaxed,
               "capped_rounds": capped, "fidelity_flags": flags,
               "emulator_kept_up": not flags, "breakdown": None, "why": None}
        if over is not None and over > BOUND_FACTOR and len(rounds):
            b = breakdown(rounds, arm)
            row["breakdown"] = b
            row["why"] = _why(b) if b else (
                "gloo is kernel TCP: its retransmission timeouts (200 ms at least, doubling "
                "while the burst lasts) are not in the transport's per-round record")
        arms.append(row)
    by_arm = {a["arm"]: a for a in arms}
    pairs = []
    for arm, basis in PAIRS.get(cell["control"], ()):
        sp = summary["speedups"].get(f"{arm}_vs_{basis}")
        if sp is None or arm not in by_arm or basis not in by_arm:
            continue
        ratio = _f(sp["burst_round"])
        warn = [w for w in sp.get("warnings", []) if "cap" in w]
        pt, pl = by_arm[basis]["loss_bound"], by_arm[arm]["loss_bound"]
        place = phys.place_speedup(ratio if ratio is not None else math.nan, pt, pl) \
            if pt is not None and pl is not None and 0 < pt < 1 and 0 < pl < 1 else None
        pairs.append({"arm": arm, "baseline": basis, "speedup": ratio,
                      "low": _f(sp.get("burst_round_low")), "high": _f(sp.get("burst_round_high")),
                      "n": sp.get("burst_round_n"), "capped": bool(warn),
                      "warning": warn[0] if warn else None,
                      "bandwidth_ratio": _f(place["bandwidth_ratio"]) if place else None,
                      "pass_ratio": _f(place["pass_ratio"]) if place else None,
                      "position": place["position"] if place else "no bound pair (reliable baseline)",
                      "in_paper_range": ratio is not None and PAPER_RANGE[0] <= ratio <= PAPER_RANGE[1]})
    cell_doc = {**base, "bursts": summary["bursts"]["count"],
                "measured_loss": _f(summary["bursts"].get("measured_loss")),
                "burst_ms": _f(summary["bursts"].get("actual_ms_p50")),
                "pairs": pairs, "arms": arms}
    cell_doc["sentence"] = sentence(cell_doc)
    return cell_doc


def sentence(cell: dict) -> str:
    """Who wins in this cell and why, from its own figures."""
    pairs = {(p["arm"], p["baseline"]): p for p in cell["pairs"]}
    bits = []
    for key, what in ((("static-high", "static"), "the loose bound beats the tight one"),
                      (("static-high-tcp", "static-tcp"), "the loose bound beats the tight one"),
                      (("static-high-sharded", "static-sharded"), "sharded, loose beats tight")):
        p = pairs.get(key)
        if p is None:
            continue
        if p["capped"]:
            bits.append(f"{what}: not reported, a round-locked burst ran to its cap")
            continue
        if p["speedup"] is None:
            continue
        s, bw = p["speedup"], p["bandwidth_ratio"]
        if bw is not None and s < 0.9 * bw:
            why = ("below the bandwidth ratio: what the burst takes away is about the same "
                   "time for both bounds, and it dilutes their ratio")
        elif bw is not None and s > 1.1 * bw:
            why = "above the bandwidth ratio: the tight bound paid for extra passes"
        else:
            why = "at the bandwidth ratio: the bytes through the burst decide"
        bits.append(f"{what} {s:.2f}x ({why})")
    for arm in ("static-high-sharded", "static-sharded"):
        g = pairs.get((arm, "gloo"))
        if g and g["speedup"] is not None and not g["capped"]:
            who = arm if g["speedup"] > 1 else "gloo"
            bits.append(f"{who} wins {arm} vs gloo ({g['speedup']:.2f}x)")
    far = [a["arm"] for a in cell["arms"] if a["over_bound"] is not None
           and a["over_bound"] > BOUND_FACTOR and a["emulator_kept_up"]]
    if far:
        bits.append(f"over {BOUND_FACTOR}x of the bound: {', '.join(far)}")
    return "; ".join(bits) if bits else "no figures"


def analyse(out: pathlib.Path, plan: dict) -> dict:
    cells = [_cell(out, name, run) for name, run in plan["runs"].items()]
    order = {c["name"]: i for i, c in enumerate(plan["cells"])}
    cells.sort(key=lambda c: order.get(c["name"], len(order)))
    walls = [c["wall_s"] for c in cells if c["wall_s"]]
    n_all = len(plan["cells"])
    per_cell = float(np.mean(walls)) if walls else None
    return {"schema": SCHEMA, "map": plan["map"], "preset": plan["preset"],
            "seeds": plan["seeds"], "cap_ms": plan["cap_ms"], "arms": plan["arms"],
            "wall_s": float(sum(walls)) if walls else None, "cells_run": len(cells),
            "cells_declared": n_all, "wall_s_per_cell": per_cell,
            "paper_range": list(PAPER_RANGE), "bound_factor": BOUND_FACTOR,
            "in_paper_range": [f"{c['name']}: {p['arm']} vs {p['baseline']}" for c in cells
                               for p in c["pairs"] if p["in_paper_range"]],
            "cells": cells}


def cells_table(doc: dict) -> pd.DataFrame:
    rows = []
    for c in doc["cells"]:
        for p in c["pairs"]:
            rows.append({"cell": c["name"], "duration": c["duration"], "p": c["p"],
                         "control": c["control"], "target": c["target"], "kind": c["kind"],
                         **{k: p[k] for k in ("arm", "baseline", "speedup", "low", "high", "capped",
                                              "bandwidth_ratio", "pass_ratio", "position")}})
    return pd.DataFrame(rows)


def arms_table(doc: dict) -> pd.DataFrame:
    rows = []
    for c in doc["cells"]:
        for a in c["arms"]:
            rows.append({"cell": c["name"], **{k: a[k] for k in (
                "arm", "burst_rounds", "burst_round_ms", "bound_ms", "over_bound", "loss_bound",
                "relaxed_share", "capped_rounds", "emulator_kept_up", "why")}})
    return pd.DataFrame(rows)


def _x(v, fmt="{:.2f}x") -> str:
    return "–" if v is None else fmt.format(v)


def markdown(doc: dict) -> str:
    """The map's table: one row per cell, the pairs' speedups and each arm over its bound."""
    lines = ["| cell | bursts (measured loss) | loose vs tight (PS) | loose vs tight (sharded) "
             "| loose sharded vs gloo | tight sharded vs gloo | envelope (bandwidth–pass) "
             "| arms over bound |",
             "|---|---|---|---|---|---|---|---|"]
    for c in doc["cells"]:
        pairs = {(p["arm"].replace("-tcp", ""), p["baseline"].replace("-tcp", "")): p for p in c["pairs"]}

        def sp(key, pairs=pairs):
            p = pairs.get(key)
            if p is None:
                return "–"
            if p["capped"]:
                return "capped"
            if p["speedup"] is None:
                return "–"
            return f"{p['speedup']:.2f}x [{_x(p['low'], '{:.2f}')}, {_x(p['high'], '{:.2f}')}]"
        env = pairs.get(("static-high", "static"))
        envelope = f"{_x(env['bandwidth_ratio'])}–{_x(env['pass_ratio'])}" if env else "–"
        over = ", ".join(f"{a['arm']} {_x(a['over_bound'])}" + ("" if a["emulator_kept_up"] else "†")
                         for a in c["arms"])
        loss = "–" if c.get("measured_loss") is None else f"{c['measured_loss']:.0%}"
        lines.append(f"| {c['name']} | {c.get('bursts', '–')} ({loss}) | "
                     f"{sp(('static-high', 'static'))} | "
                     f"{sp(('static-high-sharded', 'static-sharded'))} | "
                     f"{sp(('static-high-sharded', 'gloo'))} | {sp(('static-sharded', 'gloo'))} | "
                     f"{envelope} | {over} |")
    return "\n".join(lines)


def sentences(doc: dict) -> str:
    return "\n".join(f"- **{c['name']}**: {c['sentence']}." for c in doc["cells"])


def breakdowns(doc: dict) -> str:
    rows = [f"- {c['name']}, {a['arm']} ({_x(a['over_bound'])} its bound): {a['why']}."
            for c in doc["cells"] for a in c["arms"] if a["why"]]
    return "\n".join(rows) if rows else "- every arm within the factor of its bound."


def wall_sentence(doc: dict) -> str:
    """How long the map took, and what the full map would take at the same pace (an estimate)."""
    wall, per = doc["wall_s"], doc["wall_s_per_cell"]
    if wall is None:
        return f"{doc['cells_run']} of {doc['cells_declared']} cells; no wall time recorded."
    return (f"{doc['cells_run']} of {doc['cells_declared']} cells of map `{doc['map']}` in "
            f"{wall / 60:.1f} min ({per / 60:.1f} min per cell, every cell's runs one after "
            f"another; the round-locked cap is {doc['cap_ms']:.0f} ms).")


def text(doc: dict) -> str:
    lines = [f"# Regime map `{doc['map']}` ({doc['preset']} preset, {doc['seeds']} seed(s), "
             f"round-locked cap {doc['cap_ms']:.0f} ms)", "", wall_sentence(doc), "",
             markdown(doc), "", "† the run's fidelity check flagged the arm (the emulator fell "
             "behind): its figures are not held to the bound.", "", "## Who wins, and why", "",
             sentences(doc), "", f"## Arms further than {BOUND_FACTOR}x from their bound", "",
             breakdowns(doc)]
    if doc["in_paper_range"]:
        lines += ["", f"In the paper's {PAPER_RANGE[0]}-{PAPER_RANGE[1]}x: "
                  + "; ".join(doc["in_paper_range"]) + "."]
    else:
        lines += ["", f"No pair reached the paper's {PAPER_RANGE[0]}-{PAPER_RANGE[1]}x in this map."]
    return "\n".join(lines)


def write(out: pathlib.Path, plan: dict) -> dict:
    """Analyse the finished cells and write the summary, tables, report and heat-maps."""
    from testbed.analysis import study_plots

    out = pathlib.Path(out)
    doc = analyse(out, plan)
    (out / "regime-summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    cells_table(doc).to_csv(out / "cells.csv", index=False)
    arms_table(doc).to_csv(out / "arms.csv", index=False)
    (out / "plots").mkdir(exist_ok=True)
    study_plots.regime_speedup(doc, out / "plots" / "regime-speedup.png")
    study_plots.regime_over_bound(doc, out / "plots" / "regime-over-bound.png")
    (out / "report.md").write_text(text(doc) + "\n")
    return doc


def read_summary(out: pathlib.Path) -> dict:
    """regime-summary.json, refusing a version this code does not know (one line)."""
    rebuild = f"rebuild it (`dblp-testbed regime NAME --report-only --out {out}`)"
    return formats.read_versioned(pathlib.Path(out) / "regime-summary.json", SCHEMA, rebuild, rebuild)
