"""Fabric checks shared by `dblp-testbed net check` and the emulation tests.

Each check runs real traffic between emulated hosts: ICMP for reachability,
paced UDP flows with distinct source ports for the core spread (read back from
the core switches' port counters), iperf3 for TCP goodput.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time


def all_pairs(fab, count: int = 3, timeout: float = 5.0, total_pps: float = 4000.0) -> dict:
    """ICMP echo between every ordered host pair; one paced prober process per host.

    Each prober starts its target list at its own position, so the probes do
    not converge on one destination at a time, and all probers together send
    at most ``total_pps`` (the userspace datapath forwards with one core).
    """
    hosts = fab.hosts()
    pps = min(2000.0, total_pps / len(hosts))
    send_s = count * (len(hosts) - 1) / pps
    procs = {}
    for i, h in enumerate(hosts):
        others = hosts[i + 1:] + hosts[:i]
        targets = [fab.ip(d) for d in others]
        procs[h] = fab.popen(h, [sys.executable, "-m", "testbed.emulation.netprobe", "--count", str(count),
                                 "--timeout", str(timeout), "--pps", str(pps)] + targets,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failed, ok = [], 0
    for h, p in procs.items():
        out, err = p.communicate(timeout=timeout + send_s + 30)
        try:
            res = json.loads(out)
        except ValueError:
            raise RuntimeError(f"prober in {h} failed: {err.strip()[:300]}") from None
        for ip, n in res.items():
            if n == count:
                ok += 1
            else:
                failed.append({"src": h, "dst": fab.topo.host_by_ip(ip), "received": n, "sent": count})
    pairs = len(hosts) * (len(hosts) - 1)
    return {"pairs": pairs, "pairs_ok": ok, "failed": failed[:20], "n_failed": len(failed), "count": count,
            "received_hist": dict(__import__("collections").Counter(f["received"] for f in failed))}


def port_packets(switch: str) -> int:
    """Packets transmitted by all ports of one bridge (OpenFlow port counters)."""
    p = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", switch],
                       capture_output=True, text=True, check=True)
    return sum(int(x) for x in re.findall(r"tx pkts=(\d+)", p.stdout))


def core_spread(fab, src: str | None = None, dst: str | None = None, flows: int = 16,
                rate_mbps: float = 4.0, duration_s: float = 1.5, sport: int = 41000) -> dict:
    """UDP flows with distinct source ports from src to dst; packets seen per core switch."""
    cores = [s for s in fab.topo.switches() if fab.topo.switch_info[s].tier == max(
        fab.topo.switch_info[x].tier for x in fab.topo.switches())]
    if src is None or dst is None:
        pods = sorted({fab.topo.host_info[h].pod for h in fab.hosts()})
        src = src or next(h for h in fab.hosts() if fab.topo.host_info[h].pod == pods[0])
        dst = dst or next(h for h in fab.hosts() if fab.topo.host_info[h].pod == pods[-1])
    before = {c: port_packets(c) for c in cores}
    p = fab.popen(src, [sys.executable, "-m", "controllers.crosstraffic", "--dst", fab.ip(dst),
                        "--sport", str(sport), "--flows", str(flows), "--rate-mbps", str(rate_mbps),
                        "--pkt-bytes", "200", "--duration-s", str(duration_s)],
                  stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=duration_s + 30)
    sent = int(out.split("sent")[-1].split()[0]) if "sent" in out else 0
    time.sleep(0.2)
    per_core = {c: port_packets(c) - before[c] for c in cores}
    expected = sent / max(1, len(cores))
    used = [c for c, n in per_core.items() if n >= 0.25 * expected]
    return {"src": src, "dst": dst, "flows": flows, "sent": sent, "per_core": per_core,
            "core_switches": len(cores), "core_switches_used": len(used)}


def tcp_goodput(fab, pairs, duration_s: float = 5.0, base_port: int = 5201,
                cport: int = 42000) -> dict:
    """iperf3 TCP goodput for concurrent flows, one per (src, dst) pair, in Mbit/s."""
    servers, clients = [], []
    try:
        for i, (_, dst) in enumerate(pairs):
            servers.append(fab.popen(dst, ["iperf3", "-s", "-1", "-p", str(base_port + i)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for i, (src, dst) in enumerate(pairs):
            clients.append(fab.popen(src, ["iperf3", "-c", fab.ip(dst), "-p", str(base_port + i),
                                           "--cport", str(cport + i), "-t", str(duration_s), "-J"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        rates = []
        for c in clients:
            out, err = c.communicate(timeout=duration_s + 30)
            try:
                res = json.loads(out)
                rates.append(res["end"]["sum_received"]["bits_per_second"] / 1e6)
            except (ValueError, KeyError):
                raise RuntimeError(f"iperf3 failed: {(out or err).strip()[-300:]}") from None
    finally:
        for s in servers:
            if s.poll() is None:
                s.terminate()
            try:
                s.wait(timeout=3)
            except subprocess.TimeoutExpired:
                s.kill()
    return {"flows": len(pairs), "per_flow_mbps": [round(r, 2) for r in rates],
            "total_mbps": round(sum(rates), 2)}


def cross_pod_pairs(topo, n: int) -> list:
    """n disjoint cross-pod host pairs (distinct sources and destinations)."""
    pods = sorted({topo.host_info[h].pod for h in topo.hosts()})
    if len(pods) < 2:
        hosts = topo.hosts()
        return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(min(n, len(hosts)))]
    by_pod = {p: [h for h in topo.hosts() if topo.host_info[h].pod == p] for p in pods}
    out, used = [], set()
    i = 0
    while len(out) < n and i < 10 * n:
        sp, dp = pods[i % len(pods)], pods[(i + len(pods) // 2) % len(pods)]
        src = next((h for h in by_pod[sp] if h not in used), None)
        dst = next((h for h in by_pod[dp] if h not in used and h != src), None)
        if src and dst:
            out.append((src, dst))
            used |= {src, dst}
        i += 1
    return out
