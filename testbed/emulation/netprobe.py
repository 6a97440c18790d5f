"""ICMP echo from inside an emulated host to many targets at once (stdlib only).

Why not ping(8): iputils is not installed on this machine, and one process
per source host probing every destination is far quicker than one ping per
pair. Usage (inside a host): ``python -m testbed.emulation.netprobe --count 3 IP ...``
prints ``{"IP": received, ...}`` as JSON.
"""
import argparse
import json
import os
import select
import socket
import struct
import sys
import time


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def probe(targets, count=3, timeout=3.0, pps=1000.0):
    ident = os.getpid() & 0xFFFF
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    got = {t: set() for t in targets}
    gap = 1.0 / pps
    t0 = time.monotonic()
    n = 0
    for seq in range(count):
        for t in targets:
            # paced, so that many probers together do not overflow the
            # fabric's bounded queues (which would read as unreachability)
            delay = t0 + n * gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n += 1
            hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            payload = struct.pack("!d", time.time()) + b"dblp" * 8
            pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr + payload), ident, seq) + payload
            sock.sendto(pkt, (t, 0))
    # drain replies that arrived while sending, then wait up to timeout
    deadline = time.time() + timeout
    want = count * len(targets)
    while time.time() < deadline and sum(len(v) for v in got.values()) < want:
        r, _, _ = select.select([sock], [], [], max(0.0, deadline - time.time()))
        if not r:
            break
        data, (addr, _) = sock.recvfrom(2048)
        ihl = (data[0] & 0x0F) * 4
        typ, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
        if typ == 0 and rid == ident and addr in got:
            got[addr].add(rseq)
    return {t: len(v) for t, v in got.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--pps", type=float, default=1000.0, help="probe rate of this prober")
    ap.add_argument("targets", nargs="+")
    a = ap.parse_args(argv)
    print(json.dumps(probe(a.targets, a.count, a.timeout, a.pps)))


if __name__ == "__main__":
    sys.exit(main())
