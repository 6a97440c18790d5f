"""`dblp-testbed ablate`: the plan of runs, resuming, and each point against the baselines."""
import json
import pathlib

import pandas as pd
import pytest

from testbed.analysis import ablation as analysis
from testbed.analysis import datasets
from testbed.errors import InputError
from testbed.run import ablation, batch
from testbed.testing.frames import TRUTH, synthetic

pytestmark = pytest.mark.unit


def test_the_detector_plan_runs_the_baselines_once_and_each_point_alone():
    ab = ablation.ABLATIONS["detector"]
    runs = ab.runs()
    assert runs[0].name == ablation.BASE
    assert runs[0].overrides == ["arms=static,static-high,dblp"]
    points = [r for r in runs[1:]]
    # The preset's own values (P_high 0.408, threshold 0.5, the delivered
    # signal) are the base run's point on every axis: never run twice.
    assert [r.name for r in points] == [
        "p_high=0.108", "p_high=0.208", "p_high=0.608", "p_high=0.808",
        "threshold=0.1", "threshold=0.3", "threshold=0.7", "threshold=0.9", "signal=rescaled"]
    for r in points:
        assert r.overrides == ["arms=dblp", f"{r.setting}={r.value}"]
        spec = ab.spec(r.overrides)
        section, field = r.setting.split(".")
        assert spec[section][field] == r.value and spec.arms == ["dblp"] and spec.seeds == 3
    assert [r.name for r in ab.runs(("threshold",))][1:] == [
        "threshold=0.1", "threshold=0.3", "threshold=0.7", "threshold=0.9"]
    with pytest.raises(InputError, match="no axis 'nope'; choose from p_high, threshold, signal"):
        ab.runs(("nope",))


def _columns(table, df):
    empty = {"float": float("nan"), "bool": False}
    for col in table.columns:
        if col.name not in df.columns:
            df[col.name] = empty.get(col.kind, pd.NA)
    return df


def fake_run(calls, fail=()):
    """A run function that writes what a finished run would: manifest, spec, rounds, evals.

    Accuracy falls with P_high (0.90 at 0.208, 0.86 at 0.408): the sweep must see it.
    """
    def run(spec, out):
        out = pathlib.Path(out)
        calls.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "spec.toml").write_text(spec.to_toml())
        if out.name in fail:
            (out / "manifest.json").write_text(json.dumps({"status": "failed"}))
            return "failed"
        p = spec["transport"]["p_high"]
        truth = dict(TRUTH, dblp=(100.0 + 100 * (0.408 - p), 24.0, 75.0, 0.98 - 0.3 * p))
        # Each run its own noise (as real runs have): with one generator seed for all, the
        # first arm of every run would draw the same per-seed noise, and the differences
        # between runs would all be equal (no spread, no interval).
        rounds, evals = synthetic(seeds=tuple(spec.seed_values), arms=tuple(spec.arms), truth=truth,
                                  rng=round(p * 1000))
        rounds["phase"] = ["relaxed" if (r // 10) % 2 else "critical" for r in rounds["round"]]
        rounds.loc[~rounds["arm"].str.startswith("dblp"), "phase"] = pd.NA
        datasets.write(out, datasets.TABLES["rounds"], _columns(datasets.TABLES["rounds"], rounds))
        datasets.write(out, datasets.TABLES["evals"], _columns(datasets.TABLES["evals"], evals))
        (out / "manifest.json").write_text(json.dumps({"status": "ok"}))
        return "ok"
    return run


def test_a_resumed_ablation_runs_only_what_did_not_finish_and_keeps_the_failure(tmp_path):
    ab = ablation.ABLATIONS["smoke"]
    calls = []
    plan = ab.execute(tmp_path, run_fn=fake_run(calls, fail=("p_high=0.208",)))
    assert calls == ["base", "p_high=0.208"]
    assert plan["runs"]["p_high=0.208"]["status"] == "failed"
    assert plan["runs"]["base"]["overrides"] == ["arms=static,dblp"]
    calls.clear()
    plan = ab.execute(tmp_path, run_fn=fake_run(calls))
    assert calls == ["p_high=0.208"]                       # base was done: not run again
    assert {r["status"] for r in plan["runs"].values()} == {"ok"}
    kept = [p.name for p in tmp_path.iterdir() if ".failed-" in p.name]
    assert len(kept) == 1 and kept[0].startswith("p_high=0.208.failed-")
    assert json.loads((tmp_path / kept[0] / "manifest.json").read_text())["status"] == "failed"
    with pytest.raises(InputError, match="holds ablation 'smoke', not 'detector'"):
        ablation.ABLATIONS["detector"].execute(tmp_path, run_fn=fake_run([]))


def test_a_resumed_ablation_runs_an_invalid_run_again(tmp_path):
    """A run whose arms finished but whose summary lists an invalid unit (its manifest says
    "ok") decides nothing: the resume the error message asks for makes it again."""
    ab = ablation.ABLATIONS["smoke"]
    ab.execute(tmp_path, run_fn=fake_run([]))
    d = tmp_path / "p_high=0.208"
    (d / "summary.json").write_text(json.dumps({"invalid_units": [
        {"arm": "dblp", "seed": 3, "reasons": ["packet spacing 88.6 % below 90.0 %"]}]}))
    assert batch.status(d) == batch.INVALID and batch.status(tmp_path / "base") == "ok"
    calls: list[str] = []
    plan = ab.execute(tmp_path, run_fn=fake_run(calls))
    assert calls == ["p_high=0.208"] and plan["runs"]["p_high=0.208"]["status"] == "ok"
    assert [p.name for p in tmp_path.iterdir() if ".failed-" in p.name][0].startswith(
        "p_high=0.208.failed-")


def test_each_point_is_compared_with_the_baselines_with_intervals(tmp_path):
    ab = ablation.Ablation("t", "smoke", "dblp", ("static", "static-high"),
                           (ablation.Axis("transport.p_high", (0.208, 0.408), "P_high"),),
                           seeds=3, doc="", overrides=ablation.ABLATIONS["smoke"].overrides,
                           harm=True)
    plan = ab.execute(tmp_path, run_fn=fake_run([]))
    doc = analysis.write(tmp_path, plan)
    # The loss-tolerance sweep ran for real (digits, 8 rounds): P_high dropped in each window.
    h = doc["harm"]
    assert h["drop_fraction"] == 0.408 and h["rounds"] == 8 and h["model"] == "digits_cnn"
    assert [(w["phase"], w["start"], w["stop"], w["seeds"]) for w in h["windows"]] == [
        ("early", 0, 2, 3), ("middle", 3, 5, 3), ("late", 6, 8, 3)]
    assert "## Where drops hurt (digits_cnn, 3 workers, no network)" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "plots" / "phases-p_high.png").stat().st_size > 10_000
    assert doc["axes"][0]["points"][0]["critical_by_round"][0] == 1.0   # rounds 0-9 critical
    (axis,) = doc["axes"]
    low, high = axis["points"]
    assert (low["value"], low["base"], low["arm"]) == (0.208, False, "dblp@p_high=0.208")
    assert (high["value"], high["base"], high["arm"]) == (0.408, True, "dblp")
    assert low["seeds"] == high["seeds"] == [1, 2, 3]
    # 0.98 - 0.3 p: 91.8 % at 0.208 and 85.8 % at 0.408, against static's 90 %.
    assert low["final_accuracy_mean"] == pytest.approx(0.918, abs=0.01)
    assert high["final_accuracy_mean"] == pytest.approx(0.858, abs=0.01)
    d_low = low["against"]["static"]["accuracy_delta"]["interval"]
    d_high = high["against"]["static"]["accuracy_delta"]["interval"]
    assert d_low["lo"] > 0 > d_high["hi"]
    assert d_low["n_seeds"] == 3
    assert low["against"]["static"]["train_time_cut"]["interval"]["point"] > 0
    assert low["relaxed_share"] == pytest.approx(0.5, abs=0.05) and low["switches"] > 0
    assert doc["baseline_points"]["static"]["switches"] is None
    assert doc["baseline_points"]["static"]["against"] == {}
    # What the loose bound alone buys: static-high against static (windows 20 vs 30 ms).
    cut = doc["baseline_points"]["static-high"]["against"]["static"]["train_time_cut"]["interval"]
    assert cut["lo"] > 20
    assert doc["target"]["value"] is not None
    table = pd.read_csv(tmp_path / "points.csv")
    assert list(table["value"]) == [0.208, 0.408]
    assert "accuracy_delta_vs_static_lo" in table.columns
    report = (tmp_path / "report.md").read_text()
    assert "## P_high (`transport.p_high`; the preset's: 0.408)" in report
    assert "| **0.408** |" in report
    assert (tmp_path / "plots" / "ablation-p_high.png").stat().st_size > 10_000
    assert analysis.read_summary(tmp_path)["schema"] == analysis.SCHEMA
    # Judged again from the tables the runs keep: the same intervals.
    assert analysis.rejudge(tmp_path) == json.loads(json.dumps(doc))
    verdicts = analysis.accuracy_verdicts(doc)
    assert "- **reproduced**: P_high 0.208, " in verdicts
    assert "- **refuted**: P_high 0.408 (the preset's), " in verdicts


def test_an_ablation_reference_keeps_its_summary_and_plots_and_renders_readme_tables(tmp_path):
    from testbed import references as refs
    from testbed.analysis import pages as rd
    from testbed.run import reproduce as rp

    ref = refs.AblationReference("ab", "smoke", "test", run_fn=fake_run([]))
    done = rp.reproduce([ref], tmp_path / "runs", reference_dir=tmp_path / "ref")
    assert done["ab"]["status"] == "ok", done
    kept = tmp_path / "ref" / "ab"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(
        [*rp.kept_files(ref), refs.RECORD])
    assert "plots/phases-p_high.png" in rp.kept_files(ref)
    rec = refs.read_record(kept)
    assert rec["kind"] == "ablation" and rec["argv"] == ["ablate", "smoke", "--out", "DIR"]
    doc = analysis.read_summary(kept)
    table = rd.render("ab", "ablation-p_high", tmp_path / "ref")
    assert table == analysis.axis_table(doc, doc["axes"][0])
    assert table.splitlines()[0].startswith("| value | final acc % | acc vs static (points) | train s |")
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| 0.208", "| **0.408**"]
    assert rd.render("ab", "ablation-baselines", tmp_path / "ref").startswith(
        "| baseline | final acc % | acc vs static (points) |")
    no_harm = "(no loss-tolerance sweep in this ablation)\n"
    assert rd.render("ab", "ablation-harm", tmp_path / "ref") == no_harm
    with pytest.raises(ValueError, match="has no axis 'threshold'"):
        rd.render("ab", "ablation-threshold", tmp_path / "ref")


def test_files_of_another_version_are_refused_in_one_line(tmp_path):
    (tmp_path / "ablation.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(InputError, match="schema 99; this code reads 1"):
        ablation.Ablation.read_plan(tmp_path)
    (tmp_path / "ablation-summary.json").write_text(json.dumps({"schema": 0, "ablation": "x"}))
    with pytest.raises(InputError, match="schema 0; this code reads 1"):
        analysis.read_summary(tmp_path)
    with pytest.raises(InputError, match="not found; run `dblp-testbed ablate NAME"):
        ablation.Ablation.read_plan(tmp_path / "none")
