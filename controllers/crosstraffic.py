"""Paced UDP senders for `congest` bursts and benchmarks (stdlib only).

One-shot mode: ``--dst ... --rate-mbps ...`` prints ``go <time_ns>`` when the
first packet leaves, sends until SIGTERM or ``--duration-s``, then prints
``sent <n>``. Agent mode (``--agent``): a long-lived process in a host that
reads ``start ID DST SPORT RATE_MBPS PKT_BYTES`` / ``stop ID`` lines on stdin
and answers ``go ID <time_ns>`` / ``sent ID <n>``; the controller keeps one
per cross-traffic host so a `congest` burst starts in milliseconds instead of
an interpreter start-up (~150 ms on this machine).
"""
import argparse
import signal
import socket
import sys
import threading
import time


def pace(socks, dst, dport, rate_mbps, pkt_bytes, stop, duration_s=600.0, on_go=None):
    """Send round-robin over ``socks`` at ``rate_mbps`` until ``stop()``; returns packets sent."""
    payload = b"\0" * pkt_bytes
    interval = pkt_bytes * 8 / (rate_mbps * 1e6)
    t0 = time.monotonic()
    if on_go:
        on_go(time.time_ns())
    n = 0
    end = t0 + duration_s
    while not stop():
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - t0) / interval) + 1
        while n < due:
            try:
                socks[n % len(socks)].sendto(payload, (dst, dport))
            except OSError:
                pass  # full socket buffer / unreachable: keep pacing
            n += 1
        time.sleep(min(0.001, max(0.0, t0 + n * interval - time.monotonic())))
    return n


def make_socks(sport, flows):
    socks = []
    for i in range(max(1, flows)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        if sport:
            s.bind(("", sport + i))
        socks.append(s)
    return socks


def agent():
    out_lock = threading.Lock()
    flows = {}

    def say(line):
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def run(fid, dst, sport, rate, size, flag):
        socks = make_socks(sport, 1)
        try:
            n = pace(socks, dst, 9, rate, size, lambda: flag.is_set(),
                     on_go=lambda t: say(f"go {fid} {t}"))
        finally:
            for s in socks:
                s.close()
        say(f"sent {fid} {n}")

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        try:
            if parts[0] == "start" and len(parts) == 6:
                fid, dst = parts[1], parts[2]
                sport, rate, size = int(parts[3]), float(parts[4]), int(parts[5])
                flag = threading.Event()
                t = threading.Thread(target=run, args=(fid, dst, sport, rate, size, flag), daemon=True)
                flows[fid] = (t, flag)
                t.start()
            elif parts[0] == "stop" and len(parts) == 2 and parts[1] in flows:
                t, flag = flows.pop(parts[1])
                flag.set()
            else:
                say(f"error bad command {line.strip()!r}")
        except (ValueError, OSError) as e:
            say(f"error {type(e).__name__}: {e}")
    for _t, flag in flows.values():
        flag.set()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--agent", action="store_true", help="serve start/stop commands on stdin")
    ap.add_argument("--dst")
    ap.add_argument("--dport", type=int, default=9)
    ap.add_argument("--sport", type=int, default=0)
    ap.add_argument("--rate-mbps", type=float)
    ap.add_argument("--pkt-bytes", type=int, default=1400)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--flows", type=int, default=1,
                    help="round-robin over this many sockets bound to sport, sport+1, ...")
    a = ap.parse_args(argv)
    if a.agent:
        return agent()
    if not a.dst or not a.rate_mbps or a.rate_mbps <= 0:
        ap.error("--dst and --rate-mbps > 0 are required")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    n = pace(make_socks(a.sport, a.flows), a.dst, a.dport, a.rate_mbps, a.pkt_bytes,
             lambda: bool(stop), a.duration_s, on_go=lambda t: print(f"go {t}", flush=True))
    print(f"sent {n}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
