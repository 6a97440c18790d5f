"""The `ddp` arm on the fabric: unmodified DDP over init_process_group("dblp") on emulated hosts.

The smallest whole run that shows it: the `smoke` preset's star with the
`ddp` arm alone, 8 rounds, its one round-locked burst at round 6. Checks that
the arm got what a built-in arm gets: its rounds in the tables, its burst
triggered by rank 0's own round lines and hitting that round, DDP's buckets
carried by the sharded transport, and the run's progress lines.
"""
import json
import pathlib
import subprocess
import sys

import pandas as pd
import pytest

from testbed.analysis import formats

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
ROUNDS = 8


@pytest.mark.e2e
def test_ddp_arm_trains_on_the_fabric_and_its_burst_hits_its_round(tmp_path, leftovers):
    out = tmp_path / "run"
    answer = tmp_path / "answer.json"
    proc = subprocess.run(CLI + ["run", "--preset", "smoke", "--arms", "ddp", "--rounds",
                                 str(ROUNDS), "--out", str(out), "--json", str(answer)],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "] unit 1/1 starts; run elapsed" in proc.stdout and "unit 1/1 round" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    # `run --json FILE`: the answer, of its declared format, beside the text.
    obj = formats.check_answer(json.loads(answer.read_text()))
    assert obj["kind"] == "run" and obj["status"] == "ok" and obj["verdicts"] == summary["verdicts"]
    arm = summary["arms"]["ddp"]
    assert arm["status"] == "ok" and arm["rounds"] == ROUNDS and arm["final_accuracy"] > 0.1
    # The smoke burst at round 6, triggered from rank 0's round lines.
    bursts = pd.read_csv(out / "bursts.csv")
    mine = bursts[bursts["arm"] == "ddp"]
    assert len(mine) == 1 and int(mine["round"].iloc[0]) == 6
    assert mine["actual_start_ns"].notna().all() and mine["dropped_packets"].iloc[0] > 0
    rounds = pd.read_csv(out / "rounds.csv")
    assert list(rounds[(rounds["arm"] == "ddp") & rounds["in_burst"]]["round"]) == [6]
    assert arm["burst_rounds"] == 1
    # Every rank's rounds went through the sharded transport in DDP's buckets, rank 0 on the
    # server's host and no server process.
    seed = json.loads((out / "manifest.json").read_text())["seed"]
    unit = out / "raw" / "ddp" / f"seed-{seed}"
    assert not (unit / "server.jsonl").exists()
    for rank in range(3):
        log = [json.loads(line) for line in (unit / f"worker{rank}.jsonl").read_text().splitlines()]
        rr = [e for e in log if e["event"] == "round"]
        assert [e["round"] for e in rr] == list(range(ROUNDS)) and log[-1]["status"] == "ok"
        assert all(e["stats"]["mode"] == "sharded" and e["stats"]["buckets"] >= 1
                   and e["stats"]["chunks"] > 0 for e in rr)
        assert rr[0]["phase"] == "critical"
    assert (unit / "server.pcap").stat().st_size > 0
    assert not any(leftovers().values()), leftovers()
    print(f"ddp on the smoke star: round p50 {arm['round_ms_p50']:.0f} ms, burst round "
          f"{arm['burst_round_ms_p50']:.0f} ms, normal round {arm['normal_round_ms_p50']:.0f} ms")
