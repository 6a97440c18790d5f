"""Captures -> flows.csv: a small pcap written with scapy and the dblp layer, known counts.

Round 3 of the dblp arm is a burst round: worker0 sends 4 chunks of which 2
are lost, resends one (pass 1), probes once; worker1 (not captured) sends 4
that all arrive; the server sends the 4-chunk average back to worker0. The
header's round counter runs one ahead of the logged round, which the reader
must undo. The gloo arm's TCP capture carries one retransmitted segment.
"""
import json

import pandas as pd
import pytest
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from dblp import wire
from testbed.analysis import packets
from testbed.analysis.pipeline import build_outputs
from testbed.testing.captures import (
    PORT,
    SERVER,
    W0,
    W1,
    W2,
    dblp_packet,
    write_captures,
)
from testbed.testing.rundirs import make_run, round_start, unit_raw

pytestmark = pytest.mark.unit

@pytest.fixture
def captured_run(tmp_path):
    return write_captures(make_run(tmp_path / "run"))


def _row(t, arm, rnd, src, dst):
    m = t[(t["arm"] == arm) & (t["round"] == rnd) & (t["src"] == src) & (t["dst"] == dst)]
    assert len(m) == 1, m
    return m.iloc[0]


def test_packet_table_counts(captured_run):
    build_outputs(captured_run, figures=False)
    t = pd.read_csv(captured_run / "flows.csv")
    push = _row(t, "dblp", 3, W0, SERVER)
    assert push.direction == "push"
    assert (push.sent_packets, push.recv_packets, push.drops) == (6, 4, 2)
    assert push.retransmissions == 1 and push.control_packets == 1
    dg = 20 + 8 + wire.HEADER_SIZE + wire.TAG_SIZE  # IPv4 + UDP + DBLP header + MAC trailer
    assert push.sent_bytes == 4 * (dg + 64) + dg + (dg + 64)
    clean = _row(t, "dblp", 2, W0, SERVER)
    assert (clean.sent_packets, clean.recv_packets, clean.drops, clean.retransmissions) == (5, 5, 0, 0)
    pull = _row(t, "dblp", 3, SERVER, W0)
    assert pull.direction == "pull" and (pull.sent_packets, pull.recv_packets, pull.drops) == (4, 4, 0)
    # worker1 was not captured: what the server received is known, drops are not.
    w1 = _row(t, "dblp", 3, W1, SERVER)
    assert w1.recv_packets == 4 and pd.isna(w1.sent_packets) and pd.isna(w1.drops)
    # gloo: rounds by timestamp, a repeated TCP sequence is a retransmission.
    g = _row(t, "gloo", 5, W0, W1)
    assert g.direction == "peer" and g.sent_packets == 4 and g.retransmissions == 1
    assert pd.isna(g.drops)                       # worker1 was not captured
    g2 = _row(t, "gloo", 5, W2, W0)
    assert g2.recv_packets == 2 and g2.recv_bytes == 2 * (20 + 20 + 500)
    s = json.loads((captured_run / "summary.json").read_text())
    assert s["packets"]["dblp"]["push"]["drops"] == 2
    assert s["packets"]["dblp"]["push"]["retransmissions"] == 1


def test_burst_loss_from_capture_and_from_counters(captured_run):
    build_outputs(captured_run, figures=False)
    b = pd.read_csv(captured_run / "bursts.csv").set_index("id")
    # Burst 1 window holds the server's receptions of round 3: 2 + 1 + 1 from worker0, 4 from worker1.
    assert b.loc["dblp-b1", "received_packets"] == 8
    assert b.loc["dblp-b1", "measured_loss"] == pytest.approx(12 / 20)
    assert b.loc["dblp-b1", "measured_loss_source"] == "capture"
    r = pd.read_csv(captured_run / "rounds.csv")
    r3 = r[(r["arm"] == "dblp") & (r["round"] == 3)].iloc[0]
    assert r3.phys_loss == pytest.approx(0.6)   # the bound uses the measured loss
    # With the controller's seen/dropped counters, those decide.
    f = unit_raw(captured_run, "dblp") / "bursts.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    lines[0]["seen_packets"] = 16
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    build_outputs(captured_run, figures=False)
    b = pd.read_csv(captured_run / "bursts.csv").set_index("id")
    assert b.loc["dblp-b1", "measured_loss"] == pytest.approx(12 / 16)
    assert b.loc["dblp-b1", "measured_loss_source"] == "controller counters"


def test_header_round_offset_and_address_resolution(captured_run):
    caps = packets.read_unit(captured_run, "dblp", 1, PORT)
    assert all((df["seed"] == 1).all() for df in caps.values())
    assert sorted(caps) == ["server", "worker0"]
    both = {("dblp", r): df for r, df in caps.items()}
    # worker0's capture alone has two endpoints: only the server's capture settles it.
    assert packets.resolve_addresses(both) == ({"server": SERVER, "worker0": W0}, [])
    only_w0 = {("dblp", "worker0"): caps["worker0"]}
    assert packets.resolve_addresses(only_w0)[0] == {"worker0": W0}  # DBLP push direction
    gl = {("gloo", "worker0"): packets.read_unit(captured_run, "gloo", 1, PORT)["worker0"]}
    assert packets.resolve_addresses(gl)[0] == {"worker0": W0}       # three endpoints
    pk = pd.concat(caps.values(), ignore_index=True)
    assert set(pk["kind"]) == {"data", "probe"}
    assert pk["hdr_round"].min() == 3                # counter = logged round + 1
    from testbed.analysis import tables as analysis
    from testbed.analysis.raw import load_raw
    raw = load_raw(captured_run)
    rt = analysis.rounds_table(raw)
    got = packets.assign_rounds(pk, rt[rt["arm"] == "dblp"])
    assert sorted(set(got)) == [2.0, 3.0]
    # Without a `server` capture the busiest peer is the server.
    assert packets.server_address(pk, {"worker0": W0}) == SERVER


def test_truncated_capture_keeps_header_and_length(tmp_path):
    # The runner captures with a 96-byte snap length: the DBLP header fits, the floats do not.
    p = dblp_packet(round_start("dblp", 2), W0, SERVER, wire.MsgType.DATA, 2, index=3, payload=b"\1" * 1000)
    cut = Ether(bytes(p)[:96])
    cut.time = p.time
    wrpcap(str(tmp_path / "worker0.pcap"), [cut], snaplen=96)
    df = packets.read_pcap(tmp_path / "worker0.pcap", "dblp", "worker0", PORT)
    row = df.iloc[0]
    assert row.ip_bytes == 20 + 8 + wire.HEADER_SIZE + wire.TAG_SIZE + 1000
    assert (row.kind, row.hdr_round, row.seq, row.is_data) == ("data", 3, 3, True)


def test_fast_reader_equals_scapy_dissection(captured_run):
    for arm, role in (("dblp", "server"), ("dblp", "worker0"), ("gloo", "worker0")):
        path = unit_raw(captured_run, arm) / f"{role}.pcap"
        fast = packets.read_pcap(path, arm, role, PORT)
        slow = packets._read_pcap_scapy(path, arm, role, PORT)
        assert len(fast) > 0
        pd.testing.assert_frame_equal(fast.astype(str), slow.astype(str))
