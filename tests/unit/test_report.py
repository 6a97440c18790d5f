"""`dblp-testbed report DIR`: every derived file rebuilds from raw/, byte for byte."""
import hashlib
import json
import pathlib
import subprocess
import sys

import pytest

from testbed.analysis import formats
from testbed.analysis.pipeline import DERIVED, build_outputs
from testbed.config.arms import ARMS, Arm
from testbed.testing.rundirs import make_run, unit_raw

pytestmark = pytest.mark.unit
CLI = pathlib.Path(sys.executable).with_name("dblp-testbed")


def _digest(run: pathlib.Path) -> dict:
    out = {}
    for name in DERIVED:
        p = run / name
        for f in sorted([p] if p.is_file() else p.rglob("*")):
            if f.is_file():
                out[str(f.relative_to(run))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_report_rebuild_is_identical_and_self_contained(tmp_path):
    run = make_run(tmp_path / "run")
    res = subprocess.run([str(CLI), "report", str(run)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "dblp_vs_static: burst-round 4.00x" in res.stdout
    # The answer last: the verdicts, each without an interval saying why, then the invalid units.
    accuracy = [line for line in res.stdout.splitlines() if line.startswith("  accuracy ")]
    assert accuracy[0].split()[:5] == ["accuracy", "dblp", "vs", "static", "–"]
    assert accuracy[0].endswith("unresolved: too few seeds (1)")
    assert res.stdout.splitlines()[-1] == ("invalid units: none (every unit kept the emulator's "
                                           "invariants)")
    first = _digest(run)
    # 6 CSVs, 7 Parquet tables, summary, report.md/html, 11 plots as PNG and SVG
    # (the tenth: the dblp arm's phase timeline; the eleventh: the intervals' forest plot)
    assert len(first) == 38 and "plots/intervals.svg" in first
    # Derived files deleted or tampered with: the rebuild restores them exactly.
    (run / "summary.json").write_text("{}")
    (run / "rounds.csv").unlink()
    build_outputs(run)
    assert _digest(run) == first
    html = (run / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == 11
    assert "src='plots/" not in html and "http" not in html.split("<body>")[1]
    md = (run / "report.md").read_text()
    # The speedups beside their intervals: two burst rounds give none, and one seed gives the
    # cut none either (the seed is the unit).
    assert "| static | 400.00 | 400.00 | 30.00 | 2.00 | 0.9600 | 4.00x | – | 25.0 % | – |" in md
    # The verdicts come first, one row per claim and pair, each from its interval.
    assert md.split("\n## ")[1].startswith("Verdicts on the paper's claims")
    assert ("| burst_speedup | dblp_vs_static | 4.0-5.88x (5.88x: abstract; 4.0-5.9x: full text) | "
            ">= 4.00x | – | – | unresolved | "
            "only 2 burst rounds on one side (fewer than 3): no interval |") in md
    assert "| train_time_cut | dblp_vs_static |" in md and "unresolved: too few seeds (1)" in md
    assert "up to 5.88x" in md and "24.4 %" in md
    assert "between the bandwidth-bound and pass-bound ratios" in md
    s = json.loads((run / "summary.json").read_text())
    assert s["speedups"]["dblp_vs_gloo"]["burst_round"] == pytest.approx(8.0)


def test_report_on_a_non_run_dir_is_one_line(tmp_path):
    res = subprocess.run([str(CLI), "report", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "no raw/ directory" in res.stderr


def test_broken_invariants_make_units_invalid_and_the_rest_are_kept(tmp_path):
    run = make_run(tmp_path / "run")
    _set_fidelity(run, {("static", 1): {"cpu_busy_frac": 0.97, "cpu_steal_frac": 0.06},
                        ("dblp", 1): {"cpu_busy_frac": 0.5, "ovs_drops": 0,
                                      "cpu_steal_frac": 0.01},
                        ("gloo", 1): {"cpu_busy_frac": 0.6, "cpu_steal_frac": 0.08}})
    s = build_outputs(run)
    assert s["invalid_units"] == [        # in run order: the spec's arms gloo, static, dblp
        {"arm": "gloo", "seed": 1, "reasons": ["cpu steal 8.0 % above 5.0 %"]},
        {"arm": "static", "seed": 1, "reasons": ["cpu busy 97.0 % above 85.0 %",
                                                 "cpu steal 6.0 % above 5.0 %"]}]
    # The manifest's records are kept whole beside the judgement.
    assert s["fidelity"]["dblp"]["1"]["fidelity"] == {"cpu_busy_frac": 0.5, "ovs_drops": 0,
                                                      "cpu_steal_frac": 0.01}
    assert "| static | 1 | cpu busy 97.0 % above 85.0 %; cpu steal 6.0 % above 5.0 % |" in (
        run / "report.md").read_text()


def _set_fidelity(run, records):
    man = json.loads((run / "manifest.json").read_text())
    for u in man["units"]:
        if (u["arm"], u["seed"]) in records:
            u["fidelity"] = records[(u["arm"], u["seed"])]
    (run / "manifest.json").write_text(json.dumps(man))


def test_a_record_without_a_field_is_not_judged_on_it(tmp_path):
    run = make_run(tmp_path / "run", seeds=(1, 2))
    _set_fidelity(run, {("static", 2): {"cpu_busy_frac": 0.95}, ("static", 1): {"ovs_drops": 0}})
    s = build_outputs(run, figures=False)
    assert [(u["arm"], u["seed"]) for u in s["invalid_units"]] == [("static", 2)]
    assert s["fidelity"]["static"]["1"]["fidelity"] == {"ovs_drops": 0}


def _cli(*args):
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content", [b"", b"\x00garbage, not a capture" * 20,
                                     b"\xd4\xc3\xb2\xa1\x02\x00"])   # cut in its file header
def test_unreadable_capture_is_a_warning_naming_it(tmp_path, content):
    run = make_run(tmp_path / "run")
    (unit_raw(run, "dblp") / "server.pcap").write_bytes(content)
    res = _cli("report", run)
    assert res.returncode == 0, res.stderr
    assert "raw/dblp/seed-1/server.pcap unreadable" in res.stdout
    for name in ("rounds.csv", "bursts.csv", "flows.csv", "packets.parquet", "summary.json",
                 "report.md", "report.html"):
        assert (run / name).stat().st_size > 0, name
    s = json.loads((run / "summary.json").read_text())
    assert s["speedups"]["dblp_vs_static"]["burst_round"] == pytest.approx(4.0)


def test_raw_log_with_wrong_types_is_a_warning_naming_it(tmp_path):
    run = make_run(tmp_path / "run")
    w = unit_raw(run, "static") / "worker1.jsonl"
    lines = [json.loads(x) for x in w.read_text().splitlines()]
    bad = next(i for i, e in enumerate(lines) if e["event"] == "round" and e["round"] == 5)
    lines[bad]["comm_s"] = "fast"
    b = unit_raw(run, "static") / "bursts.jsonl"
    blines = [json.loads(x) for x in b.read_text().splitlines()]
    blines[0]["actual_start_ns"] = "soon"
    w.write_text("".join(json.dumps(e) + "\n" for e in lines))
    b.write_text("".join(json.dumps(e) + "\n" for e in blines))
    res = _cli("report", run)
    assert res.returncode == 0, res.stderr
    assert f"raw/static/seed-1/worker1.jsonl:{bad + 1}: round event: field 'comm_s' must be num" \
        in res.stdout
    assert "raw/static/seed-1/bursts.jsonl:1: burst event: field 'actual_start_ns' must be int" \
        in res.stdout
    s = json.loads((run / "summary.json").read_text())
    assert s["arms"]["static"]["rounds"] == 10 and s["bursts"]["per_arm"]["static"] == 1
    assert (run / "report.html").stat().st_size > 0


def test_bad_capture_inside_run_keeps_the_summary(tmp_path):
    """`run` builds the outputs after the run: one bad capture must not cost summary.json."""
    from testbed.run.experiment import report_kept

    run = make_run(tmp_path / "run")
    (unit_raw(run, "gloo") / "worker0.pcap").write_bytes(b"not a pcap")
    assert report_kept(run) is not None
    assert "report_error" not in json.loads((run / "manifest.json").read_text())
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "ok"
    assert any("raw/gloo/seed-1/worker0.pcap unreadable" in w for w in s["warnings"])


def test_a_failed_analysis_after_a_run_is_recorded_and_keeps_the_run(tmp_path):
    """The analysis chained after `run` never costs the run: the manifest says why it failed."""
    from testbed.run.experiment import report_kept

    run = make_run(tmp_path / "run")
    (run / "spec.toml").write_text("this is = not [a spec\n")
    assert report_kept(run) is None
    man = json.loads((run / "manifest.json").read_text())
    assert man["report_error"].startswith("RawError: ") and "spec.toml" in man["report_error"]
    assert (run / "raw").is_dir() and not (run / "summary.json").exists()


@pytest.mark.parametrize("change,needle", [
    ({"schema": 99}, "schema version 99 is unknown"),
    ({"raw_log_schema": 9}, "raw-log schema version 9 is unknown"),
])
def test_report_refuses_an_unknown_version(tmp_path, change, needle):
    run = make_run(tmp_path / "run")
    man = json.loads((run / "manifest.json").read_text())
    man.update(change)
    (run / "manifest.json").write_text(json.dumps(man))
    res = _cli("report", run)
    assert res.returncode == 2 and needle in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "manifest.json" in res.stderr
    assert not (run / "summary.json").exists()


@pytest.mark.parametrize("name,content,needle", [
    ("manifest.json", None, "manifest.json: not found"),
    ("manifest.json", "{", "manifest.json: not readable JSON"),
    ("spec.toml", None, "spec.toml: not found"),
    ("spec.toml", "arms = [", "not valid TOML"),
    ("spec.toml", 'arms = ["nope"]', "unknown arm 'nope'"),
])
def test_report_on_a_broken_run_dir_is_one_line(tmp_path, name, content, needle):
    run = make_run(tmp_path / "run")
    if content is None:
        (run / name).unlink()
    else:
        (run / name).write_text(content)
    res = _cli("report", run)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr


def test_summary_has_one_author_and_the_rounds_table_is_built_once(tmp_path, monkeypatch):
    from testbed.analysis import formats, tables

    run = make_run(tmp_path / "run")
    calls = []
    real = tables.rounds_table
    monkeypatch.setattr(tables, "rounds_table", lambda raw: calls.append(1) or real(raw))
    s = build_outputs(run, figures=False)
    assert len(calls) == 1
    on_disk = formats.read_summary(run)
    assert on_disk == json.loads(json.dumps(s)) and on_disk["schema"] == formats.SUMMARY_SCHEMA


def test_settings_come_from_the_spec_and_the_arms_registry(tmp_path, monkeypatch):
    """P_high and the static bound are the spec's; the baseline pair is found by (control, mode)."""
    # Arm names from which no renaming finds the pair: only the registry can.
    monkeypatch.setitem(ARMS, "phase-aware", Arm("phase-aware", "dblp", "udp", "ps"))
    monkeypatch.setitem(ARMS, "mlt", Arm("mlt", "static", "udp", "ps"))
    run = make_run(tmp_path / "run")
    for old, new in (("static", "mlt"), ("dblp", "phase-aware")):
        (run / "raw" / old).rename(run / "raw" / new)
        for f in (run / "raw" / new).glob("seed-*/*.jsonl"):
            f.write_text(f.read_text().replace(f'"arm": "{old}"', f'"arm": "{new}"'))
    spec = (run / "spec.toml").read_text()
    spec = spec.replace('"static", "dblp"', '"mlt", "phase-aware"')
    # The logs' largest bound is 0.408; the spec says DBLP was configured with 0.5.
    spec = spec.replace("p_high = 0.408", "p_high = 0.5").replace("p_static = 0.008", "p_static = 0.01")
    (run / "spec.toml").write_text(spec)
    man = json.loads((run / "manifest.json").read_text())
    for u in man["units"]:
        u["arm"] = {"static": "mlt", "dblp": "phase-aware"}.get(u["arm"], u["arm"])
    (run / "manifest.json").write_text(json.dumps(man))
    s = build_outputs(run, figures=False)
    assert s["baselines"] == ["gloo", "mlt"]
    pair = s["physics"]["pairs"]["phase-aware_vs_mlt"]
    assert pair["p_high"] == 0.5 and pair["p_low"] == 0.01
    assert any(t["target"].startswith("phase-aware vs mlt: final accuracy") for t in s["targets"])


def test_report_and_run_give_their_answer_as_json(tmp_path, capsys):
    """``--json``: one JSON object on stdout (the verdicts, invalid units, speedups), or in a
    FILE beside the text; `run` ends with the same object (`experiment.finish`)."""
    from testbed.run import experiment
    run = make_run(tmp_path / "run")
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(run), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("\n") == 1
    obj = formats.check_answer(json.loads(res.stdout))
    summary = json.loads((run / "summary.json").read_text())
    assert obj["kind"] == "run" and obj["schema"] == formats.ANSWER_SCHEMA
    assert obj["run_dir"] == str(run) and obj["summary"] == str(run / "summary.json")
    assert obj["verdicts"] == summary["verdicts"] and obj["invalid_units"] == []
    assert obj["speedups"]["dblp_vs_static"]["burst_round"] == \
        summary["speedups"]["dblp_vs_static"]["burst_round"]
    out = tmp_path / "answer.json"
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(run), "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "burst_speedup" in res.stdout   # the text stays
    assert json.loads(out.read_text()) == obj
    # `run` ends with the same object; an invalid unit makes its status "invalid".
    summary["invalid_units"] = [{"arm": "dblp", "seed": 1, "reasons": ["CPU busy 93 %"]}]
    capsys.readouterr()
    assert experiment.finish("ok", summary, run, "-") == experiment.INVALID
    obj = json.loads(capsys.readouterr().out)
    assert obj["status"] == "invalid" and obj["invalid_units"][0]["arm"] == "dblp"
    assert experiment.finish("error", None, run, "-") == "error"
    assert json.loads(capsys.readouterr().out) == {
        "kind": "run", "schema": formats.ANSWER_SCHEMA,
        "run_dir": str(run), "status": "error", "summary": None, "verdicts": [],
        "invalid_units": [], "speedups": {}, "warnings": []}
