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
#: the line-rate verdicts (docs/results/linerate.md) set the row aside. On this project's 2-core machine,
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

    def _delta(self) -> list[int]:
        return _ticks_between(self.first, self.last)

    def busy_fraction(self) -> float:
        return _busy(self._delta())

    def steal_fraction(self) -> float:
        return _steal(self._delta())


class CpuTally:
    """CpuSampler's fractions over several intervals, each from ``start()`` to ``stop()``.

    Why: a bench that interleaves its rows' round trips (so that two transports
    compared within a run meet the same machine) must charge each row the CPU
    time of its own round trips only, not of the time between its first and last.
    """

    def __init__(self, read=read_cpu_times):
        self._read = read
        self._since: list[int] | None = None
        self._sum: list[int] = []

    def start(self) -> None:
        self._since = self._read()

    def stop(self) -> None:
        if self._since is None:
            raise RuntimeError("CpuTally.stop() without start()")
        d = _ticks_between(self._since, self._read())
        self._sum = [a + b for a, b in zip(self._sum, d, strict=False)] if self._sum else d
        self._since = None

    def busy_fraction(self) -> float:
        return _busy(self._sum)

    def steal_fraction(self) -> float:
        return _steal(self._sum)


def _ticks_between(first: list[int], last: list[int]) -> list[int]:
    return [b - a for a, b in zip(first, last, strict=False)]


def _busy(d: list[int]) -> float:
    total = sum(d)
    return round(1 - (d[_IDLE] + d[_IOWAIT]) / total, 3) if total else 0.0


def _steal(d: list[int]) -> float:
    total = sum(d)
    return round(d[_STEAL] / total, 3) if total and len(d) > _STEAL else 0.0
