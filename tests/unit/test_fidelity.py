"""The bottleneck monitor: its rate arithmetic on loopback, its queue samples from tc."""
import json
import os
import pathlib
import socket
import time

import pytest

from testbed.run.fidelity import BottleneckMonitor, bounded_queue, parse_qdiscs
from testbed.rundir import FIDELITY_FIELDS
from workloads import runlog


@pytest.mark.unit
def test_monitor_sees_traffic_on_loopback():
    mon = BottleneckMonitor("lo", shaped_mbps=1000.0, window_s=0.2)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 1400
    end = time.monotonic() + 0.6
    sent = 0
    while time.monotonic() < end:
        tx.sendto(payload, rx.getsockname())
        sent += 1
        if sent % 50 == 0:
            while True:
                rx.setblocking(False)
                try:
                    rx.recv(2048)
                except BlockingIOError:
                    break
    out = mon.summary()
    assert out["bottleneck"] == "lo"
    # at least a few Mbit/s went through lo in the busiest 200 ms window
    assert out["achieved_mbps"] > 5
    assert out["shaped_mbps"] == 1000.0


# Real `tc -s qdisc show dev lo` output (iproute2 6.1.0) of the fabric's
# shaping (testbed.emulation.fabric.shaping_batch) in a private network
# namespace, just after 100 datagrams were sent at 1 Mbit/s into a 20-packet
# queue; tc ends the Sent lines with a space. Before them, tc printed the
# same lines with every counter 0 (TC_IDLE).
TC_FULL = """\
qdisc htb 1: root refcnt 2 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 1000
 Sent 4306 bytes 5 pkt (dropped 78, overlimits 2 requeues 0)\x20
 backlog 20388b 20p requeues 0
qdisc pfifo 10: parent 1:1 limit 20p
 Sent 4306 bytes 5 pkt (dropped 78, overlimits 0 requeues 0)\x20
 backlog 20388b 20p requeues 0
"""
TC_IDLE = (TC_FULL.replace("overlimits 2", "overlimits 0").replace("backlog 20388b 20p", "backlog 0b 0p")
           .replace("Sent 4306 bytes 5 pkt (dropped 78", "Sent 0 bytes 0 pkt (dropped 0"))


@pytest.mark.unit
def test_tc_parser_reads_the_htb_root_and_its_pfifo_child():
    root, fifo = parse_qdiscs(TC_FULL)
    assert (root["kind"], root["handle"], root["parent"], root["limit_packets"]) == (
        "htb", "1:", None, None)
    assert (fifo["kind"], fifo["parent"], fifo["limit_packets"]) == ("pfifo", "1:1", 20)
    assert (fifo["backlog_bytes"], fifo["backlog_packets"], fifo["dropped"]) == (20388, 20, 78)
    assert (fifo["sent_bytes"], fifo["sent_packets"]) == (4306, 5)
    assert bounded_queue(parse_qdiscs(TC_FULL)) is not None
    assert bounded_queue(parse_qdiscs(TC_FULL))["kind"] == "pfifo"
    idle = bounded_queue(parse_qdiscs(TC_IDLE))
    assert (idle["backlog_packets"], idle["dropped"], idle["limit_packets"]) == (0, 0, 20)
    # No pfifo (an unshaped interface): the root describes the queue; no tc output: none.
    assert bounded_queue(parse_qdiscs(TC_FULL.split("qdisc pfifo")[0]))["kind"] == "htb"
    assert bounded_queue(parse_qdiscs("")) is None


def _fake_tc(bin_dir: pathlib.Path) -> None:
    """A `tc` that prints TC_FULL's format with n packets queued and n dropped, n = call count."""
    bin_dir.mkdir()
    tc = bin_dir / "tc"
    body = TC_FULL.replace("dropped 78", "dropped $n").replace("20388b 20p", "${n}500b ${n}p")
    tc.write_text('#!/bin/sh\nn=$(cat "$0.n" 2>/dev/null || echo 0)\necho $((n + 1)) > "$0.n"\n'
                  f"cat <<EOF\n{body}EOF\n")
    tc.chmod(0o755)


@pytest.mark.unit
def test_monitor_writes_declared_queue_lines(tmp_path, monkeypatch):
    _fake_tc(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "raw" / "dblp" / "seed-1" / "queue.jsonl"
    before = time.time_ns()
    mon = BottleneckMonitor("lo", shaped_mbps=20.0, arm="dblp", queue_log=log,
                            queue_period_s=0.05, trace=False)
    time.sleep(0.5)
    out = mon.summary()
    after = time.time_ns()
    lines = [runlog.check_event(json.loads(x)) for x in log.read_text().splitlines()]
    assert 5 <= len(lines) <= 13 and out["queue_samples"] == len(lines)
    assert {(e["event"], e["arm"], e["interface"], e["limit_packets"]) for e in lines} == {
        ("queue", "dblp", "lo", 20)}
    assert not any("role" in e or "rank" in e for e in lines)   # not a process of the training
    t = [e["t_ns"] for e in lines]
    assert before < t[0] and t[-1] < after and t == sorted(t)
    gaps = [(b - a) / 1e6 for a, b in zip(t, t[1:], strict=False)]
    assert 30 < sorted(gaps)[len(gaps) // 2] < 90                 # the period, in ms
    # The constructor's qdisc_counters call was tc's first: the samples count on from 1.
    n = [e["backlog_packets"] for e in lines]
    assert n == list(range(1, len(lines) + 1)) and [e["dropped"] for e in lines] == n
    assert lines[0]["backlog_bytes"] == 1500 and out["queue_peak_packets"] == n[-1]
    runlog.check_fields(out, FIDELITY_FIELDS, "fidelity")       # the manifest declares them


@pytest.mark.unit
def test_a_stopped_monitor_forks_no_more_tc(tmp_path, monkeypatch):
    """The runner stops the monitor when an arm fails too: no sampler may outlive it."""
    _fake_tc(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    mon = BottleneckMonitor("lo", shaped_mbps=20.0, arm="dblp",
                            queue_log=tmp_path / "queue.jsonl", queue_period_s=0.02, trace=False)
    time.sleep(0.1)
    mon.stop()
    mon.stop()                                                  # idempotent
    calls = (tmp_path / "bin" / "tc.n").read_text()
    time.sleep(0.15)
    assert (tmp_path / "bin" / "tc.n").read_text() == calls
    assert not any(t.is_alive() for t in mon._threads)
