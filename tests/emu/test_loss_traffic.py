"""Loss by traffic class (``controllers.traffic``) on real packets between two namespaces.

A sender in one namespace sends DBLP DATA and PROBE datagrams, a fragmented
DATA datagram (a chunk larger than one MTU, as the prototype's 8 KB bucket
sends) and opens TCP connections; the other namespace's input hook drops
(almost) everything of the class asked for. What arrives says which rules
took what. The fabric's loss bursts write the same matches into netdev
egress hooks: ``nft -c`` checks those scripts against this kernel.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controllers.mechanisms import loss_script
from controllers.traffic import TRAFFIC
from testbed.emulation.netns import NetnsPair

pytestmark = pytest.mark.emu

PORT = 47999
N = 50

RECEIVE = f"""
import json, socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", {PORT}))
u.settimeout(1.5)
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", {PORT}))
t.listen(64)
print("ready", flush=True)
got = {{}}
try:
    while True:
        b = u.recv(65535)
        key = f"{{b[3]}}:{{len(b)}}"
        got[key] = got.get(key, 0) + 1
except socket.timeout:
    pass
print(json.dumps(got))
"""

SEND = f"""
import socket, sys
from dblp import wire
dst = sys.argv[1]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data = wire.pack(wire.MsgType.DATA, bytes(1400), src=0, session=1, round=1, count=2, index=0)
big = wire.pack_header(wire.MsgType.DATA, src=0, session=1, round=1, count=2, index=1,
                       length=8192) + bytes(8192) + wire.ZERO_TAG  # a job's 8 KB chunk
probe = wire.pack(wire.MsgType.PROBE, src=0, session=1, round=1, count=2)
for _ in range({N}):
    for msg in (data, big, probe):
        u.sendto(msg, (dst, {PORT}))
connected = 0
for _ in range(5):
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect((dst, {PORT}))
        connected += 1
    except OSError:
        pass
    s.close()
print(connected)
"""


def _exchange(pair: NetnsPair) -> tuple[dict, int]:
    """Per message type and size, the datagrams that arrived; TCP connects that succeeded."""
    recv = subprocess.Popen(["ip", "netns", "exec", pair.ns[1], sys.executable, "-c", RECEIVE],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        sent = pair.exec(0, sys.executable, "-c", SEND, pair.ip[1])
        out, _ = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    got = json.loads(out.strip().splitlines()[-1])
    return got, int(sent.stdout.strip())


@pytest.fixture(scope="module")
def pair():
    """The pair with each side's neighbour entry made permanent: an egress loss of "all"
    takes ARP too, and a failed entry would outlive the burst into the next test."""
    with NetnsPair(rate_bps=None) as p:
        for side in (0, 1):
            link = json.loads(p.exec(1 - side, "ip", "-j", "link", "show", "dev",
                                     p.dev[1 - side]).stdout)
            p.exec(side, "ip", "neigh", "replace", p.ip[1 - side], "lladdr",
                   link[0]["address"], "dev", p.dev[side], "nud", "permanent")
        yield p


def _arrived(got: dict, connected: int) -> dict:
    return {"data": got.get(f"1:{48 + 1400 + 16}", 0),
            "fragmented data": got.get(f"1:{48 + 8192 + 16}", 0),
            "probe": got.get(f"2:{48 + 16}", 0), "tcp connects": connected}


#: What arrives when a loss of (almost) 1 takes each class.
EXPECTED = {"all": {"data": 0, "fragmented data": 0, "probe": 0, "tcp connects": 0},
            "data": {"data": 0, "fragmented data": 0, "probe": N, "tcp connects": 5},
            "control": {"data": N, "fragmented data": N, "probe": 0, "tcp connects": 0}}


@pytest.mark.parametrize("traffic", TRAFFIC)
def test_the_benchs_loss_takes_only_its_traffic(pair, traffic):
    """The bench's input hook: datagrams are whole there (IP reassembles before it)."""
    pair.set_loss(0.999999, traffic=traffic)
    try:
        arrived = _arrived(*_exchange(pair))
    finally:
        pair.set_loss(0.0)
    assert arrived == EXPECTED[traffic]


@pytest.mark.parametrize("traffic", TRAFFIC)
def test_the_fabrics_loss_burst_takes_only_its_traffic(pair, traffic):
    """A loss burst's script (netdev egress, as on a switch port) on the sender's veth:
    there the 8 KB DATA datagram leaves as fragments, and only the first has a DBLP header."""
    table = f"dtburst_check{traffic}"
    script = loss_script(table, [(pair.dev[0], "")], 1.0, "lo", traffic)
    pair.exec(0, "nft", "-f", "-", input=script)
    try:
        arrived = _arrived(*_exchange(pair))
    finally:
        pair.exec(0, "nft", "delete", "table", "netdev", table, check=False)
    assert arrived == EXPECTED[traffic]
