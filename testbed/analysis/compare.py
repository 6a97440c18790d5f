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

A reference *directory* (``results/reference/NAME``, a run's kept files with
its summary.json) asks another question: does the run reproduce it? It does
when, for every claim and pair, the verdict's label is the reference's and
the run's point lies inside the reference's 95 % interval (`compare_verdicts`);
otherwise each line that differs says how, and by how much. Exit 1 when it
does not reproduce.
"""
from __future__ import annotations

import math
import pathlib
import statistics

import click

from testbed import output
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


class NotReproduced(ExperimentFailed):
    """A verdict's label or a point differs from a reference directory's (exit 1)."""


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


# ------------------------------------------------- against a reference directory --

def _outside(point: float, interval: dict, unit: str) -> str | None:
    """How far ``point`` lies outside ``interval``, in words; None when inside."""
    from testbed.analysis.answer import fmt, point_interval
    lo, hi = interval["lo"], interval["hi"]
    if lo <= point <= hi:
        return None
    side, by = ("above", point - hi) if point > hi else ("below", lo - point)
    return (f"point {fmt(point, unit)} {side} the reference's interval "
            f"{point_interval(interval, unit)} by {fmt(by, unit).lstrip('+')} "
            f"(difference from its point {_signed(point - interval['point'], unit)})")


def _signed(x: float, unit: str) -> str:
    from testbed.analysis.answer import fmt
    text = fmt(abs(x), unit).lstrip("+")
    return ("+" if x >= 0 else "-") + text


def _verdict_row(key: tuple, ref: dict | None, run: dict | None) -> dict:
    """One claim and pair of the reference or the run: same, or what differs and by how much."""
    claim, pair = key
    v = ref or run or {}
    unit = v.get("unit", "")
    diffs = []
    if run is None:
        diffs.append("not in the run (its arms did not run)")
    elif ref is None:
        diffs.append("not in the reference")
    else:
        if run["verdict"] != ref["verdict"]:
            diffs.append(f"verdict {run['verdict']}, the reference's {ref['verdict']}")
        if ref["interval"] and run["interval"]:
            far = _outside(run["interval"]["point"], ref["interval"], unit)
            if far:
                diffs.append(far)
        elif ref["interval"]:
            diffs.append(f"no point ({run['reason']})")
    return {"claim": claim, "pair": pair, "unit": unit,
            "reference": ref and {"verdict": ref["verdict"], "interval": ref["interval"]},
            "run": run and {"verdict": run["verdict"], "interval": run["interval"]},
            "same": not diffs, "differences": diffs}


def compare_verdicts(run, reference_dir) -> tuple[bool, list[dict], dict]:
    """(reproduces, rows, run summary): each claim and pair of the reference against the run's.

    Reproduces when every row is the same: the verdict's label the
    reference's and the run's point inside the reference's 95 % interval
    (a reference verdict without an interval: the label alone). A claim and
    pair only one side has is a difference.
    """
    summary = read_summary(run)
    ref = read_summary(reference_dir)
    if "verdicts" not in ref:
        raise CompareError(f"reference {reference_dir}: its summary (schema {ref['schema']}) has "
                           "no verdicts; remake it with `dblp-testbed reproduce NAME`")
    mine = {(v["claim"], v["pair"]): v for v in summary.get("verdicts", [])}
    theirs = {(v["claim"], v["pair"]): v for v in ref["verdicts"]}
    keys = list(theirs) + [k for k in mine if k not in theirs]
    rows = [_verdict_row(k, theirs.get(k), mine.get(k)) for k in keys]
    return all(r["same"] for r in rows), rows, summary


def format_verdict_rows(rows: list[dict]) -> list[str]:
    """One line per claim and pair: 'same' or 'DIFFERS' with what and by how much."""
    from testbed.analysis.answer import point_interval
    out = []
    for r in rows:
        pair = r["pair"] or "(no pair)"
        side = r["run"] or r["reference"]
        head = f"{r['claim']} {pair}: "
        if r["same"]:
            out.append(f"same     {head}{side['verdict']}, point "
                       f"{point_interval(side['interval'], r['unit'])}")
        else:
            out.append(f"DIFFERS  {head}" + "; ".join(r["differences"]))
    return out


def _compare_dir(run: str, reference: str, json_out: str | None) -> None:
    ok, rows, summary = compare_verdicts(run, reference)
    bad = summary.get("invalid_units", [])
    obj = {"run": run, "reference": reference, "reproduces": ok, "verdicts": rows,
           "invalid_units": bad}

    def text():
        for line in format_verdict_rows(rows):
            click.echo(line)
        if bad:
            click.echo(f"the run has {len(bad)} invalid unit(s), left out of its verdicts: "
                       + ", ".join(f"{u['arm']} s{u['seed']}" for u in bad))
        if ok:
            click.echo(f"reproduces {reference}: every verdict the same, every point inside the "
                       "reference's 95 % interval")
    output.results(obj, json_out, text)
    if not ok:
        differ = [f"{r['claim']} {r['pair'] or ''}".strip() for r in rows if not r["same"]]
        raise NotReproduced(f"does not reproduce {reference}: {len(differ)} of {len(rows)} "
                            f"verdict(s) differ ({', '.join(differ)})")


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
@click.option("--reference", "reference", required=True, type=click.Path(),
              help="Reference JSON with 'figures' and 'tolerances' (e.g. results/reference/ci.json), "
                   "or a reference directory (e.g. results/reference/default): does RUN "
                   "reproduce its verdicts?")
@click.option("--update", is_flag=True,
              help="Write REFERENCE (a JSON file) from the RUNS instead: medians as figures, "
                   "tolerances from their run-to-run spread.")
@output.json_option
def compare_cmd(runs, reference, update, json_out):
    """Compare RUN's summary.json with a reference; exit 1 on a regression.

    With a reference JSON file: every guarded figure within its tolerance.
    With a reference directory: every claim and pair's verdict the same as
    the reference's and the run's point inside the reference's 95 % interval
    (else a line per difference, naming it and by how much).

    Exit codes: 0 within tolerance / reproduces, 1 a regression / does not
    reproduce, 2 a missing or malformed file.
    """
    if pathlib.Path(reference).is_dir():
        if update:
            raise CompareError(f"compare --update writes a reference JSON file; {reference} is a "
                               "directory (reference directories are made by "
                               "`dblp-testbed reproduce NAME`)")
        if len(runs) != 1:
            raise CompareError("compare: give exactly one RUN")
        _compare_dir(runs[0], reference, json_out)
        return
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

    def text():
        click.echo(format_table(rows))
        if ok:
            click.echo(f"ok: every guarded figure within tolerance of {reference}")
    output.results({"run": runs[0], "reference": reference, "ok": ok, "figures": rows},
                   json_out, text)
    if not ok:
        bad = [r["figure"] for r in rows if r["guarded"] and r["verdict"] != "ok"]
        raise Regression(f"REGRESSION: {', '.join(bad)} beyond tolerance of {reference}")
