"""The real worker/server entry points train on loopback with torchrun-style variables (no Mininet).

This is the issue's "same worker runs outside Mininet" test: separate
processes, 127.0.0.1 with distinct ports, the same logs the orchestrator
collects on emulated hosts.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.testing.workers import EVAL_KEYS, ControlListener, check_worker_log
from workloads import worker
from workloads.loopback import free_port, read_jsonl, run_arm, write_transport_config


@pytest.mark.unit
def test_gloo_three_workers_train_on_loopback(tmp_path):
    rounds = 100
    res = run_arm("gloo", str(tmp_path), workers=3, rounds=rounds, timeout_s=180,
                  training={"eval_every": 50}, worker_args=["--eval-ranks", "all"])
    assert res["status"] == "ok", (res, open(tmp_path / "raw/gloo/seed-0/worker0.err").read())
    finals = []
    for rank in range(3):
        recs = check_worker_log(tmp_path / f"raw/gloo/seed-0/worker{rank}.jsonl", "gloo", rank,
                                rounds)
        evals = [r for r in recs if r["event"] == "eval"]
        assert [e["round"] for e in evals] == [49, 99] and EVAL_KEYS <= set(evals[0])
        finals.append(evals[-1]["test_accuracy"])
        losses = [r["loss"] for r in recs if r["event"] == "round"]
        assert sum(losses[-10:]) < 0.5 * sum(losses[:10])
    # all-reduce keeps the replicas identical, so they evaluate identically
    assert finals[0] == finals[1] == finals[2] and finals[0] >= 0.85


@pytest.mark.unit
def test_local_arm_needs_no_peers_and_reads_torchrun_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    log = tmp_path / "w.jsonl"
    assert worker.main(["--arm", "local", "--rounds", "30", "--eval-every", "0",
                        "--eval-ranks", "all", "--log", str(log)]) == 0
    recs = check_worker_log(log, "local", 2, 30)
    assert recs[0]["world_size"] == 3
    assert [r["round"] for r in recs if r["event"] == "eval"] == [29]


@pytest.mark.unit
def test_bad_knobs_are_named():
    with pytest.raises(SystemExit, match="RANK"):
        worker.resolve(worker.build_parser().parse_args(["--arm", "local", "--rank", "3",
                                                          "--world-size", "3"]))
    with pytest.raises(SystemExit, match="MASTER_PORT"):
        os.environ.pop("MASTER_PORT", None)
        worker.resolve(worker.build_parser().parse_args(["--arm", "gloo", "--world-size", "2"]))
    import dblp
    a = worker.resolve(worker.build_parser().parse_args(["--arm", "static", "--world-size", "3"]))
    assert a.master_port == dblp.DEFAULT_PORT           # the transport's well-known port
    with pytest.raises(SystemExit, match="--transport-config"):
        worker.resolve(worker.build_parser().parse_args(["--arm", "local", "--transport-config",
                                                          "x.json"]))


@pytest.mark.unit
def test_gloo_worker_reports_a_dead_peer_and_exits_with_error(tmp_path):
    port = free_port()
    procs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "workloads.worker", "--arm", "gloo", "--rounds", "100000",
             "--timeout-s", "20", "--log", str(tmp_path / f"w{rank}.jsonl")],
            env=env, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:     # wait until they are training
            if len([r for r in read_jsonl(tmp_path / "w0.jsonl") if r["event"] == "round"]) > 20:
                break
            time.sleep(0.2)
        procs[2].send_signal(signal.SIGKILL)
        codes = [p.wait(60) for p in procs[:2]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [1, 1]
    for rank in (0, 1):
        end = read_jsonl(tmp_path / f"w{rank}.jsonl")[-1]
        assert end["event"] == "end" and end["status"] == "error" and end["error"]
        assert "training failed" in procs[rank].stderr.read()


@pytest.mark.unit
@pytest.mark.parametrize("arm", ["reliable", "dblp"])
def test_dblp_arms_train_through_the_transport_and_announce_rounds(tmp_path, monkeypatch, arm):
    """Server + 3 workers over dblp on loopback; the server announces every round on a real socket."""
    sock = str(tmp_path / "ctl.sock")
    lis = ControlListener(sock)
    monkeypatch.setenv("DBLP_CONTROL_SOCKET", sock)
    rounds = 50
    try:
        res = run_arm(arm, str(tmp_path), workers=3, rounds=rounds, timeout_s=180,
                      training={"eval_every": 25}, worker_args=["--eval-ranks", "all"],
                      transport={"round_timeout": 20.0})
    finally:
        lis.close()
    raw = tmp_path / "raw" / arm / "seed-0"   # run_arm's default seed
    assert res["status"] == "ok", (res, (raw / "server.err").read_text(), (raw / "worker0.err").read_text())
    finals = []
    for rank in range(3):
        recs = check_worker_log(raw / f"worker{rank}.jsonl", arm, rank, rounds)
        rr = [r for r in recs if r["event"] == "round"]
        assert all(r["stats"]["chunks"] > 0 and r["stats"]["latency_s"] > 0 for r in rr)
        finals.append([r["test_accuracy"] for r in recs if r["event"] == "eval"])
        losses = [r["loss"] for r in rr]
        assert sum(losses[-10:]) < 0.95 * sum(losses[:10])
    assert finals[0] == finals[1] == finals[2]          # bit-identical replicas
    assert finals[0][-1] > 0.3                          # 3x chance after 50 rounds
    srv = read_jsonl(raw / "server.jsonl")
    assert srv[0]["event"] == "start" and srv[0]["role"] == "server" and srv[-1]["status"] == "ok"
    srounds = [r for r in srv if r["event"] == "round"]
    assert [r["round"] for r in srounds] == list(range(rounds))
    if arm == "reliable":
        assert all(r["bound"] == 0 and r["stats"]["missing_at_stop"] == 0 for r in srounds)
    else:   # dblp starts critical at P_low and the phase detector runs every 10 rounds
        assert srounds[0]["phase"] == "critical" and srounds[0]["bound"] == pytest.approx(0.008)
        assert {r["phase"] for r in srounds} <= {"critical", "relaxed"}
    events = [(g.event, g.round) for g in lis.got]    # RoundRequests, as the controller decodes them
    assert events == [(e, r) for r in range(rounds) for e in ("start", "end")]
    assert all(g.arm == arm for g in lis.got)


@pytest.mark.unit
def test_dblp_worker_and_server_report_a_dead_worker(tmp_path):
    port = free_port()
    env0 = dict(os.environ, WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = write_transport_config("static", str(tmp_path), round_timeout=4.0)
    srv = subprocess.Popen([sys.executable, "-m", "workloads.server", "--arm", "static",
                            "--rounds", "100000", "--transport-config", cfg, "--host", "127.0.0.1",
                            "--log", str(tmp_path / "server.jsonl")], env=env0,
                           stderr=subprocess.PIPE, text=True)
    procs = [srv]
    for rank in range(3):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "workloads.worker", "--arm", "static", "--rounds", "100000",
             "--transport-config", cfg, "--log", str(tmp_path / f"w{rank}.jsonl")],
            env=dict(env0, RANK=str(rank)), stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if len([r for r in read_jsonl(tmp_path / "w0.jsonl") if r["event"] == "round"]) > 5:
                break
            time.sleep(0.2)
        procs[3].send_signal(signal.SIGKILL)            # worker 2 dies
        codes = [p.wait(60) for p in procs[:3]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [1, 1, 1]
    for name in ("server.jsonl", "w0.jsonl", "w1.jsonl"):
        end = read_jsonl(tmp_path / name)[-1]
        assert end["event"] == "end" and end["status"] == "error" and end["error"], (name, end)


@pytest.mark.unit
def test_server_refuses_arms_without_a_server():
    r = subprocess.run([sys.executable, "-m", "workloads.server", "--arm", "gloo", "--world-size", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no aggregation server" in r.stderr
