"""Analysis of a real run's logs: the dblp arm trained on loopback by the workloads' own launcher.

No hand-written numbers here: every expectation is recomputed from the JSON
lines the worker and server processes wrote, so this checks that the
analysis reads the logs the orchestrator will actually collect.
"""
import json

import pandas as pd
import pytest

from testbed.analysis.pipeline import build_outputs
from testbed.config import spec as specmod
from testbed.rundir import Manifest
from workloads.loopback import read_jsonl, run_arm

pytestmark = pytest.mark.unit
ROUNDS, WORKERS = 8, 2


@pytest.fixture(scope="module")
def loopback_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("loopback")
    res = run_arm("dblp", str(out), workers=WORKERS, rounds=ROUNDS, timeout_s=150, seed=1,
                  training={"eval_every": 4})
    assert res["status"] == "ok", res
    # The loopback launcher writes raw/ only; the settings the analysis reads
    # come from the spec and manifest a run directory always has.
    spec = specmod.load(None, overrides=["name=loopback", "arms=dblp",
                                          f"placement.workers={WORKERS}"])
    (out / "spec.toml").write_text(spec.to_toml())
    manifest = Manifest(out, spec)
    manifest.unit("dblp", 1, status="ok")
    manifest.finish("ok")
    return out


def test_real_logs_analyse(loopback_run):
    raw = loopback_run / "raw" / "dblp" / "seed-1"   # the spec's seed, the run_arm's
    logs = [read_jsonl(raw / f"worker{r}.jsonl") for r in range(WORKERS)]
    server = read_jsonl(raw / "server.jsonl")
    by_round = {}
    for log in logs:
        for e in log:
            if e["event"] == "round":
                by_round.setdefault(e["round"], []).append(e)
    # A burst window that only round 5 covers: after round 4's last end, before round 6's first start.
    lo = max(e["t_end_ns"] for e in by_round[4])
    hi = min(e["t_start_ns"] for e in by_round[6])
    assert hi - lo > 4
    (raw / "bursts.jsonl").write_text(json.dumps({
        "event": "burst", "arm": "dblp", "id": "b5", "kind": "loss", "target": "server-downlink",
        "params": {"p": 0.8}, "trigger": "manual", "requested_start_ns": lo + 1,
        "requested_end_ns": hi - 1, "actual_start_ns": lo + 1, "actual_end_ns": hi - 1,
        "dropped_packets": 0, "seen_packets": 10}) + "\n")

    s = build_outputs(loopback_run)
    # Every line the real processes wrote matches the raw-log declaration.
    assert not [w for w in s["warnings"] if w.startswith("raw/")], s["warnings"]
    r = pd.read_csv(loopback_run / "rounds.csv")
    assert s["status"] == "ok" and s["arms"]["dblp"]["rounds"] == ROUNDS
    assert r["round"].tolist() == list(range(ROUNDS))
    assert r[r["in_burst"]]["round"].tolist() == [5]
    assert s["arms"]["dblp"]["burst_rounds"] == 1
    assert s["arms"]["dblp"]["burst_round_ms_p50"] == pytest.approx(r.loc[5, "latency_ms"])
    assert s["bursts"]["measured_loss"] == 0.0
    for rnd, ws in by_round.items():
        row = r[r["round"] == rnd].iloc[0]
        assert row["stats_bytes_sent"] == sum(e["stats"]["bytes_sent"] for e in ws)
        assert row["t_start_ns"] == min(e["t_start_ns"] for e in ws)
        assert row["t_end_ns"] == max(e["t_end_ns"] for e in ws)
        assert row["comm_ms_max"] == pytest.approx(1e3 * max(e["comm_s"] for e in ws))
        assert 0 < row["latency_ms"] <= row["comm_ms_max"] + 1e-6
        assert row["bound"] == ws[0]["bound"] and row["phase"] == ws[0]["phase"]
    srv = {e["round"]: e for e in server if e["event"] == "round"}
    assert r["server_stats_bytes_sent"].tolist() == [srv[i]["stats"]["bytes_sent"] for i in range(ROUNDS)]
    ends = [e for log in logs for e in log if e["event"] == "end"]
    assert s["arms"]["dblp"]["train_time_s"] == pytest.approx(max(e["train_time_s"] for e in ends))
    evals = [e for e in logs[0] if e["event"] == "eval"]
    assert s["arms"]["dblp"]["final_accuracy"] == pytest.approx(evals[-1]["test_accuracy"])
    assert (loopback_run / "report.html").stat().st_size > 10_000
