"""Regression check of a run's summary.json against a committed reference.

The reference file (e.g. results/reference/ci.json, declared in
`testbed.analysis.formats`) holds the reference figures and, next to them,
the tolerances they are guarded with:

    {"schema": 1, "figures": {"speedups.dblp_vs_static.burst_round": 2.9, ...},
     "tolerances": {"speedups.dblp_vs_static.burst_round":
                        {"rel": 0.25, "direction": "higher"}, ...},
     "runs": ["results/ci-1", ...], "spread": {...}, "shown": {...}, "note": "..."}

A figure regresses when it moves in the bad direction by more than its
tolerance (`rel`: a fraction of the reference value, `abs`: absolute units;
both given: the larger allowance wins). Only bad moves fail: a faster DBLP
is not a regression. Tolerances come from the measured run-to-run spread
of the runs the reference was made from (`make_reference`), never below a
floor, so that noise on a shared machine does not fail CI. Exit codes: 0
within tolerance, 1 a regression (ExperimentFailed), 2 a missing, malformed
or unknown-version file (InputError), always one line.
"""
from __future__ import annotations

import math
import statistics

import click

from testbed.analysis.formats import GUARDED, FormatError, read_reference, read_summary, write_reference
from testbed.errors import ExperimentFailed

# Shown side by side but not guarded (context for a human reading CI logs).
SHOWN = [
    "arms.static.burst_round_ms_p50", "arms.dblp.burst_round_ms_p50", "arms.gloo.burst_round_ms_p50",
    "arms.static.normal_round_ms_p50", "arms.dblp.normal_round_ms_p50",
    "speedups.dblp_vs_static.train_time", "speedups.dblp_vs_gloo.train_time",
    "arms.static.final_accuracy", "arms.gloo.final_accuracy", "bursts.count", "bursts.measured_loss",
]
# Tolerance = SPREAD_FACTOR x the relative run-to-run range, at least the floor.
SPREAD_FACTOR = 1.5


class CompareError(FormatError):
    """A file is missing or malformed, or the request makes no sense; one line naming it."""


class Regression(ExperimentFailed):
    """A guarded figure moved the bad way beyond its tolerance (exit 1)."""


def get(summary: dict, dotted: str):
    """summary['a']['b']... for 'a.b...' (arm names may contain dots' neighbours '-')."""
    cur = summary
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    if isinstance(cur, bool) or not isinstance(cur, (int, float)):
        return None
    return float(cur)


def compare(run, reference) -> tuple[bool, list[dict]]:
    """(passed, rows): one row per guarded or shown figure."""
    summary = read_summary(run)
    ref = read_reference(reference)
    rows, ok = [], True
    for key in sorted(ref["tolerances"]):
        t = ref["tolerances"][key]
        want, have = ref["figures"][key], get(summary, key)
        allow = max(abs(want) * t.get("rel", 0), t.get("abs", 0))
        if have is None or not math.isfinite(have):
            verdict, ok = "MISSING", False
        else:
            bad = (want - have) if t["direction"] == "higher" else (have - want)
            verdict = "REGRESSED" if bad > allow else "ok"
            ok = ok and verdict == "ok"
        rows.append({"figure": key, "reference": want, "run": have, "allowed": allow,
                     "direction": t["direction"], "verdict": verdict, "guarded": True})
    for key in SHOWN:
        if key in ref["tolerances"]:
            continue
        want, have = ref["shown"].get(key), get(summary, key)
        if want is None and have is None:
            continue
        rows.append({"figure": key, "reference": want, "run": have, "allowed": None,
                     "direction": None, "verdict": "", "guarded": False})
    return ok, rows


def format_table(rows: list[dict]) -> str:
    def f(x):
        return "–" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
    head = ["figure", "reference", "run", "tolerance", "verdict"]
    body = [[r["figure"] + ("" if r["guarded"] else " (shown)"), f(r["reference"]), f(r["run"]),
             (("+/-" if r["direction"] is None else ("-" if r["direction"] == "higher" else "+"))
              + f(r["allowed"])) if r["allowed"] is not None else "", r["verdict"]] for r in rows]
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w[i]) for i, c in enumerate(cells)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * n for n in w])] + [line(b) for b in body])


def make_reference(runs: list, out, guarded: dict | None = None) -> dict:
    """Write a reference from one or more runs: medians, tolerances from their spread."""
    guarded = guarded or GUARDED
    if not runs:
        raise CompareError("make reference: give at least one run directory")
    sums = [read_summary(r) for r in runs]
    figures, tolerances, spread = {}, {}, {}
    for key, g in guarded.items():
        vals = [v for v in (get(s, key) for s in sums) if v is not None and math.isfinite(v)]
        if not vals:
            raise CompareError(f"make reference: no run has figure '{key}'")
        med = statistics.median(vals)
        figures[key] = med
        rng = (max(vals) - min(vals))
        spread[key] = {"values": vals, "range": rng,
                       "max_over_min": max(vals) / min(vals) if min(vals) > 0 else None}
        t = {"direction": g["direction"]}
        if "floor_rel" in g:
            t["rel"] = max(g["floor_rel"], SPREAD_FACTOR * rng / abs(med) if med else 0.0)
        if "floor_abs" in g:
            t["abs"] = max(g["floor_abs"], SPREAD_FACTOR * rng)
        tolerances[key] = t
    shown = {k: get(sums[0], k) for k in SHOWN if get(sums[0], k) is not None}
    ref = {"figures": figures, "tolerances": tolerances, "spread": spread, "shown": shown,
           "runs": [str(r) for r in runs],
           "note": f"tolerance = max(floor, {SPREAD_FACTOR} x run-to-run range); "
                   "refresh with `dblp-testbed compare RUN [RUN...] --reference FILE --update`"}
    write_reference(out, ref)
    return ref


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--reference", "reference", required=True, type=click.Path(dir_okay=False),
              help="Reference JSON with 'figures' and 'tolerances' (e.g. results/reference/ci.json).")
@click.option("--update", is_flag=True,
              help="Write REFERENCE from the RUNS instead: medians as figures, "
                   "tolerances from their run-to-run spread.")
def compare_cmd(runs, reference, update):
    """Compare RUN's summary.json with a reference; exit 1 on a regression.

    Exit codes: 0 every guarded figure within tolerance, 1 a regression,
    2 a missing or malformed file.
    """
    if update:
        ref = make_reference(list(runs), reference)
        click.echo(f"wrote {reference} from {len(runs)} run(s)")
        for k in sorted(ref["figures"]):
            t = ref["tolerances"][k]
            tol = ", ".join(f"{n} {t[n]:.3g}" for n in ("rel", "abs") if n in t)
            sp = ref["spread"][k]
            mm = f", max/min {sp['max_over_min']:.3g}" if sp["max_over_min"] else ""
            click.echo(f"  {k} = {ref['figures'][k]:.4g} ({tol}; "
                       f"{len(sp['values'])} run(s){mm})")
        return
    if len(runs) != 1:
        raise CompareError("compare: give exactly one RUN (several only with --update)")
    ok, rows = compare(runs[0], reference)
    click.echo(format_table(rows))
    if not ok:
        bad = [r["figure"] for r in rows if r["guarded"] and r["verdict"] != "ok"]
        raise Regression(f"REGRESSION: {', '.join(bad)} beyond tolerance of {reference}")
    click.echo(f"ok: every guarded figure within tolerance of {reference}")
