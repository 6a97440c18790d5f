"""A user's own transport as an arm: the example UDP transport beside `static` on the fabric.

Runs the command docs/commands.md shows (the `smoke` preset's star, 12 rounds,
one round-locked burst at round 6) and checks that the command arm got what a
built-in arm gets: its rounds, its burst round (triggered from its own log),
its speedups and its verdict rows.
"""
import json
import pathlib
import shlex
import subprocess
import sys

import pandas as pd
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
ARM = "udp-avg"


def docs_command() -> list[str]:
    """The run command of docs/commands.md, as its words."""
    page = (ROOT / "docs" / "commands.md").read_text()
    [line] = [x.strip() for x in page.splitlines()
              if x.startswith("    dblp-testbed run examples/udp_average.toml")]
    return shlex.split(line)[2:]


@pytest.mark.e2e
def test_the_example_transport_runs_as_an_arm_beside_static(tmp_path, leftovers):
    out = tmp_path / "run"
    proc = subprocess.run(CLI + ["run", *docs_command(), "--out", str(out)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    arm, static = summary["arms"][ARM], summary["arms"]["static"]
    assert arm["transport"] == "command" and arm["status"] == "ok"
    assert arm["rounds"] == static["rounds"] == 12
    # The same model, shards and batch order as the built-in arms: before the burst, the
    # command trained exactly as static did (up to the order of summation).
    evals = pd.read_csv(out / "evals.csv")
    first = evals[evals["round"] == 5].set_index("arm")["test_accuracy"]
    assert first[ARM] == pytest.approx(first["static"], abs=0.01)
    assert arm["final_accuracy"] > 0.1
    # The burst at round 6 was triggered by the command's own round_start line.
    bursts = pd.read_csv(out / "bursts.csv")
    mine = bursts[bursts["arm"] == ARM]
    assert len(mine) == 1 and int(mine["round"].iloc[0]) == 6
    assert mine["actual_start_ns"].notna().all() and mine["dropped_packets"].iloc[0] > 0
    rounds = pd.read_csv(out / "rounds.csv")
    hit = rounds[(rounds["arm"] == ARM) & rounds["in_burst"]]
    assert list(hit["round"]) == [6]
    assert arm["burst_rounds"] == 1 and arm["burst_round_ms_p50"] > arm["normal_round_ms_p50"]
    assert f"{ARM}_vs_static" in summary["speedups"]
    rows = [v for v in summary["verdicts"] if v["arm"] == ARM]
    assert {v["claim"] for v in rows} == {"burst_speedup", "train_time_cut", "accuracy",
                                          "tail_latency", "mean_latency"}
    assert all(v["baseline"] == "static" for v in rows)
    unit = next((out / "raw" / ARM).glob("seed-*"))
    assert (unit / "worker0.command.log").stat().st_size > 0
    assert (unit / "server.pcap").stat().st_size > 0
    assert not any(leftovers().values()), leftovers()
    # The harness stopped the command's processes by PID (the oracle above knows only its own).
    left = subprocess.run(["pgrep", "-f", "examples/udp_average.py"], capture_output=True,
                          text=True).stdout.split()
    assert left == []
    print(f"burst round p50: {ARM} {arm['burst_round_ms_p50']:.0f} ms, static "
          f"{static['burst_round_ms_p50']:.0f} ms; normal round p50: {ARM} "
          f"{arm['normal_round_ms_p50']:.0f} ms, static {static['normal_round_ms_p50']:.0f} ms; "
          f"{ARM} vs static burst-round speedup "
          f"{summary['speedups'][f'{ARM}_vs_static']['burst_round']:.2f}x")
