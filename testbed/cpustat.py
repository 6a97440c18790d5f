"""Machine-wide CPU accounting from ``/proc/stat``: how busy the cores were, and how
much of their time the hypervisor gave to someone else.

Why both: the testbed's figures come from processes sharing two cores. A
saturated CPU means a figure may measure the emulator rather than the network;
*steal* (time a virtual CPU was ready but the host ran another guest) means it
may measure a neighbour. The two look the same in a round's wall time, so a run
records them beside its figures instead of leaving a reader to guess.
"""
from __future__ import annotations

#: Steal from which a figure is the neighbour's as much as ours: a report flags the unit,
#: the README's line-rate verdicts set the row aside. On this project's 2-core machine,
#: 0.1 Gbit/s bench runs with 4-6.5 % steal had DBLP rows up to 11 % slower than runs
#: with under 3 % (its pacer wakes every half millisecond: little slack for a late wake).
STEAL_FLAG = 0.05

# /proc/stat's aggregate "cpu" line: user nice system idle iowait irq softirq steal ...
_IDLE, _IOWAIT, _STEAL = 3, 4, 7


def read_cpu_times(path: str = "/proc/stat") -> list[int]:
    """The aggregate CPU line's counters (clock ticks, summed over every CPU)."""
    with open(path) as fh:
        return [int(x) for x in fh.readline().split()[1:]]


class CpuSampler:
    """CPU busy and steal fractions between construction and the last ``sample()``.

    Fractions are of all CPU time on the machine over the interval (ticks of
    every CPU), so 0.05 steal on two cores is 0.1 of one core's time.
    """

    def __init__(self, read=read_cpu_times):
        self._read = read
        self.first = read()
        self.last = self.first

    def sample(self) -> None:
        self.last = self._read()

    def _delta(self) -> tuple[int, list[int]]:
        d = [b - a for a, b in zip(self.first, self.last, strict=False)]
        return sum(d), d

    def busy_fraction(self) -> float:
        total, d = self._delta()
        return round(1 - (d[_IDLE] + d[_IOWAIT]) / total, 3) if total else 0.0

    def steal_fraction(self) -> float:
        total, d = self._delta()
        return round(d[_STEAL] / total, 3) if total and len(d) > _STEAL else 0.0
