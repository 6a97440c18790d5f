"""A paced UDP sender for `congest` bursts and benchmarks (stdlib only, quick to start).

Prints ``go <time_ns>`` when the first packet leaves, sends until SIGTERM or
``--duration-s``, then prints ``sent <n>``.
"""
import argparse
import signal
import socket
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dst", required=True)
    ap.add_argument("--dport", type=int, default=9)
    ap.add_argument("--sport", type=int, default=0)
    ap.add_argument("--rate-mbps", type=float, required=True)
    ap.add_argument("--pkt-bytes", type=int, default=1400)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--flows", type=int, default=1,
                    help="round-robin over this many sockets bound to sport, sport+1, ...")
    a = ap.parse_args(argv)
    if a.rate_mbps <= 0:
        ap.error("--rate-mbps must be > 0")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    socks = []
    for i in range(max(1, a.flows)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        if a.sport:
            s.bind(("", a.sport + i))
        socks.append(s)
    payload = b"\0" * a.pkt_bytes
    interval = a.pkt_bytes * 8 / (a.rate_mbps * 1e6)
    t0 = time.monotonic()
    print(f"go {time.time_ns()}", flush=True)
    n = 0
    end = t0 + a.duration_s
    while not stop:
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - t0) / interval) + 1
        while n < due:
            try:
                socks[n % len(socks)].sendto(payload, (a.dst, a.dport))
            except OSError:
                pass  # full socket buffer / unreachable: keep pacing
            n += 1
        time.sleep(min(0.001, max(0.0, t0 + n * interval - time.monotonic())))
    print(f"sent {n}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
