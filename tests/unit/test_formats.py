"""The declared formats: raw-log events, manifest.json and summary.json, writers against readers."""
import json
import pathlib
import re

import pytest

from controllers.bursts import BurstRecord, BurstSpec
from testbed import rundir
from testbed.analysis import formats
from testbed.config import spec as specmod
from workloads import runlog

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _round(**over) -> dict:
    rec = {"event": "round", "arm": "dblp", "role": "worker", "rank": 0, "round": 1, "epoch": 0,
           "t_start_ns": 1, "t_end_ns": 2, "compute_s": 0.1, "comm_s": 0.2, "bound": None,
           "phase": None, "loss": 1.5, "stats": {}}
    rec.update(over)
    return rec


def test_writer_output_is_what_the_reader_accepts(tmp_path):
    log = runlog.RunLog(str(tmp_path / "w.jsonl"), "dblp", "worker", 0)
    rec = log.write("round", **{k: v for k, v in _round(loss=float("nan")).items()
                                if k not in ("event", "arm", "role", "rank")})
    log.close()
    line = json.loads((tmp_path / "w.jsonl").read_text())
    assert line == rec and line["loss"] is None      # NaN travels as null
    assert runlog.check_event(line) == line


def test_writer_refuses_an_undeclared_or_mistyped_field(tmp_path):
    log = runlog.RunLog(str(tmp_path / "w.jsonl"), "dblp", "worker", 0)
    with pytest.raises(runlog.MalformedEvent, match="undeclared field.*t_comm_start_ns"):
        log.write("eval", round=1, epoch=0, t_ns=1, test_accuracy=0.5, test_loss=0.1,
                  t_comm_start_ns=5)
    with pytest.raises(runlog.MalformedEvent, match="'t_ns' must be int"):
        log.write("eval", round=1, epoch=0, t_ns="now", test_accuracy=0.5, test_loss=0.1)
    with pytest.raises(runlog.MalformedEvent, match="unknown event 'phase'"):
        log.write("phase", phase="critical")
    log.close()
    assert (tmp_path / "w.jsonl").read_text() == ""


@pytest.mark.parametrize("over,needle", [
    ({"rank": "0"}, "'rank' must be int"),
    ({"rank": True}, "'rank' must be int"),          # a bool is not a number
    ({"comm_s": None}, "'comm_s' is null"),
    ({"stats": []}, "'stats' must be dict"),
    ({"round_id": 3}, "undeclared field(s) round_id"),
])
def test_reader_names_the_field(over, needle):
    with pytest.raises(runlog.MalformedEvent, match=re.escape(needle)):
        runlog.check_event(_round(**over))


def test_controller_burst_line_matches_the_declaration():
    """The controller writes `burst` lines; the declaration the analysis reads must fit them."""
    spec = BurstSpec.from_dict({"kind": "loss", "target": "server-downlink", "params": {"p": 0.8},
                                "at_round": 5, "rounds": 1}, "b1")
    rec = BurstRecord(spec, "dblp", requested_start_ns=10)
    assert runlog.check_event(rec.log_line())
    rec.actual_start_ns, rec.actual_end_ns, rec.requested_end_ns = 11, 20, 19
    rec.dropped_packets, rec.seen_packets, rec.round = 3, 9, 5
    rec.error, rec.detail = "meter failed", {"ports": [1]}
    assert runlog.check_event(json.loads(json.dumps(rec.log_line())))
    # A burst a unit announced carries the unit's seed and goes to the unit's directory.
    assert "seed" not in rec.log_line() and rec.log_dir("/r") == "/r/dblp"
    rec.seed = 3
    assert runlog.check_event(rec.log_line())["seed"] == 3
    assert rec.log_dir("/r") == runlog.unit_dir("/r", "dblp", 3) == "/r/dblp/seed-3"


def test_the_controllers_copy_of_the_unit_layout_is_the_workloads():
    from controllers.bursts import record_dir
    for arm, seed in (("dblp", 0), ("static-high", 12), ("gloo", 2**31 - 1)):
        assert record_dir("/run/raw", arm, seed) == runlog.unit_dir("/run/raw", arm, seed)
        assert runlog.seed_of_dir(pathlib.Path(record_dir("/x", arm, seed)).name) == seed
    assert [runlog.seed_of_dir(n) for n in ("seed-", "seed-01", "seed-x", "s-1", "seed--1")] == \
        [None] * 5


def _spec():
    return specmod.load(None, overrides=["name=t", "arms=gloo,static,dblp"])


def test_manifest_round_trip_and_declaration(tmp_path):
    m = rundir.Manifest(tmp_path, _spec(), {"ovs": True})
    m.update(dblp_port=47474, rtt_ms=None, placement={"server": "h1", "workers": ["h2"]},
             fabric_startup_s=1.5)
    # The fidelity record the runner stores per arm (CpuSampler + BottleneckMonitor.summary).
    m.unit("dblp", 1, status="ok", started_ns=1, ended_ns=2,
          fidelity={"cpu_busy_frac": 0.5, "cpu_steal_frac": 0.0, "bottleneck": "s1-eth1",
                    "shaped_mbps": 20.0,
                    "achieved_mbps": 19.0, "queue_drops": None, "ovs_drops": 0})
    m.finish("ok")
    data = rundir.read_manifest(tmp_path)
    assert data["schema"] == rundir.MANIFEST_SCHEMA
    assert data["raw_log_schema"] == runlog.SCHEMA_VERSION
    with pytest.raises(ValueError, match="undeclared field.*addresses"):
        m.update(addresses={"server": "10.0.0.1"})
    with pytest.raises(ValueError, match="fidelity: undeclared field.*flags"):
        m.unit("gloo", 1, fidelity={"flags": ["x"]})
    assert rundir.read_manifest(tmp_path) == data == m.data   # a refused update changes nothing


def test_manifest_records_every_unit_in_run_order(tmp_path):
    spec = specmod.load(None, overrides=["name=t", "arms=gloo,dblp", "seed=5", "seeds=2"])
    m = rundir.Manifest(tmp_path, spec)
    assert m.data["seed"] == 5 and m.data["seeds"] == [5, 6]
    assert [(u["arm"], u["seed"], u["status"]) for u in m.data["units"]] == [
        ("gloo", 5, "pending"), ("dblp", 5, "pending"), ("gloo", 6, "pending"),
        ("dblp", 6, "pending")]
    m.unit("dblp", 6, status="failed", error="x")
    m.unit("gloo", 5, status="ok", started_ns=1, ended_ns=2)
    data = rundir.read_manifest(tmp_path)
    assert [u["status"] for u in rundir.unit_records(data)] == ["ok", "pending", "pending", "failed"]
    assert [u["seed"] for u in rundir.unit_records(data, "dblp")] == [5, 6]
    with pytest.raises(ValueError, match="no unit arm dblp seed 7"):
        m.unit("dblp", 7, status="ok")
    assert rundir.unit_dir(tmp_path, "dblp", 6) == tmp_path / "raw" / "dblp" / "seed-6"


def test_manifest_of_schema_1_is_refused_in_one_line(tmp_path):
    """A run directory from before repeated seeds: per-arm records, raw/<arm>/."""
    old = {"schema": 1, "raw_log_schema": 2, "name": "t", "seed": 1,
           "arms": {"dblp": {"status": "ok"}}, "status": "ok", "started_utc": "x",
           "started_ns": 1, "pid": 1, "environment": {}, "capabilities": {}}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(rundir.ManifestError) as exc:
        rundir.read_manifest(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and "schema version 1 is from before repeated seeds" in msg
    assert "cannot re-analyse it: run its spec.toml again" in msg


@pytest.mark.parametrize("change,needle", [
    ({"schema": 7}, "schema version 7 is unknown"),
    # a later version's new field: refused by the version, which says what to do about it
    ({"schema": 7, "new_field": 1}, "schema version 7 is unknown"),
    ({"units": [{"arm": "dblp", "seed": 1, "status": "ok"}] * 2}, "arm dblp seed 1 is listed twice"),
    ({"units": [{"arm": "dblp", "status": "ok"}]}, "units[0]: field 'seed' missing"),
    ({"raw_log_schema": 9}, "raw-log schema version 9 is unknown"),
    ({"rtt_ms": "5"}, "'rtt_ms' must be num"),
])
def test_manifest_reader_refuses(tmp_path, change, needle):
    rundir.Manifest(tmp_path, _spec())
    data = json.loads((tmp_path / "manifest.json").read_text())
    data.update(change)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(rundir.ManifestError, match=re.escape(needle)):
        rundir.read_manifest(tmp_path)


def test_manifest_of_schema_2_still_reads(tmp_path):
    """Version 3 only added the optional fidelity "cpu_steal_frac": a version 2 run reads."""
    m = rundir.Manifest(tmp_path, _spec())
    m.unit("dblp", 1, status="ok", fidelity={"cpu_busy_frac": 0.5})
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["schema"] = 2
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    units = rundir.read_manifest(tmp_path)["units"]
    assert [u["fidelity"] for u in units if u["arm"] == "dblp"] == [{"cpu_busy_frac": 0.5}]


def test_summary_writer_refuses_an_undeclared_key(tmp_path):
    with pytest.raises(ValueError, match="field 'schema' missing"):
        formats.write_summary(tmp_path / "summary.json", {"arms": {}})
    assert not (tmp_path / "summary.json").exists()


def test_no_citation_of_documents_or_issues_outside_the_repository():
    files = [*(ROOT / "testbed" / "analysis").glob("*.py"), ROOT / "workloads" / "runlog.py",
             ROOT / "workloads" / "worker.py", ROOT / "workloads" / "server.py",
             ROOT / "testbed" / "rundir.py", ROOT / "testbed" / "references.py"]
    for f in files:
        text = f.read_text()
        assert "COMMON.md" not in text, f
        assert not re.search(r"\b[Ii]ssue \d", text), f


def _v3_summary(tmp_path) -> dict:
    from testbed.analysis.pipeline import build_outputs
    from testbed.testing.rundirs import make_run
    # Two seeds: every figure with one value per seed has an interval (issue 55).
    return build_outputs(make_run(tmp_path / "run", seeds=(1, 2)), figures=False)


def test_summary_3_declares_intervals_verdicts_and_time_to_target(tmp_path):
    s = _v3_summary(tmp_path)
    assert s["schema"] == formats.SUMMARY_SCHEMA == 9 and 3 in formats.KNOWN_SUMMARY_SCHEMAS
    assert [(v["claim"], v["pair"]) for v in s["verdicts"]] == [
        ("burst_speedup", "dblp_vs_static"), ("train_time_cut", "dblp_vs_static"),
        ("accuracy", "dblp_vs_static"), ("tail_latency", "dblp_vs_static"),
        ("tail_latency", "dblp_vs_gloo"), ("mean_latency", "dblp_vs_static"),
        ("mean_latency", "dblp_vs_gloo")]
    assert s["arms"]["dblp"]["time_to_target_s"] == s["time_to_target"]["per_arm"]["dblp"][
        "t_s_median"]
    fig = s["intervals"]["dblp_vs_static"]["figures"]["train_time_cut"]
    assert set(fig["interval"]) == {f.name for f in formats.INTERVAL_FIELDS}
    assert s["time_to_target"]["per_arm"]["dblp"]["reached"] == 2
    assert formats.read_summary(tmp_path / "run")["verdicts"] == s["verdicts"]


@pytest.mark.parametrize("path,value,needle", [
    (("intervals", "dblp_vs_static", "figures", "train_time_cut", "interval", "lo"), "low",
     "intervals.dblp_vs_static.figures.train_time_cut.interval: field 'lo' must be num"),
    (("verdicts", 2, "verdict"), None, "verdicts[2]: field 'verdict' is null"),
    (("verdicts", 0, "why"), "x", "verdicts[0]: undeclared field(s) why"),
    (("verdicts", 1, "interval", "n_seeds"), 1.0,
     "verdicts[1].interval: field 'n_seeds' must be int"),
    (("time_to_target", "per_arm", "gloo", "reached"), 1.5,
     "time_to_target.gloo: field 'reached' must be int"),
])
def test_summary_reader_names_the_bad_field_of_the_new_sections(tmp_path, path, value, needle):
    s = _v3_summary(tmp_path)
    node = s
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (tmp_path / "run" / "summary.json").write_text(json.dumps(s))
    with pytest.raises(formats.FormatError, match=re.escape(needle)):
        formats.read_summary(tmp_path / "run")


def test_summary_reader_refuses_a_version_from_the_future(tmp_path):
    s = _v3_summary(tmp_path)
    newest = max(formats.KNOWN_SUMMARY_SCHEMAS)
    s["schema"] = newest + 1
    (tmp_path / "run" / "summary.json").write_text(json.dumps(s))
    known = ", ".join(str(v) for v in range(1, newest + 1))
    with pytest.raises(formats.FormatError,
                       match=f"schema version {newest + 1}, this dblp-testbed reads {known};"):
        formats.read_summary(tmp_path / "run")


@pytest.mark.parametrize("path,value,needle", [
    (("invalid_units", 0, "seed"), "2", "invalid_units[0]: field 'seed' must be int"),
    (("verdicts", 0, "left_out", 0, "reasons"), None,
     "verdicts[0].left_out[0]: field 'reasons' is null"),
    (("intervals", "dblp_vs_static", "left_out", 0, "why"), "x",
     "intervals.dblp_vs_static.left_out[0]: undeclared field(s) why"),
])
def test_summary_4_names_the_bad_field_of_its_invalid_units(tmp_path, path, value, needle):
    unit = {"arm": "static", "seed": 1, "reasons": ["cpu busy 95.0 % above 85.0 %"]}
    s = _v3_summary(tmp_path)
    s["invalid_units"] = [dict(unit)]
    s["verdicts"][0]["left_out"] = [dict(unit)]
    s["intervals"]["dblp_vs_static"]["left_out"] = [dict(unit)]
    formats.check_summary(s)
    node = s
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (tmp_path / "run" / "summary.json").write_text(json.dumps(s))
    with pytest.raises(formats.FormatError, match=re.escape(needle)):
        formats.read_summary(tmp_path / "run")
