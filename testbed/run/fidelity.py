"""Fidelity invariants of an arm, in the spirit of Mininet-HiFi.

An emulated network is only a network while the emulator keeps up. During
each arm we watch three things that tell whether the numbers were decided by
the shaped links or by the machine running them: the rate the bottleneck
queue actually achieved against the shaped rate, the CPU, and packets Open
vSwitch dropped on its own (socket overflow, not our queues).
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time

_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)")


def qdisc_counters(intf: str) -> tuple[int, int] | None:
    """(bytes sent, packets dropped) of the root qdisc on `intf`, root namespace."""
    try:
        out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", intf], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode:
        return None
    sent = dropped = None
    for line in out.stdout.splitlines():
        m = _SENT.search(line)
        if m and sent is None:  # the first qdisc listed is the root (HTB)
            sent = int(m.group(1))
        if m:
            dropped = max(dropped or 0, int(m.group(3)))
    return None if sent is None else (sent, dropped or 0)


def ovs_drops(prefix: str = "dt") -> int:
    """Packets OVS itself dropped on the project's ports (rx + tx)."""
    try:
        out = subprocess.run(["ovs-vsctl", "--format=json", "--columns=name,statistics", "list",
                              "interface"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode:
        return 0
    total = 0
    for name, stats in json.loads(out.stdout)["data"]:
        if not str(name).startswith(prefix):
            continue
        for key, value in stats[1]:
            if key in ("rx_dropped", "tx_dropped"):
                total += int(value)
    return total


class BottleneckMonitor:
    """Samples the bottleneck's transmitted bytes; reports its best achieved
    rate (over `window_s`, short enough to fit inside one push phase) and the
    drops of its queue and of OVS over the arm.

    Bytes come from sysfs, read every 20 ms by a thread: no process is
    forked per sample, so watching costs the emulator nothing noticeable.
    """

    def __init__(self, intf: str, shaped_mbps: float, window_s: float = 0.2):
        self.intf, self.shaped_mbps, self.window_s = intf, shaped_mbps, window_s
        self.path = f"/sys/class/net/{intf}/statistics/tx_bytes"
        self.samples: list[tuple[float, int]] = []
        self.q_start = qdisc_counters(intf)
        self.ovs_start = ovs_drops()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                with open(self.path) as fh:
                    self.samples.append((time.monotonic(), int(fh.read())))
            except (OSError, ValueError):
                return
            self._stop.wait(0.02)

    def summary(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=1)
        best, j = 0.0, 0
        s = self.samples
        for i in range(len(s)):
            while j < i and s[i][0] - s[j][0] > self.window_s:
                j += 1
            if j > 0 and s[i][0] - s[j - 1][0] >= self.window_s:
                t0, b0 = s[j - 1]
                best = max(best, (s[i][1] - b0) * 8 / (s[i][0] - t0) / 1e6)
        q_end = qdisc_counters(self.intf)
        drops = q_end[1] - self.q_start[1] if q_end and self.q_start else None
        return {"bottleneck": self.intf, "shaped_mbps": self.shaped_mbps,
                "achieved_mbps": round(best, 2), "queue_drops": drops,
                "ovs_drops": ovs_drops() - self.ovs_start}
