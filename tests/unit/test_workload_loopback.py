"""The real worker/server entry points train on loopback with torchrun-style variables (no Mininet).

This is the issue's "same worker runs outside Mininet" test: separate
processes, 127.0.0.1 with distinct ports, the same logs the orchestrator
collects on emulated hosts.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from workloads import worker
from workloads.loopback import free_port, read_jsonl, run_arm

ROUND_KEYS = {"event", "arm", "role", "rank", "round", "epoch", "t_start_ns", "t_end_ns",
              "compute_s", "comm_s", "bound", "phase", "loss", "stats"}
START_KEYS = {"event", "arm", "role", "rank", "model", "params", "grad_bytes", "world_size",
              "seed", "t_ns"}
EVAL_KEYS = {"event", "arm", "role", "rank", "round", "epoch", "t_ns", "test_accuracy", "test_loss"}


def check_worker_log(path, arm, rank, rounds):
    recs = read_jsonl(path)
    kinds = [r["event"] for r in recs]
    assert kinds[0] == "start" and kinds[-1] == "end", kinds[:3]
    assert START_KEYS <= set(recs[0]) and recs[0]["grad_bytes"] == 4 * recs[0]["params"]
    rounds_ = [r for r in recs if r["event"] == "round"]
    assert [r["round"] for r in rounds_] == list(range(rounds))
    for r in rounds_:
        assert ROUND_KEYS <= set(r) and r["arm"] == arm and r["rank"] == rank
        assert r["t_start_ns"] <= r["t_end_ns"] and r["compute_s"] >= 0 and r["comm_s"] >= 0
    assert recs[-1]["status"] == "ok" and recs[-1]["train_time_s"] > 0
    return recs


@pytest.mark.unit
def test_gloo_three_workers_train_on_loopback(tmp_path):
    rounds = 100
    res = run_arm("gloo", str(tmp_path), workers=3, rounds=rounds, timeout_s=180,
                  worker_args=["--eval-every", "50", "--eval-ranks", "all"])
    assert res["status"] == "ok", (res, open(tmp_path / "raw/gloo/worker0.err").read())
    finals = []
    for rank in range(3):
        recs = check_worker_log(tmp_path / f"raw/gloo/worker{rank}.jsonl", "gloo", rank, rounds)
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
    with pytest.raises(SystemExit, match="--knob"):
        worker.resolve(worker.build_parser().parse_args(["--arm", "local", "--knob", "p"]))


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
