"""Where a unit's CPU went, and how far the transport's pacers fell behind.

Why: on a machine of two cores the fabric's switches, the workers' training,
the transports and the harness share the same CPU, and a unit whose CPU ran
out measures the machine (`testbed.invariants`). Sizing a preset to the
machine needs the budget per component, not only the machine-wide busy
fraction: Open vSwitch's forwarding, each worker's training and transport,
the server's transport, the controller, the harness and the kernel's
network work (softirq: veths, the shapers, the burst rules).

Long-lived processes (Open vSwitch, the controller, this harness) and the
machine's counters are sampled from /proc by the supervisor's loop (a few
file reads every half second, no process forked); the workloads, which exit
with the unit, write their own CPU seconds into their round events (compute
and exchange apart), read back here from raw/. Everything is judged over
the unit's rounds, from the first round's start to the last one's end.
"""
from __future__ import annotations

import json
import os
import pathlib
import time

from testbed.cpustat import read_cpu_times

_HZ = os.sysconf("SC_CLK_TCK")
_SOFTIRQ = 6
OVS_PIDFILES = {"ovs-vswitchd": "/var/run/openvswitch/ovs-vswitchd.pid",
                "ovsdb-server": "/var/run/openvswitch/ovsdb-server.pid"}


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) ``pid`` has used; None if it is gone."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ
    except (OSError, IndexError, ValueError):
        return None


def _pidfile(path: str) -> int | None:
    try:
        return int(pathlib.Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class UnitCpu:
    """The machine's and the long-lived processes' CPU through one unit, sampled by the supervisor.

    Judged over the unit's rounds only (`window`): the workers' start-up
    (forked from the run's fork servers, building the model, joining) and
    their end decide no figure, so counting them would flag short units for
    what they do before and after they measure anything.
    """

    def __init__(self, controller_pid: int | None = None, read=read_cpu_times):
        self.pids = {name: _pidfile(f) for name, f in OVS_PIDFILES.items()}
        self.pids["controller"] = controller_pid
        self.pids["harness"] = os.getpid()
        self._read = read
        self.samples: list[tuple[int, list[int], dict[str, float | None]]] = []
        self.sample()

    def sample(self) -> None:
        """Record the machine's CPU counters and each long-lived process's CPU seconds now."""
        procs = {name: process_cpu_s(pid) if pid else None for name, pid in self.pids.items()}
        self.samples.append((time.time_ns(), self._read(), procs))

    def _span(self, window: tuple[int, int] | None):
        """The first and last samples inside ``window`` (all samples when it holds fewer than two)."""
        inside = [s for s in self.samples if window and window[0] <= s[0] <= window[1]]
        pick = inside if len(inside) >= 2 else self.samples
        return pick[0], pick[-1]

    def fractions(self, window: tuple[int, int] | None = None) -> dict:
        """cpu_busy_frac and cpu_steal_frac over ``window`` (time_ns bounds), as CpuSampler's."""
        first, last = self._span(window)
        d = [b - a for a, b in zip(first[1], last[1], strict=False)]
        total = sum(d)
        busy = round(1 - (d[3] + d[4]) / total, 3) if total else 0.0
        steal = round(d[7] / total, 3) if total and len(d) > 7 else 0.0
        return {"cpu_busy_frac": busy, "cpu_steal_frac": steal,
                "cpu_window_s": round((last[0] - first[0]) / 1e9, 2)}

    def budget(self, unit_raw: pathlib.Path, window: tuple[int, int] | None = None) -> dict:
        """Component -> share of one core over ``window``; ``machine busy`` is the sum over cores."""
        first, last = self._span(window)
        wall = max(1e-9, (last[0] - first[0]) / 1e9)
        out: dict[str, float] = {}
        for name in self.pids:
            a, b = first[2].get(name), last[2].get(name)
            if a is not None and b is not None:
                out[name] = round((b - a) / wall, 3)
        for name, seconds in workload_cpu_s(unit_raw, window).items():
            out[name] = round(seconds / wall, 3)
        d = [b - a for a, b in zip(first[1], last[1], strict=False)]
        total = sum(d)
        if total:
            cores = os.cpu_count() or 1
            out["kernel softirq"] = round(d[_SOFTIRQ] / total * cores, 3)
            out["machine busy"] = round((1 - (d[3] + d[4]) / total) * cores, 3)
        return out


def rounds_window(unit_raw: pathlib.Path) -> tuple[int, int] | None:
    """(first round's start, last round's end) over the unit's workers, time_ns; None before any."""
    starts, ends = [], []
    for log in unit_raw.glob("worker*.jsonl"):
        for rec in _rounds(log):
            starts.append(rec["t_start_ns"])
            ends.append(rec["t_end_ns"])
    return (min(starts), max(ends)) if starts else None


def _rounds(path: pathlib.Path):
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "round":
                    yield rec
    except OSError:
        return


def workload_cpu_s(unit_raw: pathlib.Path, window: tuple[int, int] | None = None) -> dict[str, float]:
    """CPU seconds the unit's workloads logged in rounds inside ``window``: the workers'
    training, the workers' and the server's exchange."""
    def within(rec) -> bool:
        return window is None or (window[0] <= rec["t_start_ns"] and rec["t_end_ns"] <= window[1])

    out = {"workers: training": 0.0, "workers: exchange": 0.0}
    for log in sorted(unit_raw.glob("worker*.jsonl")):
        for rec in filter(within, _rounds(log)):
            out["workers: training"] += rec.get("compute_cpu_s") or 0.0
            out["workers: exchange"] += rec.get("comm_cpu_s") or 0.0
    server = unit_raw / "server.jsonl"
    if server.exists():
        out["server: exchange"] = sum(rec.get("comm_cpu_s") or 0.0
                                      for rec in filter(within, _rounds(server)))
    return out


def pacing_late_frac(unit_raw: pathlib.Path) -> float | None:
    """The worst process's pacing error: its pacers' lateness over their sending time.

    None when no process of the unit paces (gloo) or none logged it.
    """
    worst = None
    for log in sorted(unit_raw.glob("*.jsonl")):
        late = busy = 0.0
        for rec in _rounds(log):
            st = rec.get("stats") or {}
            late += st.get("pace_late_s") or 0.0
            busy += st.get("pace_busy_s") or 0.0
        if busy > 0:
            frac = round(late / busy, 4)
            worst = frac if worst is None else max(worst, frac)
    return worst
