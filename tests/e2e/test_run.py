"""Whole runs: `dblp-testbed run` from spec to report, and its faults.

These run the real thing (Mininet fabric, os-ken controller, PyTorch workers
on the emulated hosts, tcpdump) on the `smoke` preset, so each takes about a
minute. Faults are injected by PID into processes of the run under test only.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
DERIVED = ["summary.json", "rounds.csv", "bursts.csv", "flows.csv", "packets.parquet", "report.md",
           "report.html", "manifest.json", "spec.toml"]


def project_leftovers() -> dict:
    """What the project may leave behind: bridges, host shells, nft tables, processes."""
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    procs = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return {
        "bridges": [b for b in bridges if b.startswith("dt")],
        "veths": [l.split(":")[1].strip() for l in links.splitlines()
                  if l.split(":")[1].strip().startswith(("dt", "srv", "w1", "w2", "w3", "x1"))],
        "nft": [t for t in nft.splitlines() if "dblp" in t],
        "procs": [p for p in procs.splitlines()
                  if "-m workloads." in p or "-m controllers." in p],
    }


def stop_harness(proc: subprocess.Popen):
    """A test that failed half-way still lets the harness tear down."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(autouse=True)
def _isolated():
    """Whatever a failing test leaves behind must not fail the next one."""
    yield
    subprocess.run(CLI + ["clean"], cwd=ROOT, capture_output=True, timeout=120)


def start_run(out: pathlib.Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(CLI + ["run", "--preset", "smoke", "--out", str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.e2e
def test_smoke_run_writes_every_output_and_rebuilds_identically(tmp_path):
    out = tmp_path / "run"
    proc = start_run(out)
    log, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, log
    for name in DERIVED:
        assert (out / name).exists(), name
    assert list((out / "plots").glob("*.png"))
    summary = json.loads((out / "summary.json").read_text())
    for arm in ("static", "dblp", "dblp-tcp", "dblp-sharded"):
        a = summary["arms"][arm]
        assert a["rounds"] == 12
        for key in ("round_ms_p50", "round_ms_p99", "burst_round_ms_p50", "normal_round_ms_p50",
                    "train_time_s", "final_accuracy"):
            assert key in a, key
    assert summary["bursts"]["count"] >= 3  # one burst per arm
    tcp = [json.loads(l) for l in (out / "raw" / "dblp-tcp" / "worker0.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in tcp} == {"dblp-tcp"}
    assert {r["stats"]["control"] for r in tcp if r["event"] == "round"} == {"tcp"}
    # Sharded: no server process; every worker aggregates its shard and ends ok.
    sharded = out / "raw" / "dblp-sharded"
    assert not (sharded / "server.jsonl").exists()
    logs = [[json.loads(l) for l in (sharded / f"worker{r}.jsonl").read_text().splitlines()]
            for r in range(3)]
    assert all({e["stats"]["mode"] for e in log if e["event"] == "round"} == {"sharded"}
               for log in logs)
    assert len({log[-1]["status"] for log in logs}) == 1 and logs[0][-1]["status"] == "ok"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert all(a["status"] == "ok" for a in manifest["arms"].values())
    assert (out / "raw" / "dblp" / "server.pcap").stat().st_size > 0
    before = (out / "summary.json").read_text()
    res = subprocess.run(CLI + ["report", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (out / "summary.json").read_text() == before
    assert project_leftovers() == {"bridges": [], "veths": [], "nft": [], "procs": []}


def _wait_for_round(out: pathlib.Path, arm: str, rnd: int, timeout: float = 300):
    log = out / "raw" / arm / "worker0.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and f'"round": {rnd},' in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{arm} never reached round {rnd}")


def _pid_of(pattern: str) -> int:
    for line in subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True,
                               text=True).stdout.splitlines()[1:]:
        pid, args = line.strip().split(None, 1)
        if pattern in args and int(pid) != os.getpid():
            return int(pid)
    raise AssertionError(f"no process matching {pattern}")


FAULTS = {
    "kill-worker": lambda out, proc: os.kill(_pid_of(f"{out}/raw/static/worker1.jsonl"),
                                             signal.SIGKILL),
    "kill-server": lambda out, proc: os.kill(_pid_of(f"{out}/raw/static/server.jsonl"),
                                             signal.SIGKILL),
    "kill-controller": lambda out, proc: os.kill(_pid_of(f"{out}/raw/fabric.json"),
                                                 signal.SIGKILL),
    "stop-ovs": lambda out, proc: subprocess.run([OVS_CTL, "stop"], check=True,
                                                 capture_output=True),
    "sigint": lambda out, proc: proc.send_signal(signal.SIGINT),
    "sigterm": lambda out, proc: proc.send_signal(signal.SIGTERM),
}


@pytest.mark.e2e
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_ends_run_cleanly_and_keeps_partial_results(tmp_path, fault):
    out = tmp_path / "run"
    proc = start_run(out, "--rounds", "400", "--arms", "static,dblp")
    try:
        _wait_for_round(out, "static", 3)
        t_fault = time.monotonic()
        FAULTS[fault](out, proc)
        log, _ = proc.communicate(timeout=60)
        ended_after = time.monotonic() - t_fault
    finally:
        stop_harness(proc)
    if fault == "stop-ovs":
        # The machine's OVS comes back the way setup.sh starts it; whatever
        # the dead run left in OVS's database must go with the project's
        # clean-up or the next fabric (checked below and by the next test).
        subprocess.run(["bash", str(ROOT / "setup.sh")], check=True, capture_output=True)
        # OVS's database brought the dead run's bridge back: the next run
        # removes it (its owner is dead) and succeeds.
        nxt = subprocess.run(CLI + ["run", "--preset", "smoke", "--rounds", "8", "--arms", "static",
                                    "--out", str(tmp_path / "next")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert nxt.returncode == 0, nxt.stdout + nxt.stderr
    assert proc.returncode != 0, log
    assert ended_after < 45, (ended_after, log)
    manifest = json.loads((out / "manifest.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert manifest["status"] in ("failed", "interrupted", "error"), manifest["status"]
    assert summary["status"] != "ok"
    assert manifest["arms"]["static"]["status"] in ("failed", "interrupted")
    assert (out / "raw" / "static" / "worker0.jsonl").stat().st_size > 0
    assert project_leftovers() == {"bridges": [], "veths": [], "nft": [], "procs": []}
