"""A paced, sequence-numbered UDP flow for measuring loss windows (stdlib only).

``send``: packets carry (seq, send time_ns); at the end the sender writes every
send time to ``--log`` (JSON). ``recv``: records received sequence numbers
until SIGTERM or ``--duration-s``, then writes them to ``--log``. Joining both
on the shared kernel clock gives loss per time window.
"""
import argparse
import json
import signal
import socket
import struct
import sys
import time

HDR = struct.Struct("!Iq")


def send(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    if a.sport:
        s.bind(("", a.sport))
    pad = b"\0" * max(0, a.pkt_bytes - HDR.size)
    n = int(a.rate_pps * a.duration_s)
    interval = 1.0 / a.rate_pps
    times = []
    t0 = time.monotonic()
    for seq in range(n):
        due = t0 + seq * interval
        while True:
            now = time.monotonic()
            if now >= due:
                break
            time.sleep(min(0.0005, due - now))
        t = time.time_ns()
        try:
            s.sendto(HDR.pack(seq, t) + pad, (a.dst, a.dport))
        except OSError:
            pass
        times.append(t)
    with open(a.log, "w") as f:
        json.dump({"sent": times}, f)


def recv(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("", a.dport))
    s.settimeout(0.2)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    got = []
    end = time.monotonic() + a.duration_s
    print("ready", flush=True)
    while not stop and time.monotonic() < end:
        try:
            data = s.recv(4096)
        except TimeoutError:
            continue
        except InterruptedError:
            continue
        if len(data) >= HDR.size:
            got.append(HDR.unpack_from(data)[0])
    with open(a.log, "w") as f:
        json.dump({"received": got}, f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("mode", choices=["send", "recv"])
    ap.add_argument("--dst")
    ap.add_argument("--dport", type=int, default=46000)
    ap.add_argument("--sport", type=int, default=0)
    ap.add_argument("--rate-pps", type=float, default=2000)
    ap.add_argument("--pkt-bytes", type=int, default=200)
    ap.add_argument("--duration-s", type=float, default=2.0)
    ap.add_argument("--log", required=True)
    a = ap.parse_args(argv)
    (send if a.mode == "send" else recv)(a)


if __name__ == "__main__":
    sys.exit(main())
