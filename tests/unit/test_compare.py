"""`dblp-testbed compare`: catches a weakened DBLP, passes unchanged code, explains bad files."""
import json
import pathlib
import subprocess
import sys

import pytest

from testbed.analysis import compare, formats
from testbed.analysis.report import build_outputs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_analysis import ACC, BURST, make_run  # noqa: E402

pytestmark = pytest.mark.unit
CLI = pathlib.Path(sys.executable).with_name("dblp-testbed")


def _cli(*args):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three 'repeats' with dblp burst rounds of 100, 110 and 90 ms, and a weakened DBLP."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for name, dblp_ms in (("r1", 100.0), ("r2", 110.0), ("r3", 90.0)):
        out[name] = make_run(base / name, burst=dict(BURST, dblp=dblp_ms))
        build_outputs(out[name], figures=False)
    # P_high = P_low: DBLP's burst rounds cost what static's do.
    out["weak"] = make_run(base / "weak", burst=dict(BURST, dblp=BURST["static"]))
    build_outputs(out["weak"], figures=False)
    out["dumb"] = make_run(base / "dumb", acc=dict(ACC, dblp=0.80))
    build_outputs(out["dumb"], figures=False)
    return out


@pytest.fixture(scope="module")
def reference(runs, tmp_path_factory):
    ref = tmp_path_factory.mktemp("ref") / "ci.json"
    res = _cli("compare", runs["r1"], runs["r2"], runs["r3"], "--reference", ref, "--update")
    assert res.returncode == 0, res.stderr
    return ref


def test_reference_tolerances_come_from_the_spread(reference):
    ref = json.loads(reference.read_text())
    key = "speedups.dblp_vs_static.burst_round"
    # Ratios 4.0, 400/110, 400/90: median 4.0, range 400/90 - 400/110 = 0.808.
    assert ref["figures"][key] == pytest.approx(4.0)
    rng = 400 / 90 - 400 / 110
    assert ref["tolerances"][key] == {"direction": "higher",
                                      "rel": pytest.approx(1.5 * rng / 4.0)}
    assert ref["spread"][key]["max_over_min"] == pytest.approx(110 / 90)
    acc = ref["tolerances"]["arms.dblp.final_accuracy"]
    assert acc["abs"] == pytest.approx(0.02)  # no spread: the floor
    assert ref["figures"]["speedups.dblp_vs_gloo.burst_round"] == pytest.approx(8.0)


def test_unchanged_run_passes(runs, reference):
    res = _cli("compare", runs["r1"], "--reference", reference)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "speedups.dblp_vs_static.burst_round" in res.stdout
    assert "REGRESSED" not in res.stdout
    # A slower repeat inside the spread passes too.
    assert _cli("compare", runs["r2"], "--reference", reference).returncode == 0


def test_weakened_dblp_fails(runs, reference):
    res = _cli("compare", runs["weak"], "--reference", reference)
    assert res.returncode == 1
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert "REGRESSED" in rows["speedups.dblp_vs_static.burst_round"]
    assert "REGRESSED" in rows["speedups.dblp_vs_gloo.burst_round"]
    assert rows["arms.dblp.final_accuracy"].rstrip().endswith("ok")
    assert "REGRESSION" in res.stderr


def test_accuracy_drop_fails(runs, reference):
    ok, rows = compare.compare(runs["dumb"], reference)
    assert not ok
    verdicts = {r["figure"]: r["verdict"] for r in rows if r["guarded"]}
    assert verdicts == {"arms.dblp.final_accuracy": "REGRESSED",
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
    wild = make_run(tmp_path / "wild", burst=dict(BURST, dblp=10.0))
    build_outputs(wild, figures=False)
    ref = tmp_path / "ref.json"
    res = _cli("compare", runs["r1"], wild, "--reference", ref, "--update")
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


def test_version_1_and_2_summaries_without_their_successors_fields_still_read(tmp_path):
    run = make_run(tmp_path / "run")
    s = build_outputs(run, figures=False)
    assert s["schema"] == formats.SUMMARY_SCHEMA == 3
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
