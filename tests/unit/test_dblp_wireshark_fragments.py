"""The generated dissector decodes 8 KB chunks: an IP-fragmented DATA datagram, run by tshark.

A job with ``chunk_bytes = 8192`` (the prototype's) sends each DATA datagram
as six IP fragments. Wireshark reassembles them before the UDP dissector, so
the dissector gets the whole 8,248-byte datagram and must take it for DBLP,
on the transport's port and by its heuristic on any other. The pcap is built
with scapy's ``fragment()`` (no root, no capture), the dissector is the one
``python -m dblp.wireshark`` writes, and every float of the chunk must come
out of tshark as it went in. tshark is installed by ``./setup.sh tshark``;
where it is missing the test is skipped by hand and fails under CI.
"""
import subprocess
import sys

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from dblp import wire, wireshark
from dblp.server import DEFAULT_PORT
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

PROTO = 8192
EPHEMERAL = 40123  # a sharded job's rank-to-rank port: only the heuristic finds it


@pytest.fixture(scope="module")
def tshark(optional_tool):
    optional_tool("tshark", "tshark")
    return "tshark"


@pytest.fixture(scope="module")
def dissector(tmp_path_factory):
    path = tmp_path_factory.mktemp("lua") / "dblp.lua"
    out = subprocess.run([sys.executable, "-m", "dblp.wireshark", "--out", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return path


def _chunk() -> tuple[bytes, np.ndarray]:
    """A whole 8 KB DATA datagram (header, 2,048 floats, tag) and its floats."""
    floats = (np.arange(PROTO // 4, dtype="<f4") * np.float32(0.25) - np.float32(100)).astype("<f4")
    hdr = wire.pack_header(MsgType.DATA, src=1, part=0, session=0x1234, round=5, index=3,
                           count=7, length=PROTO, bound=8000, aux=1)
    return wire.Sealer(bytes(range(32))).seal(hdr + floats.tobytes(), 0), floats


def _pcap(tmp_path, datagram: bytes, dport: int):
    """The datagram as the kernel sends it at a 1500-byte MTU: IP fragments, in order."""
    pkt = IP(src="10.0.0.2", dst="10.0.0.1", id=4242) / UDP(sport=47001, dport=dport) \
        / Raw(datagram)
    frags = fragment(pkt, fragsize=wire.MTU - 20)
    path = tmp_path / f"frag-{dport}.pcap"
    wrpcap(str(path), [Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01") / f
                       for f in frags])
    return path, len(frags)


def _tshark(dissector, pcap, *fields: str) -> list[list[str]]:
    out = subprocess.run(["tshark", "-X", f"lua_script:{dissector}", "-r", str(pcap),
                          "-Y", "dblp", "-T", "fields", "-E", "separator=;",
                          "-E", "aggregator=,", *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split(";") for line in out.stdout.splitlines() if line]


@pytest.mark.parametrize("dport", [DEFAULT_PORT, EPHEMERAL], ids=["port", "heuristic"])
def test_an_8k_chunk_is_decoded_after_reassembly(tshark, dissector, tmp_path, dport):
    datagram, floats = _chunk()
    assert len(datagram) == wire.datagram_size(PROTO) == 8256
    assert len(datagram) <= wireshark.MAX_DATA_DATAGRAM
    pcap, n_frags = _pcap(tmp_path, datagram, dport)
    assert n_frags == wire.fragments(len(datagram)) == 6
    rows = _tshark(dissector, pcap, "dblp.type", "dblp.index", "dblp.count", "dblp.length",
                   "ip.fragment.count", "dblp.malformed", "dblp.value", "dblp.tag")
    assert len(rows) == 1, rows  # one message, on the frame that completed the datagram
    mtype, index, count, length, frag_count, malformed, values, tag = rows[0]
    assert (mtype, index, count, length) == (str(int(MsgType.DATA)), "3", "7", str(PROTO))
    assert frag_count == "6" and malformed == ""
    got = np.array([float(v) for v in values.split(",")], dtype=np.float64)
    np.testing.assert_array_equal(got, floats.astype(np.float64))
    assert tag.replace(":", "") == datagram[-wire.TAG_SIZE:].hex()


def test_only_data_may_be_longer_than_one_mtu(tshark, dissector, tmp_path):
    """A control message never fragments: one longer than a datagram is not taken for DBLP."""
    body = wire.pack_header(MsgType.BITMAP, src=1, session=0x1234, round=5, count=7,
                            length=3000) + bytes(3000)
    pcap, _ = _pcap(tmp_path, wire.Sealer(None).seal(body, 0), EPHEMERAL)
    assert _tshark(dissector, pcap, "dblp.type") == []
