"""`dblp-testbed compare`: catches a weakened DBLP, passes unchanged code, explains bad files."""
import json
import pathlib
import re
import statistics
import subprocess
import sys

import pytest

from testbed.analysis import compare, formats, provenance
from testbed.analysis.pipeline import build_outputs
from testbed.testing.rundirs import ACC, BURST, make_run

pytestmark = pytest.mark.unit
CLI = pathlib.Path(sys.executable).with_name("dblp-testbed")


def _cli(*args):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120)


#: The five repeats' DBLP burst rounds (ms): a spread of about 1.6 %.
REPEATS = {"r1": 100.0, "r2": 102.0, "r3": 98.0, "r4": 101.0, "r5": 99.0}
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _as_of(run, revision=REVISION, dirty=False):
    """The run's manifest says which code it measured (as a real run's environment does)."""
    m = json.loads((run / "manifest.json").read_text())
    m["environment"] = {"git_revision": revision, "git_dirty": dirty}
    (run / "manifest.json").write_text(json.dumps(m))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five 'repeats' with dblp burst rounds of 98-102 ms, a weakened and a slowed DBLP."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for name, dblp_ms in REPEATS.items():
        out[name] = _as_of(make_run(base / name, burst=dict(BURST, dblp=dblp_ms)))
        build_outputs(out[name], figures=False)
    # P_high = P_low: DBLP's burst rounds cost what static's do.
    out["weak"] = make_run(base / "weak", burst=dict(BURST, dblp=BURST["static"]))
    build_outputs(out["weak"], figures=False)
    # Every DBLP round 10 % slower (the slowdown the guard must catch).
    out["slow"] = make_run(base / "slow", burst=dict(BURST, dblp=110.0))
    build_outputs(out["slow"], figures=False)
    out["dumb"] = make_run(base / "dumb", acc=dict(ACC, dblp=0.80))
    build_outputs(out["dumb"], figures=False)
    return out


@pytest.fixture(scope="module")
def reference(runs, tmp_path_factory):
    ref = tmp_path_factory.mktemp("ref") / "ci.json"
    res = _cli("compare", *(runs[n] for n in REPEATS), "--reference", ref, "--update")
    assert res.returncode == 0, res.stderr
    return ref


def test_reference_tolerances_come_from_the_spread(reference):
    ref = json.loads(reference.read_text())
    key = "speedups.dblp_vs_static.burst_round"
    ratios = [400 / ms for ms in REPEATS.values()]
    med = statistics.median(ratios)
    assert ref["figures"][key] == pytest.approx(med) == pytest.approx(4.0)
    # One-sided 99 % Student t prediction bound for one new run from five: 4.10 sd.
    k = compare.one_sided_factor(5)
    assert k == pytest.approx(3.747 * (1.2 ** 0.5), rel=1e-3)
    want = max(0.05, k * statistics.stdev(ratios) / med)
    assert ref["tolerances"][key] == {"direction": "higher", "rel": pytest.approx(want)}
    assert ref["spread"][key]["max_over_min"] == pytest.approx(102 / 98)
    acc = ref["tolerances"]["arms.dblp.final_accuracy"]
    assert acc["abs"] == pytest.approx(0.02)  # no spread: the floor
    assert ref["figures"]["speedups.dblp_vs_gloo.burst_round"] == pytest.approx(8.0)
    # What the reference records: the commit the runs measured and their summaries, kept.
    assert ref["commit"] == REVISION and len(ref["summaries"]) == 5
    kept = [json.loads(pathlib.Path(s).read_text()) for s in ref["summaries"]]
    assert sorted(compare.get(s, key) for s in kept) == pytest.approx(sorted(ratios))


def test_unchanged_run_passes(runs, reference):
    res = _cli("compare", runs["r1"], "--reference", reference)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "speedups.dblp_vs_static.burst_round" in res.stdout
    assert "REGRESSED" not in res.stdout
    # The tolerance of each guarded figure is printed, and the reference's provenance.
    row = next(x for x in res.stdout.splitlines() if x.startswith("arms.dblp.normal_round_over"))
    assert "(5.0 %)" in row
    assert f"commit {REVISION[:12]}, 5 runs" in res.stdout
    # The slowest repeat passes too.
    assert _cli("compare", runs["r2"], "--reference", reference).returncode == 0


def test_weakened_dblp_fails(runs, reference):
    res = _cli("compare", runs["weak"], "--reference", reference)
    assert res.returncode == 1
    # --json: the same judgement as one object of the declared format.
    obj = json.loads(_cli("compare", runs["weak"], "--reference", reference, "--json").stdout)
    assert formats.check_answer(obj)["kind"] == "compare-guard" and obj["ok"] is False
    assert {r["figure"]: r["verdict"] for r in obj["figures"]}[
        "speedups.dblp_vs_static.burst_round"] == "REGRESSED"
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert "REGRESSED" in rows["speedups.dblp_vs_static.burst_round"]
    assert "REGRESSED" in rows["speedups.dblp_vs_gloo.burst_round"]
    assert rows["arms.dblp.final_accuracy"].rstrip().endswith("ok")
    assert "REGRESSION" in res.stderr


def test_a_ten_percent_slower_dblp_fails(runs, reference):
    """Burst rounds 10 % slower than the repeats' median: beyond the one-sided tolerance."""
    ok, rows = compare.compare(runs["slow"], reference)
    verdicts = {r["figure"]: r["verdict"] for r in rows if r["guarded"]}
    assert not ok
    assert verdicts["speedups.dblp_vs_static.burst_round"] == "REGRESSED"
    assert verdicts["arms.dblp.burst_round_over_phys_bound"] == "REGRESSED"


def test_another_arm_is_judged_in_dblps_place(runs, reference, tmp_path):
    """``--arm``: the slowed twin's figures read under the reference's dblp keys."""
    run = make_run(tmp_path / "twin", arms=("gloo", "static", "dblp", "dblp-slowed"),
                   burst=dict(BURST, **{"dblp-slowed": 110.0}))
    build_outputs(run, figures=False)
    assert compare.compare(run, reference)[0]
    res = _cli("compare", run, "--reference", reference, "--arm", "dblp-slowed")
    assert res.returncode == 1 and "REGRESSION" in res.stderr
    assert "speedups.dblp-slowed_vs_static.burst_round" in res.stderr
    res = _cli("compare", run, "--reference", reference, "--arm", "reliable")
    assert res.returncode == 2 and "no arm 'reliable' to judge" in res.stderr


def test_a_run_with_an_invalid_unit_is_not_judged(runs, reference, tmp_path):
    s = json.loads((runs["r1"] / "summary.json").read_text())
    s["invalid_units"] = [{"arm": "dblp", "seed": 1, "reasons": ["CPU busy 93 % > 85 %"]}]
    d = tmp_path / "busy"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(s))
    res = _cli("compare", d, "--reference", reference)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "not judged" in res.stderr and "CPU busy 93 % > 85 %" in res.stderr
    assert res.stderr.strip().count("\n") == 0


def test_update_needs_five_runs_of_one_clean_commit(runs, tmp_path):
    ref = tmp_path / "ref.json"
    res = _cli("compare", runs["r1"], runs["r2"], runs["r3"], "--reference", ref, "--update")
    assert res.returncode == 2 and "at least 5 run directories (got 3)" in res.stderr
    other = _as_of(make_run(tmp_path / "other"), revision="f" * 40)
    build_outputs(other, figures=False)
    res = _cli("compare", *(runs[n] for n in list(REPEATS)[:4]), other, "--reference", ref,
               "--update")
    assert res.returncode == 2 and "measured 2 revisions" in res.stderr
    dirty = _as_of(make_run(tmp_path / "dirty"), dirty=True)
    build_outputs(dirty, figures=False)
    res = _cli("compare", *(runs[n] for n in list(REPEATS)[:4]), dirty, "--reference", ref,
               "--update")
    assert res.returncode == 2 and "uncommitted changes" in res.stderr
    assert not ref.exists()


def test_accuracy_drop_fails(runs, reference):
    ok, rows = compare.compare(runs["dumb"], reference)
    assert not ok
    verdicts = {r["figure"]: r["verdict"] for r in rows if r["guarded"]}
    assert verdicts == {"arms.dblp.final_accuracy": "REGRESSED",
                        "arms.dblp.burst_round_over_phys_bound": "ok",
                        "arms.dblp.normal_round_over_phys_bound": "ok",
                        "speedups.dblp_vs_gloo.burst_round": "ok",
                        "speedups.dblp_vs_static.burst_round": "ok"}


def test_faster_is_not_a_regression(runs, reference, tmp_path):
    fast = make_run(tmp_path / "fast", burst=dict(BURST, dblp=50.0))
    build_outputs(fast, figures=False)
    assert compare.compare(fast, reference)[0]


@pytest.mark.parametrize("content,needle", [
    (None, "file not found"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"figures": {}}', "no schema version"),
    ('{"schema": 99, "figures": {}}', "schema version 99"),
])
def test_bad_reference_is_one_line_exit_2(runs, tmp_path, content, needle):
    ref = tmp_path / "ref.json"
    if content is not None:
        ref.write_text(content)
    res = _cli("compare", runs["r1"], "--reference", ref)
    assert res.returncode == 2
    assert needle in res.stderr and res.stderr.strip().count("\n") == 0
    assert str(ref) in res.stderr


GUARD = "speedups.dblp_vs_static.burst_round"
ACCURACY = "arms.dblp.final_accuracy"


def _drop_tolerance(r):
    del r["tolerances"][GUARD]


def _drop_figure(r):
    del r["figures"][GUARD]


@pytest.mark.parametrize("mutate,needle", [
    (_drop_tolerance, f"guarded figure '{GUARD}' has no tolerance"),
    (_drop_figure, f"figure '{GUARD}' must be a finite number"),
    (lambda r: r["figures"].update({GUARD: "4.0"}), "must be a finite number"),
    (lambda r: r["figures"].update({GUARD: float("nan")}), "must be a finite number"),
    (lambda r: r["figures"].update({GUARD: float("inf")}), "must be a finite number"),
    (lambda r: r["tolerances"][GUARD].update(rel=0.0), "rel must be in (0, 1)"),
    (lambda r: r["tolerances"][GUARD].update(rel=1.0), "rel must be in (0, 1)"),
    (lambda r: r["tolerances"][GUARD].update(rel=-0.2), "rel must be in (0, 1)"),
    (lambda r: r["tolerances"][GUARD].update(rel="0.2"), "must be num"),
    (lambda r: r["tolerances"][ACCURACY].update(abs=5.0), "abs must be in (0, |figure|"),
    (lambda r: r["tolerances"][GUARD].update(direction="up"), "direction 'higher' or 'lower'"),
    (lambda r: r["tolerances"][GUARD].pop("rel"), "needs a 'rel' or an 'abs'"),
    (lambda r: r["tolerances"].update({GUARD: 0.2}), "not a JSON object"),
    (lambda r: r["tolerances"].update({"arms.dblp.rounds": {"direction": "higher", "rel": 0.1}}),
     "figure 'arms.dblp.rounds' must be a finite number"),
    (lambda r: r["shown"].update({"bursts.count": "15"}), "shown figure 'bursts.count'"),
    (lambda r: r.pop("figures"), "field 'figures' missing"),
])
def test_reference_that_cannot_fail_is_refused(runs, reference, tmp_path, mutate, needle):
    """A reference that guards nothing is exit 2 and one line: never a traceback, never exit 1."""
    ref = json.loads(reference.read_text())
    mutate(ref)
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps(ref))
    for run in (runs["r1"], runs["weak"]):       # a passing and a regressing run alike
        res = _cli("compare", run, "--reference", bad)
        assert res.returncode == 2, res.stdout + res.stderr
        assert needle in res.stderr, res.stderr
        assert res.stderr.strip().count("\n") == 0 and str(bad) in res.stderr
        assert "Traceback" not in res.stderr


def test_committed_reference_is_valid():
    ref = compare.read_reference(pathlib.Path(__file__).parents[2] / "results" / "reference" / "ci.json")
    assert ref["schema"] == formats.REFERENCE_SCHEMA
    assert set(formats.GUARDED) <= set(ref["figures"])


def test_update_refuses_a_reference_that_could_not_fail(runs, tmp_path):
    """Runs so far apart that the spread-derived tolerance would reach 100 %: refused."""
    wild = _as_of(make_run(tmp_path / "wild", burst=dict(BURST, dblp=10.0)))
    build_outputs(wild, figures=False)
    ref = tmp_path / "ref.json"
    res = _cli("compare", *(runs[n] for n in list(REPEATS)[:4]), wild, "--reference", ref,
               "--update")
    assert res.returncode == 2 and "rel must be in (0, 1)" in res.stderr
    assert res.stderr.strip().count("\n") == 0 and not ref.exists()


def test_unknown_summary_version_is_refused(runs, reference, tmp_path):
    run = make_run(tmp_path / "run")
    build_outputs(run, figures=False)
    s = json.loads((run / "summary.json").read_text())
    unknown = max(formats.KNOWN_SUMMARY_SCHEMAS) + 1  # one this version has never written
    s["schema"] = unknown
    (run / "summary.json").write_text(json.dumps(s))
    res = _cli("compare", run, "--reference", reference)
    assert res.returncode == 2 and f"schema version {unknown}" in res.stderr
    assert res.stderr.strip().count("\n") == 0


def test_missing_summary_is_one_line_exit_2(reference, tmp_path):
    res = _cli("compare", tmp_path, "--reference", reference)
    assert res.returncode == 2
    assert "summary.json: file not found" in res.stderr and "dblp-testbed report" in res.stderr


def test_version_1_to_3_summaries_without_their_successors_fields_still_read(tmp_path):
    run = make_run(tmp_path / "run")
    s = build_outputs(run, figures=False)
    assert s["schema"] == formats.SUMMARY_SCHEMA == 9
    # Version 3: fidelity flags, which decided nothing, instead of invalid units; nothing
    # left out of a verdict or an interval.
    s["schema"] = 3
    s["fidelity_flags"] = {arm: [] for arm in s["arms"]}
    del s["invalid_units"]
    for entry in [*s["verdicts"], *s["intervals"].values()]:
        del entry["left_out"]
    (run / "summary.json").write_text(json.dumps(s))
    assert formats.read_summary(run / "summary.json")["schema"] == 3
    # Version 2: no intervals, verdicts or time to target.
    s["schema"] = 2
    for key in ("intervals", "verdicts", "time_to_target"):
        del s[key]
    (run / "summary.json").write_text(json.dumps(s))
    assert formats.read_summary(run / "summary.json")["schema"] == 2
    # Version 1: no phase switches either.
    s["schema"] = 1
    for a in s["arms"].values():
        del a["phase_switches"]
    (run / "summary.json").write_text(json.dumps(s))
    assert formats.read_summary(run / "summary.json")["schema"] == 1


# -- against a reference directory: does the run reproduce its verdicts? -----------------------

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _reference_dir(tmp_path, summary: dict) -> pathlib.Path:
    d = tmp_path / "reference"
    d.mkdir()
    formats.write_summary(d / "summary.json", summary)
    return d


def _verdict(summary, claim) -> dict:
    return next(v for v in summary["verdicts"] if v["claim"] == claim)


def test_a_run_reproduces_a_reference_with_its_verdicts(runs, tmp_path):
    ref = _reference_dir(tmp_path, formats.read_summary(runs["r1"]))
    res = _cli("compare", runs["r1"], "--reference", ref)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("same     burst_speedup dblp_vs_static: unresolved")
    assert lines[-1].startswith(f"reproduces {ref}: every verdict the same")


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """A run of two seeds: the figures with one value per seed have their intervals."""
    run = make_run(tmp_path_factory.mktemp("two") / "run", seeds=(1, 2))
    build_outputs(run, figures=False)
    return run


def test_a_run_that_contradicts_says_which_and_by_how_much(two_seeds, tmp_path):
    """Only a contradiction fails (issue 55). The reference's training-time-cut interval lies
    wholly above the run's (a contradiction); its accuracy verdict is reproduced where the
    run's is unresolved (consistent, underpowered: no failure)."""
    run = formats.read_summary(two_seeds)
    ref = json.loads(json.dumps(run))
    hi = _verdict(run, "train_time_cut")["interval"]["hi"]
    _verdict(ref, "train_time_cut")["interval"].update(point=hi + 2, lo=hi + 1, hi=hi + 3)
    _verdict(ref, "accuracy").update(verdict="reproduced", interval={
        "point": 0.1, "lo": -0.2, "hi": 5.0, "n_seeds": 3, "n_samples": 6,
        "method": "Student t over the paired per-seed differences", "resamples": 0,
        "level": 0.95, "rng_seed": 1})
    d = _reference_dir(tmp_path, ref)
    res = _cli("compare", two_seeds, "--reference", d)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert lines[0].startswith("same     burst_speedup dblp_vs_static: reproduced")
    assert lines[1].startswith("DIFFERS  train_time_cut dblp_vs_static: intervals share no "
                               "value: the run's ")
    assert f"below the reference's interval {hi + 2:.1f} % [{hi + 1:.1f} %, {hi + 3:.1f} %]" \
        in lines[1]
    assert lines[2].startswith("consistent, underpowered accuracy dblp_vs_static: unresolved")
    assert "the reference's reproduced" in lines[2] and "the intervals overlap" in lines[2]
    assert res.stderr.strip() == (f"dblp-testbed: error: does not reproduce {d}: 1 of "
                                  f"{len(run['verdicts'])} verdict(s) contradict it "
                                  "(train_time_cut dblp_vs_static)")
    res = _cli("compare", two_seeds, "--reference", d, "--json")
    assert res.returncode == 1
    obj = formats.check_answer(json.loads(res.stdout))
    assert obj["kind"] == "compare-reproduce"
    assert res.stdout.count("\n") == 1 and obj["reproduces"] is False
    assert obj["consistent"] is False
    assert [r["status"] for r in obj["verdicts"]][:3] == [
        compare.SAME, compare.DIFFERS, compare.UNDERPOWERED]
    assert {r["status"] for r in obj["verdicts"][3:]} == {compare.SAME}   # tail and mean


def _side(verdict, lo=None, hi=None, needed=None):
    iv = None if lo is None else {"point": (lo + hi) / 2, "lo": lo, "hi": hi, "n_seeds": 3}
    out = {"verdict": verdict, "interval": iv, "reason": "r", "unit": "%"}
    if needed:
        out["too_few_seeds"] = {"seeds": 3, "needed": needed, "edge": 17.0}
    return out


@pytest.mark.parametrize("ref,run,status", [
    (_side("reproduced", 20, 30), _side("reproduced", 18, 25), compare.SAME),
    (_side("reproduced", 20, 30), _side("refuted", 1, 5), compare.DIFFERS),
    (_side("refuted", 1, 5), _side("reproduced", 20, 30), compare.DIFFERS),
    (_side("reproduced", 20, 30), _side("unresolved", 10, 22, needed=9), compare.UNDERPOWERED),
    (_side("refuted", 1, 5), _side("unresolved", 10, 22), compare.DIFFERS),     # disjoint
    (_side("unresolved", 10, 22), _side("unresolved", 15, 25), compare.SAME),
    (_side("unresolved", 10, 22), _side("unresolved", None), compare.SAME),    # no interval
    (_side("reproduced", 20, 30), _side("unresolved"), compare.UNDERPOWERED),  # too few seeds
    (_side("reproduced", 20, 30), _side("not judged"), compare.DIFFERS),
])
def test_the_power_rule_fails_only_on_contradictions(ref, run, status):
    row = compare._verdict_row(("train_time_cut", "dblp_vs_static"), ref, run)
    assert row["status"] == status and row["same"] == (status == compare.SAME)
    assert bool(row["differences"]) == (status == compare.DIFFERS)
    if status == compare.UNDERPOWERED and run.get("too_few_seeds"):
        assert row["seeds_to_decide"] == 9


def test_a_not_judged_verdict_never_reproduces_a_judged_one(two_seeds, tmp_path):
    run = formats.read_summary(two_seeds)
    ref = _reference_dir(tmp_path, run)
    saturated = json.loads(json.dumps(run))
    for v in saturated["verdicts"]:
        v.update(verdict="not judged", interval=None, reason="emulator saturated: ...")
    d = tmp_path / "saturated"
    d.mkdir()
    formats.write_summary(d / "summary.json", saturated)
    ok, rows, _ = compare.compare_verdicts(d, ref)
    assert not ok
    for row in rows:
        want = f"verdict not judged, the reference's {row['reference']['verdict']}"
        assert row["differences"][0] == want and row["status"] == compare.DIFFERS
        if row["reference"]["interval"]:
            assert row["differences"][1] == "no point (emulator saturated: ...)"


def test_a_committed_reference_reproduces_itself():
    ref = ROOT / "results" / "reference" / "default"
    ok, rows, _ = compare.compare_verdicts(ref, ref)
    summary = formats.read_summary(ref)
    assert ok and len(rows) == len(summary["verdicts"]) and all(r["same"] for r in rows)


def test_reference_directory_mistakes_are_one_line_exit_2(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _cli("compare", runs["r1"], "--reference", empty)
    assert res.returncode == 2 and "summary.json: file not found" in res.stderr
    res = _cli("compare", runs["r1"], "--reference", empty, "--update")
    assert res.returncode == 2 and "is a directory" in res.stderr
    assert res.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("mutate,needle", [
    (lambda o: o.pop("kind"), "kind None is not one of"),
    (lambda o: o.update(schema=99), f"schema 99 is not {formats.ANSWER_SCHEMA}"),
    (lambda o: o.update(ok="yes"), "field 'ok' must be bool"),
    (lambda o: o["figures"][0].update(guarded=1), "figures[0]: field 'guarded' must be bool"),
    (lambda o: o.update(extra=1), "undeclared field(s) extra"),
])
def test_a_json_answer_off_its_declaration_is_refused(runs, reference, mutate, needle):
    obj = json.loads(_cli("compare", runs["r1"], "--reference", reference, "--json").stdout)
    assert formats.check_answer(obj)["ok"] is True
    mutate(obj)
    with pytest.raises(formats.FormatError, match=re.escape(needle)):
        formats.check_answer(obj)


def test_compare_names_data_that_differ_before_its_verdicts(two_seeds, tmp_path):
    """Issue 55: a run whose data differ from the reference's says so first."""
    run = formats.read_summary(two_seeds)
    ref = json.loads(json.dumps(run))
    ref["data"] = {"model": run["data"]["model"], "sha256": "0" * 64}
    d = _reference_dir(tmp_path, ref)
    res = _cli("compare", two_seeds, "--reference", d)
    first = res.stdout.splitlines()[0]
    assert first == (f"differs from the reference's set-up: data sha256: the run's "
                     f"{run['data']['sha256']}, the reference's {'0' * 64}")
    assert provenance.differences(run, run) == []
    old = dict(ref, schema=6)
    del old["data"]
    assert "does not record which data" in provenance.differences(run, old)[0]


def test_compare_names_the_machine_and_software_that_differ(tmp_path):
    """The summary says what the run ran on (from its manifest), and compare names each
    difference from the reference's (a kernel datapath against a userspace one, another
    torch) before its verdicts; a reference made before the field says it does not know."""
    two_seeds = make_run(tmp_path / "run", seeds=(1, 2))
    manifest = json.loads((two_seeds / "manifest.json").read_text())
    manifest["environment"] = {"python": "3.11.2", "kernel": "6.1.0", "machine": "x86_64",
                               "cpus": 2, "ovs": "ovs-vsctl (Open vSwitch) 3.1.0",
                               "git_revision": "a" * 40, "git_dirty": False,
                               "versions": {"torch": "2.13.0+cpu"}}
    manifest["capabilities"] = {"datapath": "user",
                                "c_core": {"loaded": True, "mac": "intel-ipsec-mb"}}
    env = provenance.environment_of(manifest)
    assert env == {"python": "3.11.2", "torch": "2.13.0+cpu", "kernel": "6.1.0",
                   "machine": "x86_64", "cpus": 2, "ovs": "ovs-vsctl (Open vSwitch) 3.1.0",
                   "datapath": "user", "c_core": "intel-ipsec-mb", "revision": "a" * 40,
                   "dirty": False}
    (two_seeds / "manifest.json").write_text(json.dumps(manifest))
    build_outputs(two_seeds, figures=False)
    run = formats.read_summary(two_seeds)
    assert run["schema"] == formats.SUMMARY_SCHEMA and run["environment"] == env
    ref = json.loads(json.dumps(run))
    ref["environment"].update(datapath="kernel", torch="2.12.0+cpu")
    res = _cli("compare", two_seeds, "--reference", _reference_dir(tmp_path, ref))
    assert res.stdout.splitlines()[:2] == [
        "differs from the reference's set-up: environment torch: the run's 2.13.0+cpu, "
        "the reference's 2.12.0+cpu",
        "differs from the reference's set-up: environment datapath: the run's user, "
        "the reference's kernel"]
    del ref["environment"]
    assert "does not record what it ran on" in provenance.differences(run, ref)[0]
