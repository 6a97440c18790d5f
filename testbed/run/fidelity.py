"""Fidelity invariants of an arm, in the spirit of Mininet-HiFi.

An emulated network is only a network while the emulator keeps up. During
each arm we watch three things that tell whether the numbers were decided by
the shaped links or by the machine running them: the rate the bottleneck
queue actually achieved against the shaped rate, the CPU, and packets Open
vSwitch dropped on its own (socket overflow, not our queues).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time

from testbed.run.queuetrace import QueueTrace, link_invariants, queue_samples
from workloads.runlog import RunLog

# Period of the queue samples. Forking `tc -s qdisc show dev X` costs about
# 1.7 ms of CPU (tc 1.35 ms + the parent 0.3 ms, measured on the 2-core test
# machine over 600 calls): 3.3 % of one core at 50 ms. The default link (100
# packets of 1500 B at 20 Mbit/s) drains a full queue in 60 ms, so a 100 ms
# period could miss a fill-and-drain entirely; 50 ms sees each one.
QUEUE_PERIOD_S = 0.05

_QDISC = re.compile(r"^qdisc (\S+) (\S+) (root|parent (\S+))")
_LIMIT = re.compile(r" limit (\d+)p\b")
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)")
_BACKLOG = re.compile(r"backlog (\d+)b (\d+)p")


def parse_qdiscs(text: str) -> list[dict]:
    """The qdiscs of `tc -s qdisc show` output, in the order tc lists them (root first).

    Each: kind, handle, parent (None for the root), limit_packets (a
    packet limit such as pfifo's, else None) and, from the statistics
    lines, sent_bytes, sent_packets, dropped, backlog_bytes, backlog_packets.
    """
    out: list[dict] = []
    for line in text.splitlines():
        m = _QDISC.match(line)
        if m:
            lim = _LIMIT.search(line)
            out.append({"kind": m.group(1), "handle": m.group(2), "parent": m.group(4),
                        "limit_packets": int(lim.group(1)) if lim else None})
        elif out:
            m = _SENT.search(line)
            if m:
                out[-1].update(sent_bytes=int(m.group(1)), sent_packets=int(m.group(2)),
                               dropped=int(m.group(3)))
            m = _BACKLOG.search(line)
            if m:
                out[-1].update(backlog_bytes=int(m.group(1)), backlog_packets=int(m.group(2)))
    return out


def bounded_queue(qdiscs: list[dict]) -> dict | None:
    """The queue that fills and drops: the `pfifo` child under HTB, else the root.

    HTB only delays; the packets wait, and are dropped, in its pfifo child
    (testbed.emulation.fabric.shaping_batch). An interface without one (not
    a shaped fabric port) is described by its root qdisc.
    """
    full = [q for q in qdiscs if "backlog_packets" in q and "dropped" in q]
    fifo = [q for q in full if q["kind"] == "pfifo"]
    return (fifo or full)[0] if full else None


def _tc_show(intf: str) -> str | None:
    try:
        out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", intf], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if out.returncode else out.stdout


def qdisc_counters(intf: str) -> tuple[int, int] | None:
    """(bytes sent by the root qdisc, most packets any of its qdiscs dropped) on `intf`."""
    qdiscs = [q for q in parse_qdiscs(_tc_show(intf) or "") if "sent_bytes" in q]
    if not qdiscs:
        return None
    return qdiscs[0]["sent_bytes"], max(q["dropped"] for q in qdiscs)


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

    Given `queue_log` (RUN/raw/<arm>/seed-<seed>/queue.jsonl), a second thread samples
    the queue's occupancy every `queue_period_s` with `tc -s qdisc` (the
    kernel tells no other way without netlink code) and writes each sample
    as a declared ``queue`` event. The period is kept on the monotonic clock
    (no drift, a late sample does not shift the next ones); each sample is
    stamped with time.time_ns(), the clock of every raw log, so it joins the
    burst windows exactly.
    """

    def __init__(self, intf: str, shaped_mbps: float, window_s: float = 0.2,
                 arm: str = "", queue_log: str | os.PathLike | None = None,
                 queue_period_s: float = QUEUE_PERIOD_S, trace: bool = True):
        self.intf, self.shaped_mbps, self.window_s = intf, shaped_mbps, window_s
        self.path = f"/sys/class/net/{intf}/statistics/tx_bytes"
        self.samples: list[tuple[float, int]] = []
        self.queue_samples, self.queue_peak = 0, None
        self.q_start = qdisc_counters(intf)
        self.ovs_start = ovs_drops()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        self._log = RunLog(os.fspath(queue_log), arm) if queue_log else None
        # The kernel's trace of the port when it can (no process, exact); else tc samples.
        self.trace: QueueTrace | None = None
        if self._log and trace:
            self.trace = QueueTrace(intf, f"dblp-testbed-{os.getpid()}-{intf}")
            if not self.trace.start():
                self.trace = None
        self.mono_to_ns = time.time_ns() - time.monotonic_ns()
        self.link: dict = {}
        if self._log and self.trace is None:
            self._threads.append(threading.Thread(target=self._sample_queue, daemon=True,
                                                  args=(self._log, queue_period_s)))
        for t in self._threads:
            t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                with open(self.path) as fh:
                    self.samples.append((time.monotonic(), int(fh.read())))
            except (OSError, ValueError):
                return
            self._stop.wait(0.02)

    def _sample_queue(self, log: RunLog, period: float):
        due = time.monotonic()
        while not self._stop.is_set():
            t0 = time.time_ns()
            q = bounded_queue(parse_qdiscs(_tc_show(self.intf) or ""))
            t1 = time.time_ns()
            if q is not None:
                log.write("queue", t_ns=(t0 + t1) // 2, interface=self.intf,
                                backlog_bytes=q["backlog_bytes"],
                                backlog_packets=q["backlog_packets"], dropped=q["dropped"],
                                limit_packets=q["limit_packets"])
                self.queue_samples += 1
                self.queue_peak = max(self.queue_peak or 0, q["backlog_packets"])
            due = max(due + period, time.monotonic())   # a late sample skips, never bunches
            self._stop.wait(due - time.monotonic())

    def stop(self) -> None:
        """End the sampling; idempotent. The runner calls it also when the arm
        failed, or the queue sampler would fork tc on through the next arms."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=6)   # a tc call in flight has a 5 s timeout
        if self.trace is not None:
            self._from_trace(self.trace)
            self.trace = None
        if self._log:
            self._log.close()

    def _from_trace(self, trace: QueueTrace) -> None:
        """The queue samples and the link's invariants from the unit's kernel trace."""
        deps = trace.stop()
        limit = next((q["limit_packets"] for q in parse_qdiscs(_tc_show(self.intf) or "")
                      if q["kind"] == "pfifo"), None)
        base = self.q_start[1] if self.q_start else 0
        assert self._log is not None
        for t_ns, behind, nbytes, dropped in queue_samples(deps, self.mono_to_ns):
            self._log.write("queue", t_ns=t_ns, interface=self.intf, backlog_bytes=nbytes,
                            backlog_packets=behind, dropped=base + dropped, limit_packets=limit)
            self.queue_samples += 1
            self.queue_peak = max(self.queue_peak or 0, behind)
        self.link = {**link_invariants(deps, self.shaped_mbps * 1e6), "queue_source": "trace",
                     "trace_packets": len(deps), "trace_lost_events": trace.overflow,
                     "trace_complete_s": trace.complete_s}

    def summary(self) -> dict:
        self.stop()
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
        out = {"bottleneck": self.intf, "shaped_mbps": self.shaped_mbps,
               "achieved_mbps": round(best, 2), "queue_drops": drops,
               "ovs_drops": ovs_drops() - self.ovs_start}
        if self._log:
            out.update(queue_samples=self.queue_samples, queue_peak_packets=self.queue_peak,
                       **self.link)
        return out
