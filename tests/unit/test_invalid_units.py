"""Invalid units decide nothing: a unit that broke an emulator invariant stays in the tables,
marked, and is left out of every figure, interval and verdict; a pair left without a valid
seed is "not judged"; `run` and `report` end with the verdicts and the invalid units."""
import json
import pathlib

import pandas as pd
import pytest
from click.testing import CliRunner

from testbed.analysis import answer, claims, datasets, formats
from testbed.analysis.pages import verdicts
from testbed.analysis.pipeline import build_outputs
from testbed.invariants import INVARIANTS
from testbed.testing.frames import TRUTH, synthetic
from testbed.testing.rundirs import make_run

pytestmark = pytest.mark.unit
BUSY = INVARIANTS["cpu busy"]
SATURATED = {BUSY.field: 0.95}               # breaks "cpu busy" (limit 0.85)
REASON = BUSY.broken(SATURATED)


def _set_fidelity(run, records):
    man = json.loads((run / "manifest.json").read_text())
    for u in man["units"]:
        if (u["arm"], u["seed"]) in records:
            u["fidelity"] = records[(u["arm"], u["seed"])]
    (run / "manifest.json").write_text(json.dumps(man))


def _by_pair(out, claim) -> dict:
    return {v["pair"]: v for v in out["verdicts"] if v["claim"] == claim}


# -- the verdicts, from frames ------------------------------------------------------------------

def test_an_invalid_unit_takes_its_seed_out_of_the_pair_and_nothing_else():
    rounds, evals = synthetic(seeds=(1, 2, 3, 4), arms=("static", "dblp"))
    invalid = {("dblp", 4): [REASON]}
    got = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, invalid,
                       resamples=500)
    # The same as judging seeds 1-3 only: the bootstrap pairs by seed, so static's seed 4,
    # valid itself, has no partner and goes too.
    keep = rounds["seed"] < 4
    want = claims.judge({"training": {}}, ["static", "dblp"], rounds[keep],
                        evals[evals["seed"] < 4], resamples=500)
    for name in ("burst_speedup", "train_time_cut", "accuracy_delta"):
        g = got["intervals"]["dblp_vs_static"]["figures"][name]["interval"]
        assert g == want["intervals"]["dblp_vs_static"]["figures"][name]["interval"]
        assert g["n_seeds"] == 3
    b = _by_pair(got, "burst_speedup")["dblp_vs_static"]
    assert b["verdict"] == claims.REPRODUCED and b["reason"].endswith("1 invalid unit(s) left out")
    assert b["left_out"] == [{"arm": "dblp", "seed": 4, "reasons": [REASON]}]


def test_what_an_invalid_unit_measured_cannot_move_a_verdict():
    rounds, evals = synthetic(seeds=(1, 2, 3), arms=("static", "dblp"))
    invalid = {("dblp", 3): [REASON]}
    before = claims.judge({"training": {}}, ["static", "dblp"], rounds, evals, invalid,
                          resamples=500)
    # The invalid unit's rounds 50x slower (a saturated emulator): nothing changes.
    slow = rounds.copy()
    hit = (slow["arm"] == "dblp") & (slow["seed"] == 3)
    slow.loc[hit, ["latency_ms", "duration_ms"]] *= 50
    after = claims.judge({"training": {}}, ["static", "dblp"], slow, evals, invalid,
                         resamples=500)
    assert after["verdicts"] == before["verdicts"]
    assert after["time_to_target"] == before["time_to_target"]


def test_a_pair_without_a_valid_seed_is_not_judged_and_the_others_are():
    arms = ["static", "dblp", "static-tcp", "dblp-tcp"]
    truth = {**TRUTH, "static-tcp": TRUTH["static"], "dblp-tcp": TRUTH["dblp"]}
    rounds, evals = synthetic(seeds=(1, 2), arms=arms, truth=truth)
    # Seed 1 lost on the dblp side, seed 2 on the static side: no seed has both.
    invalid = {("dblp", 1): [REASON], ("static", 2): [REASON, "cpu steal 9.0 % above 5.0 %"]}
    out = claims.judge({"training": {}}, arms, rounds, evals, invalid, resamples=500)
    for claim in claims.CLAIMS:
        v = _by_pair(out, claim)["dblp_vs_static"]
        assert v["verdict"] == claims.NOT_JUDGED and v["interval"] is None
        assert v["reason"].startswith("emulator saturated: no seed with both units valid")
        assert "dblp s1: cpu busy 95.0 % above 85.0 %" in v["reason"]
        assert len(v["left_out"]) == 2
        assert _by_pair(out, claim)["dblp-tcp_vs_static-tcp"]["verdict"] != claims.NOT_JUDGED
    figs = out["intervals"]["dblp_vs_static"]["figures"]
    assert all(f["interval"] is None and f["reason"].startswith("emulator saturated")
               for f in figs.values())


# -- a run directory: tables, summary, report, README, answer ------------------------------------

@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """Seeds 1 and 2; static's seed 2 ran on a saturated emulator."""
    run = make_run(tmp_path_factory.mktemp("two") / "run", seeds=(1, 2))
    _set_fidelity(run, {("static", 2): SATURATED, ("static", 1): {BUSY.field: 0.5},
                        ("dblp", 2): {"cpu_steal_frac": 0.01}})
    return run, build_outputs(run)


def test_invalid_units_stay_in_the_tables_marked(two_seeds):
    run, s = two_seeds
    assert s["invalid_units"] == [{"arm": "static", "seed": 2, "reasons": [REASON]}]
    for table in (datasets.ROUNDS, datasets.EVALS):
        df = datasets.read(run, table)
        bad = (df["arm"] == "static") & (df["seed"] == 2)
        assert bad.any() and not df.loc[bad, "valid"].any() and df.loc[~bad, "valid"].all()
        assert (df.loc[bad, "invalid_reasons"] == REASON).all()
        assert df.loc[~bad, "invalid_reasons"].isna().all()
    csv = pd.read_csv(run / "rounds.csv")
    assert len(csv) == 2 * 3 * 10 and (~csv["valid"]).sum() == 10
    assert any("arm static seed 2: invalid" in w for w in s["warnings"])
    assert "fidelity_flags" not in s and s["schema"] == formats.SUMMARY_SCHEMA == 9


def test_per_arm_figures_pool_only_the_valid_units(two_seeds, tmp_path):
    _, s = two_seeds
    one = build_outputs(make_run(tmp_path / "one", seeds=(1,)), figures=False)
    for key in ("rounds", "burst_rounds", "burst_round_ms_p50", "normal_round_ms_p50",
                "train_time_s", "final_accuracy"):
        assert s["arms"]["static"][key] == one["arms"]["static"][key], key
    assert s["arms"]["dblp"]["rounds"] == 20     # both of dblp's seeds are valid
    v = _by_pair(s, "train_time_cut")["dblp_vs_static"]
    # One seed left: the cut has one value and no interval (the seed is the unit).
    assert v["interval"] is None and v["left_out"][0]["seed"] == 2
    assert v["reason"].startswith("too few seeds (1)")
    assert v["too_few_seeds"]["seeds"] == 1


def test_the_report_and_the_answer_name_the_invalid_unit(two_seeds):
    run, s = two_seeds
    md = (run / "report.md").read_text()
    assert "## Invalid units (1)" in md and f"| static | 2 | {REASON} |" in md
    lines = answer.lines(s)
    assert lines[-2].startswith("invalid units (1,") and lines[-1] == f"  static s2: {REASON}"


@pytest.fixture(scope="module")
def saturated(tmp_path_factory):
    """One seed, and static's unit broke an invariant: the paper's pair has no valid seed."""
    run = make_run(tmp_path_factory.mktemp("sat") / "run")
    _set_fidelity(run, {("static", 1): SATURATED})
    return run, build_outputs(run)


def test_no_valid_pair_left_is_not_judged_everywhere(saturated):
    run, s = saturated
    paper = [v for v in s["verdicts"] if v["pair"] == "dblp_vs_static"]
    assert len(paper) == len(claims.CLAIMS)
    assert {v["verdict"] for v in paper} == {claims.NOT_JUDGED}
    assert s["arms"]["static"]["rounds"] == 0 and s["arms"]["static"]["burst_round_ms_p50"] is None
    md = (run / "report.md").read_text()
    assert "| not judged (emulator saturated) | emulator saturated: no seed with both" in md
    table = verdicts.verdicts_table(s)
    assert ("| burst_speedup | dblp vs static | 4.0-5.88x (5.88x: abstract; 4.0-5.9x: full text) "
            "| – | – | not judged (emulator saturated) |") in table
    assert table.endswith(f"- static s1: {REASON}\n")
    assert formats.read_summary(run)["invalid_units"][0]["arm"] == "static"


def test_report_ends_with_the_verdict_table_and_the_invalid_units(saturated):
    from testbed.cli import main
    run, _ = saturated
    res = CliRunner().invoke(main, ["report", str(run)])
    assert res.exit_code == 0, res.output
    out = res.stdout.splitlines()
    start = out.index("verdicts on the paper's claims:")
    table = out[start + 1:]
    assert table[0].split() == ["claim", "pair", "point", "[95", "%", "interval]", "verdict"]
    rows = [r for r in table if r.startswith("  burst_speedup")]
    assert rows[0].split()[:4] == ["burst_speedup", "dblp", "vs", "static"]
    assert rows[0].endswith("not judged (emulator saturated)")
    assert out[-2:] == ["invalid units (1, left out of every figure, interval and verdict):",
                        f"  static s1: {REASON}"]


# -- `run`: its last lines, status and exit code ------------------------------------------------

def test_run_finishes_with_the_answer_and_says_invalid(saturated, two_seeds, capsys):
    from testbed.run import experiment
    run, s = saturated
    assert experiment.finish("ok", s, run) == experiment.INVALID
    cap = capsys.readouterr()
    assert cap.out.splitlines() == answer.lines(s)
    assert cap.err.strip().splitlines()[-1].startswith("run invalid: 1 unit(s) broke an emulator "
                                                       "invariant")
    valid = dict(s, invalid_units=[])
    assert experiment.finish("ok", valid, run) == "ok"
    assert capsys.readouterr().out.splitlines()[-1].startswith("invalid units: none")
    # A failed run stays failed, whatever its units; no analysis, no answer.
    assert experiment.finish("failed", s, run) == "failed"
    assert experiment.finish("error", None, run) == "error"
    cap = capsys.readouterr()
    assert cap.out.splitlines() == answer.lines(s) and "run error" in cap.err


@pytest.mark.parametrize("status,code", [("ok", 0), ("invalid", 3), ("failed", 1),
                                         ("interrupted", 1)])
def test_run_exit_code_says_invalid_apart_from_failed(monkeypatch, tmp_path, status, code):
    from testbed.cli import main
    from testbed.run import experiment
    monkeypatch.setattr(experiment, "run_and_report", lambda spec, out, json_out=None: status)
    res = CliRunner().invoke(main, ["run", "--preset", "smoke", "--out", str(tmp_path / "r")])
    assert res.exit_code == code, res.output


def test_run_help_documents_the_exit_codes():
    from testbed.cli import main
    res = CliRunner().invoke(main, ["run", "--help"])
    assert "3 every arm finished but some unit is invalid" in " ".join(res.output.split())


# -- formats ------------------------------------------------------------------------------------

def test_schema_4_needs_invalid_units_and_older_summaries_still_read(saturated, tmp_path):
    run, s = saturated
    broken = dict(s)
    del broken["invalid_units"]
    with pytest.raises(formats.FormatError, match="invalid_units"):
        formats.check_summary(broken)
    with pytest.raises(formats.FormatError, match="fidelity_flags"):
        formats.check_summary(dict(s, fidelity_flags={}))
    # Committed references of version 3 still read, with their flags and no invalid_units;
    # the default reference is version 4 or later (judged again from its tables by
    # `reproduce --rejudge`, which writes today's version), every unit valid.
    root = pathlib.Path(__file__).resolve().parents[2] / "results" / "reference"
    ref = formats.read_summary(root / "paper")
    assert ref["schema"] == 3 and "invalid_units" not in ref
    assert answer.lines(ref)[-1].startswith("invalid units: none")
    ref = formats.read_summary(root / "default")
    assert ref["schema"] >= 4 and ref["invalid_units"] == []


def test_a_rounds_table_from_before_the_invariants_is_refused_with_the_rebuild(two_seeds, tmp_path):
    import pyarrow.parquet as pq
    run, _ = two_seeds
    arrow = pq.read_table(run / "rounds.parquet").drop_columns(["valid", "invalid_reasons"])
    meta = {**arrow.schema.metadata, datasets.META_KEY: b'{"table": "rounds", "schema": 3}'}
    pq.write_table(arrow.replace_schema_metadata(meta), tmp_path / "rounds.parquet")
    with pytest.raises(datasets.TableError, match="before the invariants decided.*dblp-testbed "
                                                  "report DIR"):
        datasets.read(tmp_path, datasets.ROUNDS)
