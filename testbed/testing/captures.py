"""Packet captures of a `testbed.testing.rundirs` run with known counts, written with scapy.

Round 3 of the dblp arm is a burst round: worker0 sends 4 chunks of which 2
are lost, resends one (pass 1), probes once; worker1 (not captured) sends 4
that all arrive; the server sends the 4-chunk average back to worker0. The
header's round counter runs one ahead of the logged round, which the reader
must undo. The gloo arm's TCP capture carries one retransmitted segment.
"""
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from dblp import scapy_layer, wire
from testbed.testing.rundirs import MS, round_start, unit_raw

PORT = 47474
SERVER, W0, W1, W2 = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"
SESSION = 0xABCDEF


def dblp_packet(t_ns, src, dst, type_, rnd, index=0, aux=0, pull=False, rank=0, payload=b"\0" * 64):
    sport, dport = (PORT, 40000 + rank) if src == SERVER else (40000 + rank, PORT)
    hdr = scapy_layer.DBLP(type=int(type_), round=rnd + 1, index=index, count=4, aux=aux,
                           session=SESSION, src=rank,
                           flags=int(wire.Flag.PULL) if pull else int(wire.Flag.CRITICAL),
                           bound=408000)
    pkt = Ether() / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / hdr / Raw(payload)
    pkt.time = t_ns / 1e9
    return pkt


def rounds_packets(arm="dblp", seed=1):
    """(server capture, worker0 capture) for rounds 2 (clean) and 3 (burst) of a unit."""
    srv, w0 = [], []
    D, P = wire.MsgType.DATA, wire.MsgType.PROBE
    for rnd, lost in ((2, ()), (3, (1, 2))):
        t = round_start(arm, rnd, seed) + 20 * MS
        for i in range(4):   # worker0's push, pass 0
            p = dblp_packet(t + i * MS, W0, SERVER, D, rnd, index=i, rank=0)
            w0.append(p)
            if i not in lost:
                srv.append(p)
        for i in range(4):   # worker1's push: only the server's capture sees it
            srv.append(dblp_packet(t + 5 * MS + i * MS, W1, SERVER, D, rnd, index=i, rank=1))
        probe = dblp_packet(t + 10 * MS, W0, SERVER, P, rnd, index=7, rank=0, payload=b"")
        w0.append(probe)
        srv.append(probe)
        if lost:             # pass 1: resend chunk 1 only (bound allows chunk 2 missing)
            p = dblp_packet(t + 12 * MS, W0, SERVER, D, rnd, index=1, aux=1, rank=0)
            w0.append(p)
            srv.append(p)
        for i in range(4):   # the average back to worker0
            p = dblp_packet(t + 40 * MS + i * MS, SERVER, W0, D, rnd, index=i, pull=True)
            srv.append(p)
            w0.append(p)
    return sorted(srv, key=lambda p: p.time), sorted(w0, key=lambda p: p.time)


def gloo_capture(seed=1):
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


def write_captures(run, seeds=(1,)):
    """The dblp arm's server and worker0 captures and gloo's worker0 capture, in every seed."""
    for seed in seeds:
        srv, w0 = rounds_packets(seed=seed)
        wrpcap(str(unit_raw(run, "dblp", seed) / "server.pcap"), srv)
        wrpcap(str(unit_raw(run, "dblp", seed) / "worker0.pcap"), w0)
        wrpcap(str(unit_raw(run, "gloo", seed) / "worker0.pcap"), gloo_capture(seed))
    return run
