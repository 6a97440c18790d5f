"""IP reassembly after a lossy burst of 8 KB datagrams, between two network namespaces.

The prototype's 8 KB chunks leave as six IP fragments each. A loss burst
leaves the receiver's reassembly memory full of datagrams that lost a
fragment; with Linux's defaults (``ipfrag_high_thresh`` 4 MiB, incomplete
datagrams kept for ``ipfrag_time`` 30 s) every fragment after that is
dropped until they expire, so clean datagrams sent right after the burst
never arrive (docs/results/paper-prototype.md: none of 218). The fabric gives
each host ``testbed.emulation.fabric.REASSEMBLY_LIMITS`` when a job's chunks
fragment; with them the same clean datagrams all arrive.

No fabric: a veth pair between two namespaces (``NetnsPair``), the loss an
nftables drop of a share of the receiver's incoming UDP *fragments* (a
prerouting hook, which sees fragments before the kernel reassembles them at
local delivery). Needs root, as the other tests here.
"""
import subprocess
import sys

import pytest

from testbed.emulation.fabric import REASSEMBLY_LIMITS, reassembly_sysctls
from testbed.emulation.netns import NetnsPair

pytestmark = pytest.mark.emu

PORT = 47999
LOSSY, CLEAN = 3000, 218  # 8 KB datagrams in the burst, then clean ones (the doc page's 218)
DEFAULTS = {"net.ipv4.ipfrag_high_thresh": 4 << 20, "net.ipv4.ipfrag_low_thresh": 3 << 20,
            "net.ipv4.ipfrag_time": 30}

RECEIVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
s.settimeout(30)
lossy = clean = 0
while True:
    try:
        data = s.recv(65536)
    except socket.timeout:
        break
    if data[:1] == b"E":  # the sender's last word
        s.settimeout(1.0)
        continue
    if data[:1] == b"C":
        clean += 1
    else:
        lossy += 1
print(lossy, clean, flush=True)
"""

SENDER = r"""
import socket, sys, time
dst, port, lossy, clean = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 0)  # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: fragment
body = bytes(8256)  # an 8 KB chunk's datagram: six fragments at a 1500-byte MTU
for _ in range(lossy):
    s.sendto(b"L" + body[1:], (dst, port))
print("burst sent", flush=True)
sys.stdin.readline()  # the loss is off now
for _ in range(clean):
    s.sendto(b"C" + body[1:], (dst, port))
    time.sleep(0.002)
time.sleep(0.5)
s.sendto(b"E", (dst, port))
"""


def _fragment_loss(pair: NetnsPair, side: int, percent: int) -> None:
    rules = f"""table ip dbtfrag {{
    chain pre {{
        type filter hook prerouting priority -500; policy accept;
        ip protocol udp numgen random mod 100 < {percent} counter drop
    }}
}}
"""
    pair.exec(side, "nft", "-f", "-", input=rules)


def _burst_then_clean(limits: dict) -> tuple[int, int, int]:
    """(lossy datagrams, clean datagrams, ReasmFails) at the receiver with ``limits`` set."""
    with NetnsPair(rate_bps=None) as pair:
        pair.exec(1, "sysctl", "-q", "-w", *[f"{k}={v}" for k, v in limits.items()])
        for k, v in limits.items():
            assert pair.exec(1, "sysctl", "-n", k).stdout.strip() == str(v)
        rx = subprocess.Popen(["ip", "netns", "exec", pair.ns[1], sys.executable, "-c", RECEIVER,
                               str(PORT)], stdout=subprocess.PIPE, text=True)
        tx = None
        try:
            assert rx.stdout.readline().strip() == "ready"
            _fragment_loss(pair, 1, 60)
            tx = subprocess.Popen(["ip", "netns", "exec", pair.ns[0], sys.executable, "-c",
                                   SENDER, pair.ip[1], str(PORT), str(LOSSY), str(CLEAN)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert tx.stdout.readline().strip() == "burst sent"
            pair.exec(1, "nft", "delete", "table", "ip", "dbtfrag")
            tx.stdin.write("go\n")
            tx.stdin.flush()
            assert tx.wait(60) == 0
            lossy, clean = (int(x) for x in rx.communicate(timeout=60)[0].split())
        finally:
            for p in (rx, tx):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        nstat = pair.exec(1, "nstat", "-asz", "IpReasmFails").stdout.split()
        fails = int(nstat[nstat.index("IpReasmFails") + 1])
    print(f"ipfrag_high_thresh {limits['net.ipv4.ipfrag_high_thresh']}: {lossy} of {LOSSY} "
          f"lossy and {clean} of {CLEAN} clean datagrams arrived, ReasmFails {fails}")
    return lossy, clean, fails


def test_raised_reassembly_limits_let_clean_datagrams_through_after_a_lossy_burst():
    assert reassembly_sysctls(8192) == REASSEMBLY_LIMITS and reassembly_sysctls(1408) == {}
    lossy, clean, fails = _burst_then_clean(DEFAULTS)
    # Linux's defaults: the burst's incomplete datagrams fill the 4 MiB and the
    # clean ones are dropped fragment by fragment (a few may slip in first).
    assert lossy < LOSSY // 10 and fails > 1000 and clean < CLEAN // 10, (lossy, clean, fails)
    lossy, clean, fails = _burst_then_clean(REASSEMBLY_LIMITS)
    assert clean == CLEAN, (lossy, clean, fails)
