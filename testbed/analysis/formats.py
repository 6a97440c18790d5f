"""summary.json and the CI reference: each declared once, with its version and history.

The analysis is the one author of summary.json (`write_summary`) and
`compare` its reader (`read_summary`); `compare --update` the one author of a
reference (`write_reference`) and `compare` its reader (`read_reference`).
Writers check what they write against the declaration, readers refuse a
version they do not know with one line (an InputError, exit 2), the way
pyperf refuses a result file of an unknown version. Fields are declared with
`workloads.runlog.Field`, the same declaration type the raw-log events use.
"""
from __future__ import annotations

import json
import math
import pathlib

from testbed.errors import InputError
from workloads.runlog import Field, MalformedEvent, check_fields

# ------------------------------------------------------------ summary.json --
# History:
#   1: first declared version ("schema" added; the keys are those of the
#      unversioned summaries before it).
#   2: arms.<arm>.phase_switches (how often a phase-aware arm's phase changed
#      between consecutive rounds; null for arms without a phase). Optional,
#      so a version-1 summary still reads.
#   3: intervals (95 % bootstrap intervals over seeds and rounds of every
#      compared pair's figures, testbed.analysis.intervals), verdicts (each
#      of the paper's claims reproduced / refuted / unresolved from those
#      intervals, one entry per claim and pair, testbed.analysis.claims),
#      time_to_target (per arm and seed, the wall time to the target
#      accuracy) and arms.<arm>.time_to_target_s (its median over seeds).
#      Optional, so version-1 and -2 summaries still read.
#   4: invariants decide (testbed.invariants): invalid_units (each unit whose
#      fidelity record broke one, with its reasons) replaces fidelity_flags;
#      per-arm figures, speedups, intervals and verdicts pool valid units
#      only; a verdict may be "not judged" (every seed of its pair has an
#      invalid unit), and each verdict and interval pair lists the units it
#      left out (left_out). Versions 1-3 still read: their fidelity_flags
#      decided nothing, and they have no invalid_units.
#   5: arms.<arm>.normal_round_phys_bound_ms_p50 and normal_round_over_phys_bound
#      (the CI guard's figure for a slowdown DBLP shares with static).
#      Optional, so versions 1-4 still read.
#   6: verdicts[].too_few_seeds (a figure with one value per seed that the
#      seeds could not settle: how many there were, about how many would;
#      testbed.analysis.claims.too_few_seeds), and the accuracy difference's
#      interval is Student's t over the paired seeds. Optional, so versions
#      1-5 still read. A version 1-3 reference judged again from its kept
#      tables (claims.rejudge) keeps its number and may carry too_few_seeds.
#   7: the seed is the unit (the training-time cut and time to target are
#      Student's t over per-seed values); data (the pinned digest of the data
#      set the workers trained on); arms.<arm>.relaxed_share and comm_share
#      (the design's figures a verdict stands beside); verdicts[].source.
#      Optional, so versions 1-6 still read.
#   8: environment (what the run ran on, from its manifest:
#      testbed.analysis.provenance.environment_of). Optional, so versions 1-7
#      still read.
#   9: the tail and mean latency claims (verdicts of tail_latency and
#      mean_latency, the round_p99_speedup and round_mean_speedup figures,
#      and the "baselines" pairs: DBLP against gloo too); burst_levels (the
#      burst speedup per requested loss level and DBLP phase, each judged,
#      beside its pass-count ratio: testbed.analysis.burstlevels); the burst
#      claim's verdicts say what they pool (verdicts[].pools). Optional, so
#      versions 1-8 still read.
SUMMARY_SCHEMA = 9
KNOWN_SUMMARY_SCHEMAS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9})


def _num(name: str, doc: str = "") -> Field:
    """A figure: a number, null where it could not be measured (JSON has no NaN)."""
    return Field(name, "num", True, True, doc)


SUMMARY_FIELDS = (
    Field("schema", "int", doc="version of this format"),
    Field("status", "str", doc="ok | partial | failed"),
    Field("name", "str", doc="spec name"),
    Field("arms_order", "list", doc="the spec's arms, in order"),
    Field("arms", "dict", doc="arm -> SUMMARY_ARM_FIELDS"),
    Field("baselines", "list", doc="arms whose transport is not dblp"),
    Field("speedups", "dict", doc="'<arm>_vs_<baseline>' -> SUMMARY_SPEEDUP_FIELDS"),
    Field("bursts", "dict", doc="SUMMARY_BURST_FIELDS"),
    Field("physics", "dict", doc="inputs, missing_inputs, pairs (physics.place_speedup)"),
    Field("packets", "dict", doc="arm -> direction -> capture counts"),
    Field("fidelity", "dict", doc="arm -> seed (a string) -> its unit's manifest record"),
    Field("fidelity_flags", "dict", required=False,
          doc="versions 1-3 only: arm -> warnings from its fidelity record, which decided nothing"),
    Field("invalid_units", "list", required=False,
          doc="SUMMARY_INVALID_UNIT_FIELDS, one per unit that broke an invariant, in run order; "
              "left out of every per-arm figure, speedup, interval and verdict. Version 4 on "
              "(required there)"),
    Field("paper", "dict", doc="the paper's figures, for comparison"),
    Field("targets", "list", doc="the default run's targets, each met true/false/null"),
    Field("warnings", "list", doc="what a reader should not miss"),
    Field("definitions", "dict", doc="how each figure is defined"),
    Field("intervals", "dict", required=False,
          doc="'<arm>_vs_<baseline>' -> SUMMARY_INTERVAL_PAIR_FIELDS: every compared pair's "
              "figures with 95 % intervals"),
    Field("verdicts", "list", required=False,
          doc="SUMMARY_VERDICT_FIELDS, one per claim (claims.CLAIMS) and pair of arms that ran; "
              "one with pair null for a claim none of whose pairs ran"),
    Field("time_to_target", "dict", required=False, doc="SUMMARY_TIME_TO_TARGET_FIELDS"),
    Field("data", "dict", required=False, nullable=True,
          doc="the data set the workers trained on: {model, sha256} (workloads.data's pinned "
              "digest, or of the bytes the workers read; null: a task that does not say); "
              "null: no worker said. Version 7 on"),
    Field("environment", "dict", required=False, nullable=True,
          doc="what the run ran on: python, torch, kernel, machine, cpus, ovs, datapath, "
              "c_core, revision, dirty (testbed.analysis.provenance); null: the manifest "
              "records none. Version 8 on"),
    Field("burst_levels", "dict", required=False,
          doc="'<arm>_vs_<baseline>' (each DBLP arm and its static partner) -> "
              "SUMMARY_BURST_LEVELS_PAIR_FIELDS. Version 9 on"),
)
SUMMARY_ARM_FIELDS = (
    Field("transport", "str"), Field("status", "str"),
    Field("rounds", "int"), Field("burst_rounds", "int"),
    _num("round_ms_p50"), _num("round_ms_p99"),
    _num("burst_round_ms_p50"), _num("burst_round_ms_max"), _num("normal_round_ms_p50"),
    _num("round_duration_ms_p50"), _num("train_time_s"), _num("final_accuracy"),
    _num("bound_p50"), _num("burst_round_bound_p50"), _num("burst_round_phys_bound_ms_p50"),
    _num("burst_round_over_phys_bound"), _num("bytes_per_round_p50"),
    Field("normal_round_phys_bound_ms_p50", "num", required=False, nullable=True,
          doc="median physical bound of the rounds no burst overlapped. Version 5 on"),
    Field("normal_round_over_phys_bound", "num", required=False, nullable=True,
          doc="normal_round_ms_p50 over normal_round_phys_bound_ms_p50. Version 5 on"),
    Field("time_to_target_s", "num", required=False, nullable=True,
          doc="median, over the seeds that reached it, of the wall time to the target accuracy "
              "(time_to_target); null: none reached it. Version 3 on"),
    Field("phase_switches", "int", required=False, nullable=True,
          doc="rounds whose phase differs from the round before (raw round events' phase); "
              "null: the arm has no phase (not a dblp policy)"),
    Field("relaxed_share", "num", required=False, nullable=True,
          doc="share of the arm's rounds its phase-aware bound ran relaxed; null: no phase. "
              "Version 7 on"),
    Field("comm_share", "num", required=False, nullable=True,
          doc="share of a round's time spent exchanging the gradient (slowest worker's exchange "
              "over the round's window, summed over rounds). Version 7 on"),
)
SUMMARY_SPEEDUP_FIELDS = (
    Field("arm", "str"), Field("baseline", "str"),
    _num("burst_round"), _num("burst_round_low"), _num("burst_round_high"),
    _num("burst_round_spread"), Field("burst_round_n", "list"),
    _num("normal_round"), _num("normal_round_spread"),
    _num("train_time"), _num("train_time_reduction_pct"), _num("accuracy_delta"),
    Field("warnings", "list"),
)
# One interval (testbed.analysis.intervals.Interval.to_dict).
INTERVAL_FIELDS = (
    Field("point", "num", doc="the estimate on the data"),
    Field("lo", "num", doc="lower end of the interval"), Field("hi", "num", doc="upper end"),
    Field("n_seeds", "int", doc="seeds both arms had data for (1: a round bootstrap only)"),
    Field("n_samples", "int", doc="values both arms contributed (rounds or evaluations)"),
    Field("method", "str", doc="how the interval was computed"),
    Field("resamples", "int"), Field("level", "num", doc="0.95"),
    Field("rng_seed", "int", doc="seed of the bootstrap's numpy generator"),
)
# One unit that broke an invariant (tables.invalid_units).
SUMMARY_INVALID_UNIT_FIELDS = (
    Field("arm", "str"), Field("seed", "int"),
    Field("reasons", "list", doc="one line per broken invariant (testbed.invariants.broken)"),
)
_LEFT_OUT = Field("left_out", "list", required=False,
                  doc="SUMMARY_INVALID_UNIT_FIELDS of the pair's units left out. Version 4 on")
SUMMARY_INTERVAL_PAIR_FIELDS = (
    Field("arm", "str"), Field("baseline", "str"),
    Field("comparison", "str", doc="claims.COMPARISONS name"), Field("what", "str"),
    Field("figures", "dict", doc="estimator (intervals.ESTIMATORS) -> SUMMARY_FIGURE_FIELDS"),
    _LEFT_OUT,
)
SUMMARY_FIGURE_FIELDS = (
    Field("estimator", "str"), Field("unit", "str", doc="x | % | points"),
    Field("interval", "dict", nullable=True, doc="INTERVAL_FIELDS; null: not measurable"),
    Field("reason", "str", nullable=True, doc="why there is no interval"),
)
SUMMARY_VERDICT_FIELDS = (
    Field("claim", "str", doc="claims.CLAIMS name"),
    Field("what", "str", doc="the claim"), Field("paper", "str", doc="the paper's figure"),
    Field("source", "str", required=False,
          doc="where each of the paper's figures comes from (the abstract or the full text)"),
    Field("comparison", "str"), Field("estimator", "str"), Field("unit", "str"),
    Field("region", "list", doc="[lo, hi] of the estimator that reproduces it; null: unbounded"),
    Field("region_why", "str"),
    Field("pair", "str", nullable=True, doc="'<arm>_vs_<baseline>'; null: no pair ran"),
    Field("arm", "str", nullable=True), Field("baseline", "str", nullable=True),
    Field("verdict", "str", doc="reproduced | refuted | unresolved | not judged (version 4 on: "
                                "every seed of the pair has an invalid unit)"),
    Field("reason", "str"),
    Field("interval", "dict", nullable=True, doc="INTERVAL_FIELDS; null: not measurable"),
    _LEFT_OUT,
    Field("too_few_seeds", "dict", required=False,
          doc="SUMMARY_TOO_FEW_SEEDS_FIELDS: the verdict is unresolved because a figure with one "
              "value per seed had too few seeds. Version 6 on"),
    Field("pools", "dict", required=False,
          doc="the burst claim's verdicts: SUMMARY_POOLS_FIELDS, what its pooled figure pools. "
              "Version 9 on"),
)
SUMMARY_POOLS_FIELDS = (
    Field("levels", "list", doc="the requested loss levels of the bursts it pools"),
    Field("phases", "dict", doc="the arm's phase at the burst (none: no phase) -> bursts"),
    Field("bursts", "int", doc="distinct bursts (seed, burst id) of the paired seeds"),
    Field("seeds", "int", doc="seeds with burst rounds of both arms"),
)
SUMMARY_BURST_LEVELS_PAIR_FIELDS = (
    Field("arm", "str"), Field("baseline", "str"),
    Field("bounds", "dict", doc="baseline, critical, relaxed: the loss bounds from the spec "
                                "(null: the spec has none)"),
    Field("pools", "dict", nullable=True, doc="SUMMARY_POOLS_FIELDS; null: no burst ids"),
    Field("rows", "list", doc="SUMMARY_BURST_LEVEL_FIELDS, levels ascending, relaxed first"),
    Field("reason", "str", nullable=True, doc="why there are no rows"),
)
SUMMARY_BURST_LEVEL_FIELDS = (
    Field("level", "num", doc="the requested loss (a fraction)"),
    Field("phase", "str", doc="relaxed | critical: DBLP's phase at the burst"),
    Field("bursts", "int", doc="distinct bursts behind the figure"),
    Field("seeds", "int", doc="seeds with burst rounds of both arms at this level and phase"),
    Field("rounds", "list", doc="[the arm's, the baseline's] burst rounds"),
    Field("capped", "int", doc="burst rounds a round-locked burst's cap ended"),
    Field("bounds", "list", doc="[the baseline's, the arm's in this phase] loss bound"),
    Field("passes", "list", doc="[the baseline's, the arm's] ceil(ln P / ln p) (physics.passes)"),
    Field("pass_ratio", "num", nullable=True, doc="the baseline's passes / the arm's"),
    Field("interval", "dict", nullable=True, doc="INTERVAL_FIELDS; null: not measurable"),
    Field("verdict", "str", doc="reproduced | refuted | unresolved | too few bursts/seeds | "
                                "capped (the burst claim's region, claims.burst_levels)"),
    Field("reason", "str", nullable=True),
    Field("too_few_seeds", "dict", required=False, doc="SUMMARY_TOO_FEW_SEEDS_FIELDS"),
)
SUMMARY_TOO_FEW_SEEDS_FIELDS = (
    Field("seeds", "int", doc="the seeds both arms had"),
    Field("needed", "int", nullable=True,
          doc="an estimate of the seeds that would settle it (intervals.seeds_to_clear); null: "
              "no estimate (no interval, or the point sits on the edge)"),
    Field("edge", "num", nullable=True, doc="the region's edge the estimate is for"),
)
SUMMARY_TIME_TO_TARGET_FIELDS = (
    Field("metric", "str", doc="evals column the target is on"),
    _num("target", "target value (null: no evaluations)"),
    Field("source", "str", doc="spec training.target_accuracy, or how it was derived"),
    Field("per_arm", "dict", doc="arm -> SUMMARY_TIME_TO_TARGET_ARM_FIELDS"),
)
SUMMARY_TIME_TO_TARGET_ARM_FIELDS = (
    Field("runs", "int", doc="seeds with rounds"), Field("reached", "int", doc="seeds that reached it"),
    _num("t_s_median", "median over the seeds that reached it"),
    Field("t_s", "dict", doc="seed -> seconds, null: never reached"),
    Field("round", "dict", doc="seed -> the evaluated round that reached it, null: never"),
)
SUMMARY_BURST_FIELDS = (
    Field("count", "int"), Field("per_arm", "dict"), Field("rounds_hit", "int"),
    _num("requested_loss"), _num("measured_loss"), _num("measured_loss_min"),
    _num("measured_loss_max"), Field("dropped_packets", "int"),
    _num("actual_ms_p50"), _num("start_delay_ms_p50"),
)


class FormatError(InputError):
    """A summary or reference file is missing, malformed or of an unknown version."""


def read_versioned(path, schema: int, missing: str, stale: str) -> dict:
    """A JSON object of exactly one version: the plans and summaries of ablations and maps.

    Anything else is one InputError line that says what to do: ``missing``
    when there is no file (the command that writes it), ``stale`` when it is
    of another version (rebuild or rerun it with this code).
    """
    path = pathlib.Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} not found; {missing}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not readable JSON ({exc}); {missing}") from None
    got = doc.get("schema") if isinstance(doc, dict) else None
    if got != schema:
        raise InputError(f"{path} has schema {got!r}; this code reads {schema}: {stale}")
    return doc


def _load_json(path: pathlib.Path, what: str) -> dict:
    if not path.exists():
        hint = " (run `dblp-testbed report DIR` to build it)" if path.name == "summary.json" else ""
        raise FormatError(f"{what} {path}: file not found{hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{what} {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FormatError(f"{what} {path}: expected a JSON object at the top level")
    return data


def _version(data: dict, known: frozenset, what: str, path) -> None:
    v = data.get("schema")
    if v not in known or isinstance(v, bool):
        got = "no schema version" if v is None else f"schema version {v!r}"
        raise FormatError(f"{what} {path}: {got}, this dblp-testbed reads "
                          f"{', '.join(map(str, sorted(known)))}; rebuild it with this version")


def check_summary(summary: dict, where: str = "summary") -> dict:
    """``summary`` if it matches the declaration, else FormatError naming the field."""
    try:
        check_fields(summary, SUMMARY_FIELDS, where)
        for arm, a in summary["arms"].items():
            check_fields(a, SUMMARY_ARM_FIELDS, f"{where} arms.{arm}")
        for pair, sp in summary["speedups"].items():
            check_fields(sp, SUMMARY_SPEEDUP_FIELDS, f"{where} speedups.{pair}")
        check_fields(summary["bursts"], SUMMARY_BURST_FIELDS, f"{where} bursts")
        _check_invariant_sections(summary, where)
        _check_verdict_sections(summary, where)
    except MalformedEvent as exc:
        raise FormatError(str(exc)) from None
    return summary


def _check_interval(obj, where: str) -> None:
    if obj is not None:
        check_fields(obj, INTERVAL_FIELDS, where)


def _check_units(units, where: str) -> None:
    for i, u in enumerate(units):
        check_fields(u, SUMMARY_INVALID_UNIT_FIELDS, f"{where}[{i}]")


def _check_invariant_sections(summary: dict, where: str) -> None:
    """Version 4 on: invalid_units, which replaced fidelity_flags (MalformedEvent naming it)."""
    if summary["schema"] < 4:
        return
    if "invalid_units" not in summary:
        raise MalformedEvent(f"{where}: field 'invalid_units' missing (schema {summary['schema']})")
    if "fidelity_flags" in summary:
        raise MalformedEvent(f"{where}: field 'fidelity_flags' is of schemas 1-3; schema "
                             f"{summary['schema']} has invalid_units")
    _check_units(summary["invalid_units"], f"{where} invalid_units")


def _check_verdict_sections(summary: dict, where: str) -> None:
    """The version-3 sections, where present (MalformedEvent naming the entry)."""
    for pair, entry in summary.get("intervals", {}).items():
        check_fields(entry, SUMMARY_INTERVAL_PAIR_FIELDS, f"{where} intervals.{pair}")
        _check_units(entry.get("left_out", []), f"{where} intervals.{pair}.left_out")
        for name, fig in entry["figures"].items():
            w = f"{where} intervals.{pair}.figures.{name}"
            check_fields(fig, SUMMARY_FIGURE_FIELDS, w)
            _check_interval(fig["interval"], f"{w}.interval")
    for i, v in enumerate(summary.get("verdicts", [])):
        w = f"{where} verdicts[{i}]"
        check_fields(v, SUMMARY_VERDICT_FIELDS, w)
        _check_interval(v["interval"], f"{w}.interval")
        if "too_few_seeds" in v:
            check_fields(v["too_few_seeds"], SUMMARY_TOO_FEW_SEEDS_FIELDS, f"{w}.too_few_seeds")
        if "pools" in v:
            check_fields(v["pools"], SUMMARY_POOLS_FIELDS, f"{w}.pools")
        _check_units(v.get("left_out", []), f"{w}.left_out")
    for pair, entry in summary.get("burst_levels", {}).items():
        w = f"{where} burst_levels.{pair}"
        check_fields(entry, SUMMARY_BURST_LEVELS_PAIR_FIELDS, w)
        if entry["pools"] is not None:
            check_fields(entry["pools"], SUMMARY_POOLS_FIELDS, f"{w}.pools")
        for i, row in enumerate(entry["rows"]):
            check_fields(row, SUMMARY_BURST_LEVEL_FIELDS, f"{w}.rows[{i}]")
            _check_interval(row["interval"], f"{w}.rows[{i}].interval")
    if "time_to_target" in summary:
        ttt = check_fields(summary["time_to_target"], SUMMARY_TIME_TO_TARGET_FIELDS,
                           f"{where} time_to_target")
        for arm, a in ttt["per_arm"].items():
            check_fields(a, SUMMARY_TIME_TO_TARGET_ARM_FIELDS, f"{where} time_to_target.{arm}")


def write_summary(path, summary: dict) -> None:
    """The one writer of summary.json; a summary off its declaration is a bug."""
    try:
        check_summary(summary)
    except FormatError as exc:
        raise ValueError(f"bug: the summary does not match its declaration: {exc}") from None
    pathlib.Path(path).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def read_summary(path) -> dict:
    """A run's summary.json (or RUN/summary.json for a directory), version checked."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "summary.json"
    data = _load_json(p, "run summary")
    _version(data, KNOWN_SUMMARY_SCHEMAS, "run summary", p)
    return check_summary(data, f"run summary {p}")


# ------------------------------------------------------------ CI reference --
# History:
#   1: first declared version ("schema" added to the unversioned layout:
#      figures, tolerances, shown, spread, runs, note); a reference must be
#      able to fail (see check_reference).
#   2: a guard with teeth: DBLP's own burst and normal rounds over their
#      physical bound guarded beside the speedups, one-sided tolerances from
#      at least MIN_REFERENCE_RUNS runs (floors of 5 %), the code revision the
#      runs measured (`commit`) and the runs' summaries kept beside the file
#      (`summaries`). Version-1 files guarded with 20 % floors from three runs
#      and are no longer read.
REFERENCE_SCHEMA = 2
KNOWN_REFERENCE_SCHEMAS = frozenset({2})
#: Fewest runs a reference is made from: the spread of fewer says too little.
MIN_REFERENCE_RUNS = 5

# The figures every reference guards, and how make_reference sets their
# tolerance: direction of a bad move, and the floor under the measured spread.
# DBLP's rounds over their physical bound catch a slowdown it shares with
# static (the same transport), which leaves dblp_vs_static unchanged; the
# speedups catch a loss of what DBLP buys over its baselines.
GUARDED = {
    "arms.dblp.burst_round_over_phys_bound": {"direction": "lower", "floor_rel": 0.05},
    "arms.dblp.normal_round_over_phys_bound": {"direction": "lower", "floor_rel": 0.05},
    "speedups.dblp_vs_static.burst_round": {"direction": "higher", "floor_rel": 0.05},
    "speedups.dblp_vs_gloo.burst_round": {"direction": "higher", "floor_rel": 0.05},
    "arms.dblp.final_accuracy": {"direction": "higher", "floor_abs": 0.02},
}
REFERENCE_FIELDS = (
    Field("schema", "int", doc="version of this format"),
    Field("figures", "dict", doc="figure (dotted summary path) -> reference value (the runs' median)"),
    Field("tolerances", "dict", doc="figure -> REFERENCE_TOLERANCE_FIELDS"),
    Field("shown", "dict", doc="figure -> value, shown beside the run's, never guarded"),
    Field("spread", "dict", doc="figure -> the runs' values, range, standard deviation"),
    Field("runs", "list", doc="run directories the reference was made from"),
    Field("summaries", "list", doc="the runs' summary.json files, kept beside the reference "
                                   "(paths relative to the repository)"),
    Field("commit", "str", doc="git revision of the code the runs measured"),
    Field("method", "str", doc="how each tolerance follows from the runs"),
    Field("note", "str", doc="how to refresh the reference"),
)
REFERENCE_TOLERANCE_FIELDS = (
    Field("direction", "str", doc="higher | lower: which way is good"),
    Field("rel", "num", required=False, doc="allowed bad move, fraction of the figure, (0, 1)"),
    Field("abs", "num", required=False, doc="allowed bad move, absolute, (0, |figure|)"),
)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_reference(ref: dict, where: str = "reference") -> dict:
    """``ref`` if it can fail, else FormatError (one line naming the figure).

    A reference that cannot fail guards nothing: every GUARDED figure and
    every figure with a tolerance must be present and finite, each tolerance
    names a direction and at least one allowance, a relative allowance lies
    in (0, 1) and an absolute one in (0, |figure|), so that losing the whole
    figure is always a regression.
    """
    try:
        check_fields(ref, REFERENCE_FIELDS, where)
        for key, t in ref["tolerances"].items():
            check_fields(t, REFERENCE_TOLERANCE_FIELDS, f"{where} tolerance '{key}'")
    except MalformedEvent as exc:
        raise FormatError(str(exc)) from None
    figs, tols = ref["figures"], ref["tolerances"]
    for key in sorted(set(GUARDED) | set(tols)):
        if key not in tols:
            raise FormatError(f"{where}: guarded figure '{key}' has no tolerance")
        want, t = figs.get(key), tols[key]
        if not _finite(want):
            raise FormatError(f"{where}: figure '{key}' must be a finite number, got {want!r}")
        if t["direction"] not in ("higher", "lower"):
            raise FormatError(f"{where}: tolerance '{key}' needs direction 'higher' or 'lower', "
                              f"got {t['direction']!r}")
        if "rel" not in t and "abs" not in t:
            raise FormatError(f"{where}: tolerance '{key}' needs a 'rel' or an 'abs' allowance")
        if "rel" in t and not (_finite(t["rel"]) and 0 < t["rel"] < 1):
            raise FormatError(f"{where}: tolerance '{key}' rel must be in (0, 1), got {t['rel']!r}")
        if "abs" in t and not (_finite(t["abs"]) and 0 < t["abs"] < abs(want)):
            raise FormatError(f"{where}: tolerance '{key}' abs must be in (0, |figure| = "
                              f"{abs(want):.4g}), got {t['abs']!r}")
    if len(ref["summaries"]) < MIN_REFERENCE_RUNS:
        raise FormatError(f"{where}: made from {len(ref['summaries'])} run(s); a reference needs "
                          f"at least {MIN_REFERENCE_RUNS} (their spread sets the tolerances)")
    for key, v in ref["shown"].items():
        if not _finite(v):
            raise FormatError(f"{where}: shown figure '{key}' must be a finite number, got {v!r}")
    return ref


def read_reference(path) -> dict:
    """A CI reference, version checked and able to fail; FormatError otherwise."""
    p = pathlib.Path(path)
    data = _load_json(p, "reference")
    _version(data, KNOWN_REFERENCE_SCHEMAS, "reference", p)
    return check_reference(data, f"reference {p}")


def write_reference(path, ref: dict) -> None:
    """The one writer of a reference; refuses one that could not fail."""
    ref = dict(ref, schema=REFERENCE_SCHEMA)
    check_reference(ref, f"new reference {path}")
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------- the --json answers --
# What `run`, `report` and `compare` print with ``--json`` (testbed.output):
# one object each, declared here so a script can rely on it, and checked by
# the code that builds it (a field off its declaration is a bug there).
# ``kind`` says which of the three it is, ``schema`` its version.
# History:
#   1: first declared version (the objects of before, plus kind and schema).
#   2: compare-reproduce judges power: ``consistent`` (no contradiction),
#      ``reproduces`` (every verdict the very same), each row's ``status``
#      and ``seeds_to_decide``; ``environment``, what differs from the
#      reference's set-up (the data set).
ANSWER_SCHEMA = 2
#: ``kind`` -> the fields of that object.
ANSWER_KINDS = ("run", "compare-guard", "compare-reproduce")
_ANSWER_HEAD = (
    Field("kind", "str", doc="run (run and report) | compare-guard | compare-reproduce"),
    Field("schema", "int", doc="ANSWER_SCHEMA"),
)
RUN_ANSWER_FIELDS = (
    *_ANSWER_HEAD,
    Field("run_dir", "str"),
    Field("status", "str", doc="ok | invalid (a unit broke an invariant) | failed | error"),
    Field("summary", "str", nullable=True, doc="path of summary.json; null: no analysis"),
    Field("verdicts", "list", doc="SUMMARY_VERDICT_FIELDS each"),
    Field("invalid_units", "list", doc="SUMMARY_INVALID_UNIT_FIELDS each"),
    Field("speedups", "dict", doc="pair -> RUN_ANSWER_SPEEDUP_FIELDS"),
    Field("warnings", "list", doc="the summary's warnings, one line each"),
)
RUN_ANSWER_SPEEDUP_FIELDS = (_num("burst_round"), _num("normal_round"), _num("train_time"))
COMPARE_GUARD_FIELDS = (
    *_ANSWER_HEAD,
    Field("run", "str"), Field("reference", "str", doc="the reference JSON file"),
    Field("arm", "str", doc="the arm judged in dblp's place"),
    Field("ok", "bool", doc="every guarded figure within its tolerance"),
    Field("commit", "str", doc="the revision the reference's runs measured"),
    Field("figures", "list", doc="COMPARE_FIGURE_FIELDS each"),
)
COMPARE_FIGURE_FIELDS = (
    Field("figure", "str", doc="the summary key, e.g. speedups.dblp_vs_static.burst_round"),
    _num("reference"), _num("run"),
    _num("allowed", "the largest bad move the tolerance allows; null: shown, not guarded"),
    Field("direction", "str", nullable=True, doc="higher | lower is better; null: shown"),
    Field("verdict", "str", doc="ok | REGRESSED | MISSING; empty: shown, not guarded"),
    Field("guarded", "bool"),
    Field("tolerance", "dict", required=False, doc="rel and/or abs of a guarded figure"),
)
COMPARE_REPRODUCE_FIELDS = (
    *_ANSWER_HEAD,
    Field("run", "str"), Field("reference", "str", doc="the reference directory"),
    Field("reproduces", "bool", doc="every verdict the very same as the reference's"),
    Field("consistent", "bool", doc="no verdict contradicts the reference's (compare.py)"),
    Field("environment", "list", doc="what could move a figure and differs from the "
          "reference's set-up, one line each (provenance.differences)"),
    Field("verdicts", "list", doc="COMPARE_VERDICT_FIELDS each"),
    Field("invalid_units", "list", doc="the run's SUMMARY_INVALID_UNIT_FIELDS"),
)
COMPARE_VERDICT_FIELDS = (
    Field("claim", "str"), Field("pair", "str", nullable=True), Field("unit", "str"),
    Field("reference", "dict", nullable=True, doc="verdict and interval; null: not in it"),
    Field("run", "dict", nullable=True, doc="verdict and interval; null: not in the run"),
    Field("same", "bool", doc="the very same verdict"),
    Field("status", "str", doc="same | consistent, underpowered | differs"),
    Field("seeds_to_decide", "int", nullable=True,
          doc="an unresolved side's estimate of the seeds that would decide it; null: none"),
    Field("differences", "list", doc="one line each (a contradiction's)"),
)


def check_answer(obj: dict, where: str = "--json answer") -> dict:
    """``obj`` if it is one of the declared ``--json`` objects, else FormatError naming the field."""
    try:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in ANSWER_KINDS:
            raise MalformedEvent(f"{where}: kind {kind!r} is not one of {', '.join(ANSWER_KINDS)}")
        if obj.get("schema") != ANSWER_SCHEMA:
            raise MalformedEvent(f"{where}: schema {obj.get('schema')!r} is not {ANSWER_SCHEMA}")
        if kind == "run":
            check_fields(obj, RUN_ANSWER_FIELDS, where)
            for pair, sp in obj["speedups"].items():
                check_fields(sp, RUN_ANSWER_SPEEDUP_FIELDS, f"{where} speedups.{pair}")
            for i, v in enumerate(obj["verdicts"]):
                check_fields(v, SUMMARY_VERDICT_FIELDS, f"{where} verdicts[{i}]")
                _check_interval(v["interval"], f"{where} verdicts[{i}].interval")
            _check_units(obj["invalid_units"], f"{where} invalid_units")
        elif kind == "compare-guard":
            check_fields(obj, COMPARE_GUARD_FIELDS, where)
            for i, row in enumerate(obj["figures"]):
                check_fields(row, COMPARE_FIGURE_FIELDS, f"{where} figures[{i}]")
        else:
            check_fields(obj, COMPARE_REPRODUCE_FIELDS, where)
            for i, row in enumerate(obj["verdicts"]):
                check_fields(row, COMPARE_VERDICT_FIELDS, f"{where} verdicts[{i}]")
            _check_units(obj["invalid_units"], f"{where} invalid_units")
    except MalformedEvent as exc:
        raise FormatError(str(exc)) from None
    return obj
