"""The ddp integration: unmodified DistributedDataParallel over a torch.distributed backend.

The worker entry point the fabric runs, on loopback: the same processes, logs
and round announcements as on emulated hosts, trained once through DDP and
once through the flat loop with the same transport, seeds and data; over
dblp's backend (the ``ddp`` arm), gloo's (``ddp-gloo``) and one a module
outside the project registers (a spec's ``[ddp.NAME]``).
"""
import os
import pathlib

import pytest

from testbed.config.arms import ARMS
from testbed.testing.workers import ControlListener, check_worker_log
from workloads import worker
from workloads.ddp_exchange import DBLP_BACKEND, merge_round_stats
from workloads.loopback import read_jsonl, run_arm, write_transport_config

HERE = pathlib.Path(__file__).resolve().parent

pytestmark = pytest.mark.unit

BUCKET = dict(round=3, rank=1, role="peer", mode="sharded", control="udp", latency_s=0.2,
              bound=0.008, phase="critical", next_bound=0.008, chunks=300, bytes_sent=1000,
              chunks_sent=310, retransmitted=10, missing_at_stop=0.01, pull_missing=0.0,
              probe_rounds=1, passes_push=2, passes_pull=1, push_s=0.1, pull_first_s=0.12,
              pull_stop_s=0.19, rtt_s=0.001, pace_late_s=0.001, pace_busy_s=0.1, grad_norm=3.0,
              counters={"stale": 1, "late": 2})


def test_a_steps_bucket_rounds_merge_into_one_round():
    small = dict(BUCKET, latency_s=0.1, bound=0.408, phase="relaxed", chunks=100,
                 bytes_sent=500, chunks_sent=100, retransmitted=0, missing_at_stop=0.05,
                 passes_push=3, grad_norm=4.0, counters={"late": 1, "foreign": 1})
    m = merge_round_stats([small, BUCKET])
    assert m["buckets"] == 2
    assert m["latency_s"] == pytest.approx(0.3)       # the step's time in rounds
    assert (m["chunks"], m["bytes_sent"], m["chunks_sent"], m["retransmitted"]) == \
        (400, 1500, 410, 10)
    assert (m["bound"], m["phase"]) == (0.008, "critical")    # the bulk bucket's (300 chunks)
    assert m["passes_push"] == 3 and m["passes_pull"] == 1    # the worst bucket's
    assert m["missing_at_stop"] == pytest.approx((0.01 * 300 + 0.05 * 100) / 400)
    assert m["grad_norm"] == pytest.approx(5.0)               # the norm over both buckets
    assert m["counters"] == {"stale": 1, "late": 3, "foreign": 1}
    assert merge_round_stats([dict(BUCKET, grad_norm=None), small])["grad_norm"] is None
    one = merge_round_stats([BUCKET])
    assert one["buckets"] == 1 and one["missing_at_stop"] == pytest.approx(0.01)
    assert {k: v for k, v in one.items() if k not in ("buckets", "missing_at_stop")} == \
        {k: v for k, v in BUCKET.items() if k != "missing_at_stop"}
    assert merge_round_stats([]) == {}


def test_the_worker_refuses_ddp_where_the_torch_backend_cannot_run(tmp_path):
    parse = worker.build_parser().parse_args
    with pytest.raises(SystemExit, match="--integration ddp: .*'local' has none"):
        worker.resolve(parse(["--arm", "local", "--integration", "ddp"]))
    ps = write_transport_config("dblp", str(tmp_path))     # parameter-server mode
    with pytest.raises(SystemExit, match="--integration ddp: .*'sharded' only"):
        worker.resolve(parse(["--arm", "dblp", "--integration", "ddp", "--transport-config", ps]))
    port = ["--master-port", "1"]
    with pytest.raises(SystemExit, match="reached by backend 'gloo', not 'mpi'"):
        worker.resolve(parse(["--arm", "gloo", "--integration", "ddp", "--backend", "mpi"] + port))
    with pytest.raises(SystemExit, match="'c10d' is a torch.distributed backend the arm names"):
        worker.resolve(parse(["--arm", "c10d", "--integration", "ddp"] + port))
    with pytest.raises(SystemExit, match="'c10d' has no flat exchange"):
        worker.resolve(parse(["--arm", "c10d", "--backend", "mpi"] + port))
    with pytest.raises(SystemExit, match="arm c10d needs --master-port"):
        worker.resolve(parse(["--arm", "c10d", "--integration", "ddp", "--backend", "mpi"]))
    # Over gloo the backend is the transport's own unless named.
    args = worker.resolve(parse(["--arm", "gloo", "--integration", "ddp"] + port))
    assert (args.backend, args.backend_module, args.timeout_s) == ("gloo", None, 60.0)
    assert worker.resolve(parse(["--arm", "gloo"] + port)).backend is None


def test_the_backend_names_the_harness_copies_are_torchs_own():
    import dblp.torch_backend

    assert DBLP_BACKEND == dblp.torch_backend.BACKEND


def test_ddp_trains_as_the_flat_loop_does_and_logs_its_rounds_alike(tmp_path, monkeypatch):
    rounds, arm = 12, "reliable"   # bound 0: both loops average exactly the same gradients
    common = dict(workers=3, rounds=rounds, timeout_s=180, training={"eval_every": 6},
                  transport={"mode": "sharded", "round_timeout": 20.0})
    evals = ["--eval-ranks", "all"]
    flat = run_arm(arm, str(tmp_path / "flat"), worker_args=evals, **common)
    sock = str(tmp_path / "ctl.sock")
    lis = ControlListener(sock)
    monkeypatch.setenv("DBLP_CONTROL_SOCKET", sock)
    try:
        ddp = run_arm(arm, str(tmp_path / "ddp"), worker_args=evals + ["--integration", "ddp"],
                      **common)
    finally:
        lis.close()
    raw = {k: tmp_path / k / "raw" / arm / "seed-0" for k in ("flat", "ddp")}
    assert flat["status"] == "ok", (flat, (raw["flat"] / "worker0.err").read_text())
    assert ddp["status"] == "ok", (ddp, (raw["ddp"] / "worker0.err").read_text())
    assert not (raw["ddp"] / "server.jsonl").exists()      # sharded: no server
    accuracies = []
    for rank in range(3):
        recs = check_worker_log(raw["ddp"] / f"worker{rank}.jsonl", arm, rank, rounds)
        rr = [r for r in recs if r["event"] == "round"]
        for r in rr:
            st = r["stats"]
            assert st["buckets"] >= 1 and st["chunks"] > 0 and st["latency_s"] > 0
            assert r["comm_s"] == pytest.approx(st["latency_s"])
            assert (r["bound"], r["phase"]) == (0.0, "reliable") and st["mode"] == "sharded"
            assert r["comm_cpu_s"] >= 0 and r["compute_cpu_s"] >= 0
        # The same model, shards and batch order as the flat loop, averaged exactly: the
        # losses agree up to the order of summation.
        base = [r["loss"] for r in read_jsonl(raw["flat"] / f"worker{rank}.jsonl")
                if r["event"] == "round"]
        assert [r["loss"] for r in rr] == pytest.approx(base, rel=1e-3)
        accuracies.append([r["test_accuracy"] for r in recs if r["event"] == "eval"])
    assert accuracies[0] == accuracies[1] == accuracies[2]     # DDP keeps the replicas identical
    assert accuracies[0][-1] == pytest.approx(flat["final_accuracy"], abs=0.02)
    # Rank 0 announced every round on the control socket: round-locked bursts find them.
    assert [(g.event, g.round) for g in lis.got] == \
        [(e, r) for r in range(rounds) for e in ("start", "end")]
    assert all(g.arm == arm for g in lis.got)


def _ddp_round_checks(raw, label, rounds, bound):
    """Every rank's rounds as the ddp arm logs them, over a backend that reports nothing:
    comm_s is the sum of the step's timed buckets; the per-rank records."""
    out = []
    for rank in range(3):
        recs = check_worker_log(raw / f"worker{rank}.jsonl", label, rank, rounds)
        rr = [r for r in recs if r["event"] == "round"]
        for r in rr:
            st = r["stats"]
            assert set(st) == {"latency_s", "payload_bytes", "buckets"}
            assert st["buckets"] >= 1 and st["latency_s"] > 0
            assert st["payload_bytes"] == recs[0]["grad_bytes"]     # every byte, in buckets
            assert r["comm_s"] == pytest.approx(st["latency_s"])
            assert r["comm_s"] <= (r["t_end_ns"] - r["t_start_ns"]) / 1e9
            assert (r["bound"], r["phase"]) == (bound, None)
            assert r["comm_cpu_s"] >= 0 and r["compute_cpu_s"] >= 0
        out.append(recs)
    return out


def test_ddp_gloo_trains_as_flat_gloo_does_and_logs_its_rounds_as_ddp_does(tmp_path,
                                                                            monkeypatch):
    """ddp-gloo: the arm's own worker flags (from the registry), unmodified DDP over gloo."""
    rounds, arm = 12, ARMS["ddp-gloo"]
    common = dict(workers=3, rounds=rounds, timeout_s=180, training={"eval_every": 6})
    evals = ["--eval-ranks", "all"]
    flat = run_arm("gloo", str(tmp_path / "flat"), worker_args=evals, **common)
    sock = str(tmp_path / "ctl.sock")
    lis = ControlListener(sock)
    monkeypatch.setenv("DBLP_CONTROL_SOCKET", sock)
    try:
        ddp = run_arm(arm.transport, str(tmp_path / "ddp"),
                      worker_args=evals + arm.worker_args + ["--label", arm.name], **common)
    finally:
        lis.close()
    raw = {k: tmp_path / k / "raw" / "gloo" / "seed-0" for k in ("flat", "ddp")}
    assert flat["status"] == "ok", (flat, (raw["flat"] / "worker0.err").read_text())
    assert ddp["status"] == "ok", (ddp, (raw["ddp"] / "worker0.err").read_text())
    assert "(ddp over gloo)" in (raw["ddp"] / "worker0.err").read_text()
    logs = _ddp_round_checks(raw["ddp"], arm.name, rounds, 0.0)
    for rank, recs in enumerate(logs):
        # Both average exactly: the losses agree up to the order of summation.
        base = [r["loss"] for r in read_jsonl(raw["flat"] / f"worker{rank}.jsonl")
                if r["event"] == "round"]
        assert [r["loss"] for r in recs if r["event"] == "round"] == pytest.approx(base, rel=1e-3)
    accuracies = [[r["test_accuracy"] for r in recs if r["event"] == "eval"] for recs in logs]
    assert accuracies[0] == accuracies[1] == accuracies[2]
    assert accuracies[0][-1] == pytest.approx(flat["final_accuracy"], abs=0.02)
    # Rank 0 announced every round under the arm's name: round-locked bursts find them.
    assert [(g.event, g.round) for g in lis.got] == \
        [(e, r) for r in range(rounds) for e in ("start", "end")]
    assert all(g.arm == "ddp-gloo" for g in lis.got)


def test_a_backend_a_module_registers_runs_ddp_and_a_bad_module_is_one_line(tmp_path,
                                                                          monkeypatch):
    """The c10d transport: the backend and module a spec's [ddp.NAME] names, imported by
    the workers (ext_c10d_backend.py beside this file registers "extgloo")."""
    from testbed.config.arms import register_ddp_backend

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    arm = register_ddp_backend("ext", "extgloo", "ext_c10d_backend")
    try:
        flags = arm.worker_args
    finally:
        del ARMS["ext"]
    assert flags == ["--integration", "ddp", "--backend", "extgloo",
                     "--backend-module", "ext_c10d_backend"]
    rounds = 4
    res = run_arm("c10d", str(tmp_path / "ok"), workers=3, rounds=rounds, timeout_s=180,
                  training={"eval_every": 2}, worker_args=flags + ["--label", "ext"])
    raw = tmp_path / "ok" / "raw" / "c10d" / "seed-0"
    assert res["status"] == "ok", (res, (raw / "worker0.err").read_text())
    _ddp_round_checks(raw, "ext", rounds, None)       # a backend the project does not know
    assert res["final_accuracy"] > 0
    # A module that does not import, and one that registers no such backend: one line each,
    # in the worker's end line, naming the module.
    bad = run_arm("c10d", str(tmp_path / "bad"), workers=1, rounds=1, timeout_s=120,
                  worker_args=["--integration", "ddp", "--backend", "extgloo",
                               "--backend-module", "no_such_module_here"])
    end = read_jsonl(tmp_path / "bad" / "raw" / "c10d" / "seed-0" / "worker0.jsonl")[-1]
    assert bad["status"] == "error" and "\n" not in end["error"]
    assert "--backend-module 'no_such_module_here'" in end["error"] and \
        "ModuleNotFoundError" in end["error"]
    unknown = run_arm("c10d", str(tmp_path / "unknown"), workers=1, rounds=1, timeout_s=120,
                      worker_args=["--integration", "ddp", "--backend", "nosuchbackend",
                                   "--backend-module", "ext_c10d_backend"])
    end = read_jsonl(tmp_path / "unknown" / "raw" / "c10d" / "seed-0" / "worker0.jsonl")[-1]
    assert unknown["status"] == "error"
    assert "torch.distributed has no backend 'nosuchbackend' (module 'ext_c10d_backend' " \
        "did not register it" in end["error"]
