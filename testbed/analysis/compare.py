"""Regression check of a run's summary.json against a committed reference.

The reference file (e.g. results/reference/ci.json, declared in
`testbed.analysis.formats`) holds the reference figures and, next to them,
the tolerances they are guarded with:

    {"schema": 2, "figures": {"speedups.dblp_vs_static.burst_round": 1.3, ...},
     "tolerances": {"speedups.dblp_vs_static.burst_round":
                        {"rel": 0.05, "direction": "higher"}, ...},
     "runs": [...], "summaries": ["results/reference/ci-runs/1/summary.json", ...],
     "commit": "<git revision>", "spread": {...}, "shown": {...}, "method": "...", "note": "..."}

A figure regresses when it moves in the bad direction by more than its
tolerance (`rel`: a fraction of the reference value, `abs`: absolute units;
both given: the larger allowance wins). Only bad moves fail: a faster DBLP
is not a regression. Tolerances are one-sided and come from the spread of
at least five runs of the reference's commit (`make_reference`): the bad
move one new run of the same code exceeds with 1 % probability (Student's t
prediction bound), never below a floor of 5 % (accuracy: 2 points), so
noise on this kind of machine does not fail CI while a 10 % slowdown does.
A run with an invalid unit (one the emulator's invariants flag: CPU busy,
steal, a broken link or pacing figure) is not judged: its figures decide
nothing. Exit codes: 0 within tolerance, 1 a regression (ExperimentFailed),
2 a missing, malformed or unknown-version file, or a run that cannot be
judged (InputError), always one line.

``--arm NAME`` judges arm NAME in dblp's place (its figures under the
reference's ``arms.dblp`` and ``speedups.dblp_vs_*`` keys): the CI test
runs DBLP's deliberately slowed twin (``dblp-slowed``) beside it in the
same run and shows that the twin fails.

A reference *directory* (``results/reference/NAME``, a run's kept files with
its summary.json) asks another question: is the run consistent with it?
It is when no claim and pair contradicts the reference (`compare_verdicts`):
two decisive verdicts (reproduced, refuted) carry the same label, and
wherever either side is unresolved the two 95 % intervals overlap (a row
"consistent, underpowered", with about how many seeds would decide). It
fails only on contradictions: reproduced against refuted, intervals that
share no value, a claim only one side judged. Exit 1 on a contradiction.
"""
from __future__ import annotations

import json
import math
import pathlib
import shutil
import statistics

import click

from testbed import output
from testbed.analysis import provenance
from testbed.analysis.formats import (
    ANSWER_SCHEMA,
    GUARDED,
    MIN_REFERENCE_RUNS,
    FormatError,
    check_answer,
    read_reference,
    read_summary,
    write_reference,
)
from testbed.errors import ExperimentFailed

# Shown side by side but not guarded (context for a human reading CI logs).
SHOWN = [
    "arms.static.burst_round_ms_p50", "arms.dblp.burst_round_ms_p50", "arms.gloo.burst_round_ms_p50",
    "arms.static.normal_round_ms_p50", "arms.dblp.normal_round_ms_p50",
    "arms.dblp.burst_round_phys_bound_ms_p50", "arms.dblp.normal_round_phys_bound_ms_p50",
    "speedups.dblp_vs_static.normal_round", "speedups.dblp_vs_gloo.normal_round",
    "speedups.dblp_vs_static.train_time", "speedups.dblp_vs_gloo.train_time",
    "arms.static.final_accuracy", "arms.gloo.final_accuracy", "bursts.count", "bursts.measured_loss",
]
#: One-sided probability that one new run of unchanged code exceeds its tolerance
#: (per guarded figure): the false-alarm rate the spread allows.
FALSE_ALARM = 0.01
#: The arm whose figures the reference's keys name.
GUARDED_ARM = "dblp"


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


def as_arm(key: str, arm: str) -> str:
    """A reference key about dblp, read for ``arm`` instead ("arms.dblp.x" -> "arms.<arm>.x")."""
    if arm == GUARDED_ARM:
        return key
    prefix = f"arms.{GUARDED_ARM}."
    if key.startswith(prefix):
        return f"arms.{arm}." + key[len(prefix):]
    prefix = f"speedups.{GUARDED_ARM}_vs_"
    if key.startswith(prefix):
        return f"speedups.{arm}_vs_" + key[len(prefix):]
    return key


def judgeable(summary: dict, run) -> None:
    """CompareError unless every unit of the run is valid (a flagged unit decides nothing)."""
    if summary.get("schema", 0) < 4:
        raise CompareError(f"{run}: its summary (schema {summary.get('schema')}) predates the "
                           "emulator's invariants, so its units' fidelity is unknown; re-run it")
    bad = summary.get("invalid_units") or []
    if bad:
        units = "; ".join(f"{u['arm']} seed {u['seed']}: {', '.join(u['reasons'])}" for u in bad)
        raise CompareError(f"{run}: not judged: {len(bad)} unit(s) broke the emulator's "
                           f"invariants ({units}); re-run it on an idle machine")


def compare(run, reference, arm: str = GUARDED_ARM) -> tuple[bool, list[dict]]:
    """(passed, rows): one row per guarded or shown figure, ``arm`` judged in dblp's place."""
    summary = read_summary(run)
    ref = read_reference(reference)
    judgeable(summary, run)
    if arm not in summary["arms"]:
        raise CompareError(f"{run}: no arm {arm!r} to judge (it ran {', '.join(summary['arms'])})")
    rows, ok = [], True
    for key in sorted(ref["tolerances"]):
        t = ref["tolerances"][key]
        want, have = ref["figures"][key], get(summary, as_arm(key, arm))
        allow = max(abs(want) * t.get("rel", 0), t.get("abs", 0))
        if have is None or not math.isfinite(have):
            verdict, ok = "MISSING", False
        else:
            bad = (want - have) if t["direction"] == "higher" else (have - want)
            verdict = "REGRESSED" if bad > allow else "ok"
            ok = ok and verdict == "ok"
        rows.append({"figure": as_arm(key, arm), "reference": want, "run": have, "allowed": allow,
                     "direction": t["direction"], "verdict": verdict, "guarded": True,
                     "tolerance": {k: t[k] for k in ("rel", "abs") if k in t}})
    for key in SHOWN:
        if key in ref["tolerances"]:
            continue
        want, have = ref["shown"].get(key), get(summary, as_arm(key, arm))
        if want is None and have is None:
            continue
        rows.append({"figure": as_arm(key, arm), "reference": want, "run": have, "allowed": None,
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


#: A row's status: the same verdict; no contradiction, but a side that could not decide; or a
#: contradiction (labels that cannot both hold, intervals that share no value, a side missing).
SAME, UNDERPOWERED, DIFFERS = "same", "consistent, underpowered", "differs"
#: Verdicts that decide a claim one way or the other.
DECISIVE = ("reproduced", "refuted")


def _disjoint(a: dict | None, b: dict | None) -> bool:
    return bool(a and b) and (a["hi"] < b["lo"] or b["hi"] < a["lo"])


def _to_decide(*sides: dict | None) -> int | None:
    """The most seeds either undecided side's verdict estimates would decide it (too_few_seeds)."""
    needs = [s["too_few_seeds"]["needed"] for s in sides
             if s and s.get("too_few_seeds") and s["too_few_seeds"].get("needed")]
    return max(needs) if needs else None


def _verdict_row(key: tuple, ref: dict | None, run: dict | None) -> dict:
    """One claim and pair of the reference or the run: same, consistent but underpowered, or
    a contradiction, and why.

    The rule, a compare that knows power: two decisive verdicts must carry the same
    label; where either side is unresolved, the two intervals must share a value. A verdict
    that one side could not decide is no contradiction: it says the seeds were too few to
    tell, and the row says about how many would. A not-judged verdict (the emulator
    saturated) never stands in for a judged one.
    """
    claim, pair = key
    v = ref or run or {}
    unit = v.get("unit", "")
    diffs, status, need = [], SAME, None
    if run is None:
        diffs.append("not in the run (its arms did not run)")
    elif ref is None:
        diffs.append("not in the reference")
    else:
        labels = (run["verdict"], ref["verdict"])
        if "not judged" in labels and labels[0] != labels[1]:
            diffs.append(f"verdict {run['verdict']}, the reference's {ref['verdict']}")
            if ref["interval"] and not run["interval"]:
                diffs.append(f"no point ({run['reason']})")
        elif all(lab in DECISIVE for lab in labels) and labels[0] != labels[1]:
            diffs.append(f"verdict {run['verdict']}, the reference's {ref['verdict']}")
        elif _disjoint(run["interval"], ref["interval"]):
            far = _outside(run["interval"]["point"], ref["interval"], unit) or ""
            diffs.append("intervals share no value: the run's "
                         f"{_span(run['interval'], unit)}, the reference's "
                         f"{_span(ref['interval'], unit)}" + (f" ({far})" if far else ""))
        elif labels[0] != labels[1]:
            status, need = UNDERPOWERED, _to_decide(run, ref)
    if diffs:
        status = DIFFERS
    return {"claim": claim, "pair": pair, "unit": unit,
            "reference": ref and {"verdict": ref["verdict"], "interval": ref["interval"]},
            "run": run and {"verdict": run["verdict"], "interval": run["interval"]},
            "same": status == SAME, "status": status, "seeds_to_decide": need,
            "differences": diffs}


def _span(interval: dict, unit: str) -> str:
    from testbed.analysis.answer import point_interval
    return point_interval(interval, unit)


def compare_verdicts(run, reference_dir) -> tuple[bool, list[dict], dict]:
    """(consistent, rows, run summary): each claim and pair of the reference against the run's.

    Consistent when no row contradicts the reference (`_verdict_row`'s rule):
    every decisive verdict the reference's, and wherever either side is
    unresolved, intervals that overlap. A claim and pair only one side has is
    a contradiction. ``rows[i]["same"]`` says whether a row is the very same
    verdict; ``rows[i]["status"]`` whether it is that, consistent but
    underpowered, or a contradiction.
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
    return all(r["status"] != DIFFERS for r in rows), rows, summary


def format_verdict_rows(rows: list[dict]) -> list[str]:
    """One line per claim and pair: 'same', 'consistent' (underpowered) or 'DIFFERS', and why."""
    from testbed.analysis.answer import point_interval
    out = []
    for r in rows:
        pair = r["pair"] or "(no pair)"
        side = r["run"] or r["reference"]
        head = f"{r['claim']} {pair}: "
        if r["status"] == SAME:
            out.append(f"same     {head}{side['verdict']}, point "
                       f"{point_interval(side['interval'], r['unit'])}")
        elif r["status"] == UNDERPOWERED:
            ref, run = r["reference"], r["run"]
            need = (f"about {r['seeds_to_decide']} seeds would decide"
                    if r["seeds_to_decide"] else "more seeds would decide")
            out.append(f"consistent, underpowered {head}{run['verdict']}, point "
                       f"{point_interval(run['interval'], r['unit'])}; the reference's "
                       f"{ref['verdict']}, point {point_interval(ref['interval'], r['unit'])}; "
                       f"the intervals overlap: {need}")
        else:
            out.append(f"DIFFERS  {head}" + "; ".join(r["differences"]))
    return out


def _compare_dir(run: str, reference: str, json_out: str | None) -> None:
    ok, rows, summary = compare_verdicts(run, reference)
    env = provenance.differences(summary, read_summary(reference))
    bad = summary.get("invalid_units", [])
    obj = check_answer({"kind": "compare-reproduce", "schema": ANSWER_SCHEMA, "run": run,
                        "reference": reference, "reproduces": ok and all(r["same"] for r in rows),
                        "consistent": ok, "environment": env, "verdicts": rows,
                        "invalid_units": bad})

    def text():
        for line in env:
            click.echo(f"differs from the reference's set-up: {line}")
        for line in format_verdict_rows(rows):
            click.echo(line)
        if bad:
            click.echo(f"the run has {len(bad)} invalid unit(s), left out of its verdicts: "
                       + ", ".join(f"{u['arm']} s{u['seed']}" for u in bad))
        weak = [r for r in rows if r["status"] == UNDERPOWERED]
        if ok and not weak:
            click.echo(f"reproduces {reference}: every verdict the same, no interval apart from "
                       "the reference's")
        elif ok:
            click.echo(f"consistent with {reference}: no verdict contradicts it; {len(weak)} "
                       f"of {len(rows)} underpowered on one side (an unresolved verdict whose "
                       "interval overlaps the other's)")
    output.results(obj, json_out, text)
    if not ok:
        differ = [f"{r['claim']} {r['pair'] or ''}".strip() for r in rows
                  if r["status"] == DIFFERS]
        raise NotReproduced(f"does not reproduce {reference}: {len(differ)} of {len(rows)} "
                            f"verdict(s) contradict it ({', '.join(differ)})")


def format_table(rows: list[dict]) -> str:
    def f(x):
        return "–" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
    def tol(r):
        if r["allowed"] is None:
            return ""
        sign = "-" if r["direction"] == "higher" else "+"
        rel = f" ({100 * r['allowed'] / abs(r['reference']):.1f} %)" if r["reference"] else ""
        return f"{sign}{f(r['allowed'])}{rel}"
    head = ["figure", "reference", "run", "tolerance", "verdict"]
    body = [[r["figure"] + ("" if r["guarded"] else " (shown)"), f(r["reference"]), f(r["run"]),
             tol(r), r["verdict"]] for r in rows]
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w[i]) for i, c in enumerate(cells)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * n for n in w])] + [line(b) for b in body])


def one_sided_factor(n: int, false_alarm: float = FALSE_ALARM) -> float:
    """How many standard deviations one new run of the same code stays within, one-sided.

    Student's t prediction bound for one further value from ``n`` runs:
    t_{1-a, n-1} * sqrt(1 + 1/n). Five runs at a = 1 %: 4.10.
    """
    from scipy.stats import t as student_t
    return float(student_t.ppf(1 - false_alarm, n - 1) * math.sqrt(1 + 1 / n))


def _commit_of(summaries_dirs: list) -> str:
    """The one git revision the runs measured (their manifests); CompareError when they differ."""
    revs = set()
    for d in summaries_dirs:
        env = json.loads((pathlib.Path(d) / "manifest.json").read_text()).get("environment", {})
        if env.get("git_dirty"):
            raise CompareError(f"make reference: {d} ran with uncommitted changes; a reference "
                               "records the revision it measured, so commit first and re-run")
        revs.add(env.get("git_revision"))
    if len(revs) != 1 or None in revs:
        raise CompareError(f"make reference: the runs measured {len(revs)} revisions "
                           f"({', '.join(sorted(map(str, revs)))}); make all runs of one commit")
    return revs.pop()


def make_reference(runs: list, out, guarded: dict | None = None) -> dict:
    """Write a reference from at least MIN_REFERENCE_RUNS runs of one commit.

    Figures are the runs' medians; each tolerance is the one-sided bound one
    new run of the same code stays within (`one_sided_factor` standard
    deviations), never below the figure's floor. The runs' summaries are
    copied beside the reference (``<name>-runs/<i>/summary.json``), so the
    spread can be audited and the reference remade from them.
    """
    guarded = guarded or GUARDED
    if len(runs) < MIN_REFERENCE_RUNS:
        raise CompareError(f"make reference: give at least {MIN_REFERENCE_RUNS} run directories "
                           f"(got {len(runs)}); their spread sets the tolerances")
    sums = [read_summary(r) for r in runs]
    for s, r in zip(sums, runs, strict=True):
        judgeable(s, r)
    commit = _commit_of(runs)
    k = one_sided_factor(len(runs))
    figures, tolerances, spread = {}, {}, {}
    for key, g in guarded.items():
        vals = [v for v in (get(s, key) for s in sums) if v is not None and math.isfinite(v)]
        if len(vals) < MIN_REFERENCE_RUNS:
            raise CompareError(f"make reference: only {len(vals)} run(s) have figure '{key}'")
        med = statistics.median(vals)
        sd = statistics.stdev(vals)
        figures[key] = med
        spread[key] = {"values": vals, "range": max(vals) - min(vals), "sd": sd,
                       "max_over_min": max(vals) / min(vals) if min(vals) > 0 else None}
        t = {"direction": g["direction"]}
        if "floor_rel" in g:
            t["rel"] = max(g["floor_rel"], k * sd / abs(med))
        if "floor_abs" in g:
            t["abs"] = max(g["floor_abs"], k * sd)
        tolerances[key] = t
    out = pathlib.Path(out)
    keep = out.parent / f"{out.stem}-runs"
    if keep.exists():
        shutil.rmtree(keep)
    summaries = []
    for i, r in enumerate(runs, 1):
        dest = keep / str(i) / "summary.json"
        dest.parent.mkdir(parents=True)
        shutil.copyfile(pathlib.Path(r) / "summary.json", dest)
        summaries.append(str(dest))
    shown = {key: statistics.median(vals) for key in SHOWN
             if (vals := [v for v in (get(s, key) for s in sums) if v is not None
                          and math.isfinite(v)])}
    ref = {"figures": figures, "tolerances": tolerances, "spread": spread, "shown": shown,
           "runs": [str(r) for r in runs], "summaries": summaries, "commit": commit,
           "method": f"figure = median of {len(runs)} runs; tolerance = max(floor, "
                     f"{k:.2f} x their standard deviation): the one-sided "
                     f"{100 * (1 - FALSE_ALARM):g} % Student t prediction bound for one new run",
           "note": "refresh with `make reference` (REF_RUNS >= 5 runs of the ci preset on an "
                   "idle machine, then `dblp-testbed compare RUN... --reference FILE --update`)"}
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
@click.option("--arm", "arm", default=GUARDED_ARM, show_default=True,
              help="With a reference JSON file: judge this arm's figures in dblp's place "
                   "(e.g. dblp-slowed, the CI test's deliberately slowed twin).")
@output.json_option
def compare_cmd(runs, reference, update, arm, json_out):
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
                       f"{len(sp['values'])} runs, sd {sp['sd']:.3g}{mm})")
        click.echo(f"commit {ref['commit']}; summaries kept under "
                   f"{pathlib.Path(ref['summaries'][0]).parents[1]}")
        return
    if len(runs) != 1:
        raise CompareError("compare: give exactly one RUN (several only with --update)")
    ok, rows = compare(runs[0], reference, arm)
    ref = read_reference(reference)

    def text():
        click.echo(format_table(rows))
        click.echo(f"reference: commit {ref['commit'][:12]}, {len(ref['summaries'])} runs; "
                   f"{ref['method']}")
        if ok:
            click.echo(f"ok: every guarded figure of arm {arm} within tolerance of {reference}")
    output.results(check_answer({"kind": "compare-guard", "schema": ANSWER_SCHEMA,
                                 "run": runs[0], "reference": reference, "arm": arm, "ok": ok,
                                 "commit": ref["commit"], "figures": rows}), json_out, text)
    if not ok:
        bad = [r["figure"] for r in rows if r["guarded"] and r["verdict"] != "ok"]
        raise Regression(f"REGRESSION: {', '.join(bad)} beyond tolerance of {reference}")
