"""Captures -> flows.csv: a small pcap written with scapy and the dblp layer, known counts.

Round 3 of the dblp arm is a burst round: worker0 sends 4 chunks of which 2
are lost, resends one (pass 1), probes once; worker1 (not captured) sends 4
that all arrive; the server sends the 4-chunk average back to worker0. The
header's round counter runs one ahead of the logged round, which the reader
must undo. The gloo arm's TCP capture carries one retransmitted segment.
"""
import json
import pathlib
import sys

import pandas as pd
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from dblp import scapy_layer, wire
from testbed.analysis import packets
from testbed.analysis.pipeline import build_outputs

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_analysis import MS, make_run, round_start, unit_raw  # noqa: E402

pytestmark = pytest.mark.unit

PORT = 47474
SERVER, W0, W1, W2 = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"
SESSION = 0xABCDEF


def _dblp(t_ns, src, dst, type_, rnd, index=0, aux=0, pull=False, rank=0, payload=b"\0" * 64):
    sport, dport = (PORT, 40000 + rank) if src == SERVER else (40000 + rank, PORT)
    hdr = scapy_layer.DBLP(type=int(type_), round=rnd + 1, index=index, count=4, aux=aux,
                           session=SESSION, src=rank,
                           flags=int(wire.Flag.PULL) if pull else int(wire.Flag.CRITICAL),
                           bound=408000)
    pkt = Ether() / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / hdr / Raw(payload)
    pkt.time = t_ns / 1e9
    return pkt


def _rounds_packets(arm="dblp", seed=1):
    """(server capture, worker0 capture) for rounds 2 (clean) and 3 (burst) of a unit."""
    srv, w0 = [], []
    D, P = wire.MsgType.DATA, wire.MsgType.PROBE
    for rnd, lost in ((2, ()), (3, (1, 2))):
        t = round_start(arm, rnd, seed) + 20 * MS
        for i in range(4):   # worker0's push, pass 0
            p = _dblp(t + i * MS, W0, SERVER, D, rnd, index=i, rank=0)
            w0.append(p)
            if i not in lost:
                srv.append(p)
        for i in range(4):   # worker1's push: only the server's capture sees it
            srv.append(_dblp(t + 5 * MS + i * MS, W1, SERVER, D, rnd, index=i, rank=1))
        probe = _dblp(t + 10 * MS, W0, SERVER, P, rnd, index=7, rank=0, payload=b"")
        w0.append(probe)
        srv.append(probe)
        if lost:             # pass 1: resend chunk 1 only (bound allows chunk 2 missing)
            p = _dblp(t + 12 * MS, W0, SERVER, D, rnd, index=1, aux=1, rank=0)
            w0.append(p)
            srv.append(p)
        for i in range(4):   # the average back to worker0
            p = _dblp(t + 40 * MS + i * MS, SERVER, W0, D, rnd, index=i, pull=True)
            srv.append(p)
            w0.append(p)
    return sorted(srv, key=lambda p: p.time), sorted(w0, key=lambda p: p.time)


def _gloo_capture(seed=1):
    """worker0 in a ring: sends to worker1, receives from worker2 (no server)."""
    out = []
    t = round_start("gloo", 5, seed) + 15 * MS
    for k, seq in enumerate((1000, 2000, 2000, 3000)):   # 2000 sent twice
        p = Ether() / IP(src=W0, dst=W1) / TCP(sport=50000, dport=29500, seq=seq, flags="PA") \
            / Raw(b"x" * 1000)
        p.time = (t + k * MS) / 1e9
        out.append(p)
    for k in range(2):
        p = Ether() / IP(src=W2, dst=W0) / TCP(sport=29501, dport=50001, seq=k, flags="PA") \
            / Raw(b"y" * 500)
        p.time = (t + (5 + k) * MS) / 1e9
        out.append(p)
    return out


@pytest.fixture
def captured_run(tmp_path):
    return write_captures(make_run(tmp_path / "run"))


def write_captures(run, seeds=(1,)):
    """The dblp arm's server and worker0 captures and gloo's worker0 capture, in every seed."""
    for seed in seeds:
        srv, w0 = _rounds_packets(seed=seed)
        wrpcap(str(unit_raw(run, "dblp", seed) / "server.pcap"), srv)
        wrpcap(str(unit_raw(run, "dblp", seed) / "worker0.pcap"), w0)
        wrpcap(str(unit_raw(run, "gloo", seed) / "worker0.pcap"), _gloo_capture(seed))
    return run


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
    p = _dblp(round_start("dblp", 2), W0, SERVER, wire.MsgType.DATA, 2, index=3, payload=b"\1" * 1000)
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
