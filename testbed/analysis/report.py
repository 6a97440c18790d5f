"""The pipeline's last stage for people: plots/ and report.md/html from the summary and tables.

`write` is called by `testbed.analysis.pipeline.write_outputs` after the
tables and summary.json are on disk; it reads nothing but what it is given,
so the report can never disagree with summary.json. report.html is
self-contained (the plots embedded), report.md links plots/.
"""
from __future__ import annotations

import base64
import html
import json
import math
import pathlib

from testbed.analysis.claims import PAPER_FIGURES
from testbed.invariants import INVARIANTS


def write(run_dir: pathlib.Path, summary: dict, t) -> list[pathlib.Path]:
    """plots/*.png, report.md and report.html of ``t`` (a `pipeline.Tables`); the plots' paths."""
    from testbed.analysis import plots  # matplotlib: only when drawing

    arms = t.raw.arms
    pngs = plots.all_plots(run_dir / "plots", t.rounds, t.bursts, t.flows, t.evals, summary,
                           arms, t.bottleneck, t.queue)
    phased = [a for a in arms if summary["arms"][a].get("phase_switches") is not None]
    if phased:
        pngs.append(plots.phase_timeline(t.rounds, phased, run_dir / "plots" / "phase_timeline.png"))
    pngs.append(plots.forest(summary, run_dir / "plots" / "intervals.png"))
    sections = _sections(summary, t.rounds, t.bursts)
    (run_dir / "report.md").write_text(render_md(sections, pngs, run_dir))
    (run_dir / "report.html").write_text(render_html(sections, pngs))
    return pngs


def summary_lines(s: dict) -> list[str]:
    """What `dblp-testbed report` prints of a summary: DBLP's speedups and the warnings (the
    run's answer, `testbed.analysis.answer`, follows them)."""
    out = []
    for key, sp in sorted(s["speedups"].items()):
        if s["arms"][sp["arm"]]["transport"] == "dblp":
            out.append(f"  {key}: burst-round {_f(sp['burst_round'], '{:.2f}x', 'n/a')}, "
                       f"train time {_f(sp['train_time'], '{:.2f}x', 'n/a')}")
    out += [f"  warning: {w}" for w in s["warnings"]]
    return out


# ------------------------------------------------------------- rendering --

def _f(x, fmt="{:.2f}", none="–"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


_UNIT_FMT = {"x": "{:.2f}x", "%": "{:.1f} %", "points": "{:+.2f} pt"}


def _iv(interval: dict | None, unit: str, reason: str | None = None) -> str:
    """'point [lo, hi]' in the figure's unit; no interval: the reason, shortened."""
    if not interval:
        return f"– ({reason})" if reason else "–"
    f = _UNIT_FMT.get(unit, "{:.3g}")
    return f"{f.format(interval['point'])} [{f.format(interval['lo'])}, {f.format(interval['hi'])}]"


def _region(region: list, unit: str) -> str:
    lo, hi = region
    f = _UNIT_FMT.get(unit, "{:.3g}")
    if hi is None:
        return f">= {f.format(lo)}"
    if lo is None:
        return f"<= {f.format(hi)}"
    return f"{f.format(lo)} to {f.format(hi)}"


def _verdict_cell(v: dict) -> str:
    """Reproduced and refuted shout; unresolved and not judged (with its cause) do not."""
    from testbed.analysis.answer import verdict_label
    return v["verdict"].upper() if v["verdict"] in ("reproduced", "refuted") else verdict_label(v)


def _verdict_section(s: dict) -> dict:
    """The paper's claims, each judged from its interval (claims.py): the report's first answer."""
    from testbed.analysis.answer import paper_cell
    rows = []
    for v in s.get("verdicts", []):
        iv = v["interval"]
        rows.append([v["claim"], v["pair"] or "–", paper_cell(v), _region(v["region"], v["unit"]),
                     _iv(iv, v["unit"]), str(iv["n_seeds"]) if iv else "–",
                     _verdict_cell(v), v["reason"]])
    claims = {v["claim"]: v for v in s.get("verdicts", [])}
    return {"title": "Verdicts on the paper's claims",
            "text": ["Reproduced when the whole 95 % interval lies inside the claim's region, "
                     "refuted when it lies wholly outside, unresolved otherwise (or when there "
                     "is no interval: the reason says why; \"too few seeds\" for the accuracy "
                     "difference, one value per seed, with an estimate of the seeds that would "
                     "settle it), not judged when every seed of the pair has an invalid unit (the "
                     "emulator broke an invariant). Never from a point estimate. Intervals of "
                     "rounds: hierarchical bootstrap, seeds then rounds within each seed (one "
                     "seed: rounds only, blind to seed-to-seed spread); the accuracy difference: "
                     "Student's t over the paired seeds; both over the seeds whose units of both "
                     "arms are valid.",
                     *(f"{name}: {v['what']}. Region: {v['region_why']}."
                       for name, v in claims.items())],
            "tables": [(["claim", "pair", "paper", "region", "measured [95 % interval]", "seeds",
                         "verdict", "why"], rows)] if rows else []}


def _invalid_section(s: dict) -> dict:
    """The units that broke an invariant: in the tables, marked, and in no figure or verdict."""
    rows = [[u["arm"], str(u["seed"]), "; ".join(u["reasons"])] for u in s.get("invalid_units", [])]
    limits = ", ".join(f"{i.name} {'at most' if i.most else 'at least'} {100 * i.limit:g} %"
                       for i in INVARIANTS.values())
    return {"title": f"Invalid units ({len(rows)})",
            "text": ["A unit (an arm with one seed) counts only while the emulator kept its "
                     f"invariants ({limits}; testbed/invariants.py). An invalid unit's rows stay "
                     "in rounds and evals (valid false) and are left out of every per-arm "
                     "figure, speedup, interval and verdict above and below."]
            + ([] if rows else ["None: every unit kept every invariant its record measured."]),
            "tables": [(["arm", "seed", "invariants broken"], rows)] if rows else []}


def _intervals_section(s: dict) -> dict:
    """Every compared pair's figures with intervals, and each arm's time to the target."""
    names = list(next(iter(s.get("intervals", {}).values()), {"figures": {}})["figures"])
    rows = []
    for key, p in s.get("intervals", {}).items():
        figs = p["figures"]
        rows.append([key, p["comparison"]] + [_iv(figs[n]["interval"], figs[n]["unit"],
                                                  figs[n]["reason"]) for n in names]
                    + [str(max((f["interval"]["n_seeds"] for f in figs.values() if f["interval"]),
                               default=0))])
    text = [f"{c}: {w}." for c, w in dict((p["comparison"], p["what"])
                                           for p in s.get("intervals", {}).values()).items()]
    text.append("burst_speedup: baseline's burst-round median / the arm's (pooled over seeds, "
                "hierarchical bootstrap); the others have one value per seed and a Student t "
                "interval over the seeds: train_time_cut: 100 x (1 - arm's / baseline's summed "
                "round windows), the mean of the seeds' cuts; accuracy_delta: final accuracy, "
                "arm - baseline, in points; time_to_target: baseline's / the arm's wall time to "
                "the target accuracy, the geometric mean over the seeds where both reached it.")
    tables = [(["pair", "comparison"] + names + ["seeds"], rows)] if rows else []
    ttt = s.get("time_to_target")
    if ttt:
        text.append(f"Time to target: {ttt['metric']} >= "
                    f"{_f(ttt['target'], '{:.4f}')} ({ttt['source']}).")
        tables.append((["arm", "seeds reached / run", "median s", "per seed s"],
                       [[arm, f"{t['reached']}/{t['runs']}", _f(t["t_s_median"]),
                         ", ".join(f"{k}: {_f(v)}" for k, v in t["t_s"].items())]
                        for arm, t in ttt["per_arm"].items()]))
    return {"title": "Figures with 95 % intervals", "text": text, "tables": tables}


def _sections(s: dict, rounds, bursts) -> list[dict]:
    arms = s["arms_order"]
    a = s["arms"]
    sec = []
    sec.append({"title": f"Run {s['name']}: status {s['status']}",
                "text": [f"Arms: {', '.join(arms)}. Baselines (every arm whose transport is not "
                         f"dblp): {', '.join(s['baselines']) or 'none'}. Speedup = baseline / arm "
                         "(> 1: the arm is faster). Latency = critical-path communication time "
                         "of a round; a burst round is one whose window overlaps a burst window."],
                "tables": []})
    sec.append(_verdict_section(s))
    sec.append(_invalid_section(s))
    sec.append(_intervals_section(s))
    # Paper-style table.
    dblp_arms = [x for x in arms if a[x]["transport"] == "dblp"]
    head = ["arm", "burst p50 ms", "burst max ms", "normal p50 ms", "train s", "final acc"]
    for d in dblp_arms:
        head += [f"{d} burst speedup", "95 % interval", f"{d} train-time cut",
                 "95 % interval (round windows)"]
    rows = []
    for arm in arms:
        row = [arm, _f(a[arm]["burst_round_ms_p50"]), _f(a[arm]["burst_round_ms_max"]),
               _f(a[arm]["normal_round_ms_p50"]), _f(a[arm]["train_time_s"]),
               _f(a[arm]["final_accuracy"], "{:.4f}")]
        for d in dblp_arms:
            sp = s["speedups"].get(f"{d}_vs_{arm}")
            figs = s.get("intervals", {}).get(f"{d}_vs_{arm}", {}).get("figures", {})
            row += [_f(sp["burst_round"], "{:.2f}x") if sp else "",
                    _iv(figs["burst_speedup"]["interval"], "x") if figs else "",
                    _f(sp["train_time_reduction_pct"], "{:.1f} %") if sp else "",
                    _iv(figs["train_time_cut"]["interval"], "%") if figs else ""]
        rows.append(row)
    fig = PAPER_FIGURES
    lo, hi = fig["burst_round_speedup_range"]
    paper = ["paper (DBLP vs MLT-style static)", "", "", "", "",
             f"within ~{fig['accuracy_delta_points']} pt"]
    for _ in dblp_arms:
        paper += [f"up to {fig['burst_round_speedup_max']}x ({lo}-{hi}x)", "",
                  f"{fig['train_time_reduction_pct_mean']} % mean, "
                  f"{fig['train_time_reduction_pct_max']} % max", ""]
    rows.append(paper)
    sec.append({"title": "Paper-style table", "tables": [(head, rows)],
                "text": ["Speedup columns: the DBLP arm's burst-round p50 speedup over the "
                         "row's arm and the cut in end-to-end training time against it (the "
                         "workers' train_time_s), each beside its 95 % interval where the pair "
                         "is compared (the cut's interval is of the summed round windows, "
                         "which decompose into rounds the bootstrap can resample). The "
                         "last row is the paper's figures (arXiv 2605.01989), not a measurement."]})
    # Speedups with spread.
    rows = []
    for key in sorted(s["speedups"]):
        sp = s["speedups"][key]
        fig = s.get("intervals", {}).get(key, {}).get("figures", {}).get("burst_speedup")
        rows.append([sp["arm"], sp["baseline"], _f(sp["burst_round"], "{:.2f}x"),
                     _iv(fig["interval"], "x") if fig else "",
                     f"{_f(sp['burst_round_low'])}-{_f(sp['burst_round_high'])}",
                     _f(sp["burst_round_spread"]), "/".join(str(n) for n in sp["burst_round_n"]),
                     _f(sp["normal_round"], "{:.2f}x"), _f(sp["train_time"], "{:.2f}x"),
                     _f(sp["accuracy_delta"], "{:+.4f}"), "; ".join(sp["warnings"])])
    sec.append({"title": "Speedups of every arm against every baseline",
                "tables": [(["arm", "baseline", "burst-round", "95 % interval", "quartile range",
                             "spread",
                             "n (arm/base)", "normal-round", "train time", "accuracy delta",
                             "warning"], rows)], "text": []})
    # Physics.
    ph = s["physics"]
    text = []
    if ph["inputs"]:
        i = ph["inputs"]
        text.append(f"Inputs: bottleneck {i['rate_bps'] / 1e6:.3g} Mbit/s, RTT "
                    f"{i['rtt_s'] * 1e3:.3g} ms, {i['grad_bytes']:.0f} gradient bytes x "
                    f"{i['flows']} flows through the bottleneck, base loss {i['base_loss']}. "
                    "Bound = bytes (1-P)/(1-p) at line rate + the average's return at line "
                    "rate + ceil(ln P / ln p) passes x RTT; no transport with bound P can beat it. "
                    "Sharded arms (no server, rank 0 on the server's host): bytes = "
                    "2 (N-1)/N x the gradient into rank 0, all through the bottleneck.")
    else:
        text.append("No physical bound: missing " + ", ".join(ph["missing_inputs"]) + ".")
    rows = []
    for arm in arms:
        if a[arm]["transport"] in ("dblp", "static"):
            rows.append([arm, _f(a[arm]["burst_round_bound_p50"], "{:.3f}"),
                         _f(a[arm]["burst_round_ms_p50"]), _f(a[arm]["burst_round_phys_bound_ms_p50"]),
                         _f(a[arm]["burst_round_over_phys_bound"], "{:.2f}x")])
    tables = [(["arm", "P in burst rounds", "burst p50 ms", "bound p50 ms", "p50 / bound"], rows)]
    for key, pl in sorted(ph["pairs"].items()):
        text.append(f"{key}: measured burst-round speedup {_f(pl['speedup'])}x with P_low "
                    f"{_f(pl['p_low'], '{:.3f}')} and P_high {_f(pl['p_high'], '{:.3f}')}; "
                    f"bandwidth-bound ratio {_f(pl['bandwidth_ratio'])}x, pass-bound ratio "
                    f"{_f(pl['pass_ratio'])}x: {pl['position'] or 'not placeable'}"
                    + (f" (fraction {_f(pl['fraction'])} of the way)" if pl["fraction"] is not None else "")
                    + (f"; the paper reports up to {PAPER_FIGURES['burst_round_speedup_max']}x, "
                       f"this is {pl['speedup'] / PAPER_FIGURES['burst_round_speedup_max']:.0%} of it"
                       if pl["speedup"] else "")
                    + (f". Over the {pl['relaxed_rounds']} burst round(s) DBLP met in its relaxed "
                       f"phase only: {_f(pl.get('speedup_relaxed_rounds'))}x"
                       if pl.get("relaxed_rounds") else "") + ".")
    if len(ph["pairs"]) > 1:
        text.append("Several control paths ran (the paper used TCP control): compare their "
                    "positions above. Expensive passes (a lost TCP control segment costs a "
                    "retransmission timeout) push the speedup towards the pass-bound ratio, "
                    "cheap passes towards the bandwidth-bound ratio.")
    br = rounds[rounds["in_burst"]] if len(rounds) else rounds
    rows = [[r.arm, r.round, r.burst_id, _f(r.phys_loss, "{:.3f}"), _f(r.bound, "{:.3f}"),
             r.phase if isinstance(r.phase, str) else "–", _f(r.latency_ms), _f(r.phys_bound_ms),
             _f(r.latency_over_bound, "{:.2f}x")]
            for r in br.itertuples(index=False)]
    tables.append((["arm", "round", "burst", "loss p", "bound P", "phase", "latency ms",
                    "bound ms", "latency / bound"], rows))
    sec.append({"title": "Physics: how close each arm came to what the network allows",
                "text": text, "tables": tables})
    # Bursts.
    rows = [[b.arm, b.id, str(b.round), _f(b.requested_loss, "{:.2f}"), _f(b.measured_loss, "{:.3f}"),
             str(b.dropped_packets), _f(b.seen_packets, "{:.0f}"), _f(b.received_packets, "{:.0f}"),
             _f(b.requested_ms),
             _f(b.actual_ms), _f(b.start_delay_ms), str(b.rounds_hit)]
            for b in bursts.itertuples(index=False)]
    sec.append({"title": f"Bursts ({s['bursts']['count']})",
                "text": ["Measured loss = packets the controller's loss rule dropped / packets "
                         "it saw; without those counters, dropped / (dropped + packets the "
                         "target's capture received in the burst window)."],
                "tables": [(["arm", "id", "round", "requested p", "measured p", "dropped",
                             "seen", "received (capture)", "requested ms", "actual ms", "start delay ms",
                             "rounds hit"], rows)]})
    # Packets.
    rows = []
    for arm, dirs in sorted(s["packets"].items()):
        for d, v in sorted(dirs.items()):
            rows.append([arm, d] + [_f(v[c], "{:.0f}") for c in
                                    ("sent_packets", "control_packets", "sent_bytes",
                                     "recv_packets", "retransmissions", "drops")])
    sec.append({"title": "Packets (from the captures)",
                "text": ["Direction: push = to the aggregation server, pull = from it (its "
                         "control replies included), peer = between workers. Sent: packets the "
                         "captured hosts transmitted; received: packets the captured hosts "
                         "received; drops: sent minus received on flows captured at both ends "
                         "only (flows.csv has them per round and flow)."]
                if rows else ["No captures in raw/."],
                "tables": [(["arm", "direction", "sent pkts", "of which control", "sent bytes",
                             "recv pkts", "retransmissions", "drops (both ends captured)"], rows)]
                if rows else []})
    fid = [[arm, json.dumps(v, sort_keys=True)] for arm, v in s["fidelity"].items() if v]
    if fid:
        sec.append({"title": "Per-arm run record (manifest: fidelity checks, exit state)",
                    "text": [], "tables": [(["arm", "record"], fid)]})
    rows = [[t["target"], _f(t["value"], "{:.3g}"),
             {True: "met", False: "MISSED", None: "not measurable"}[t["met"]]] for t in s["targets"]]
    if rows:
        sec.append({"title": "Targets (default run)", "tables": [(["target", "value", "verdict"], rows)],
                    "text": ["Values: bound factor = burst p50 / physical bound; speedups are "
                             "ratios; accuracy in points (DBLP minus static). Where a target is "
                             "missed, the physics and fidelity sections say why."]})
    sec.append({"title": "Warnings", "text": [w for w in s["warnings"]] or ["none"], "tables": []})
    return sec


def render_md(sections: list[dict], pngs, run_dir: pathlib.Path) -> str:
    out = []
    for i, sec in enumerate(sections):
        out.append(("# " if i == 0 else "## ") + sec["title"])
        out.append("")
        for t in sec["text"]:
            out += [("- " + t) if sec["title"] == "Warnings" else t, ""]
        for head, rows in sec["tables"]:
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            for r in rows:
                out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
            out.append("")
    out.append("## Plots")
    out.append("")
    for p in pngs:
        rel = pathlib.Path(p).relative_to(run_dir)
        out += [f"![{rel.stem}]({rel.as_posix()})", ""]
    return "\n".join(out)


def render_html(sections: list[dict], pngs) -> str:
    """Self-contained: the PNGs are embedded as data URIs, no external files."""
    e = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{e(sections[0]['title'])}</title>",
           "<style>body{font-family:sans-serif;max-width:1100px;margin:1em auto}"
           "table{border-collapse:collapse;margin:.5em 0;font-size:13px}"
           "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
           "th{background:#eee}td:first-child{text-align:left}img{max-width:100%}</style>",
           "</head><body>"]
    for i, sec in enumerate(sections):
        out.append(f"<h{1 if i == 0 else 2}>{e(sec['title'])}</h{1 if i == 0 else 2}>")
        for t in sec["text"]:
            out.append(f"<p>{e(t)}</p>")
        for head, rows in sec["tables"]:
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for r in rows:
                out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>")
            out.append("</table>")
    out.append("<h2>Plots</h2>")
    for p in pngs:
        data = base64.b64encode(pathlib.Path(p).read_bytes()).decode()
        out.append(f"<p><img alt='{e(pathlib.Path(p).stem)}' src='data:image/png;base64,{data}'></p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
