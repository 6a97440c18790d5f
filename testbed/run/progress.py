"""The run's progress on stderr: which unit of how many runs, its rounds, and the run's ETA.

Each unit starts with a line saying which unit of how many it is and the
run's ETA (`RunClock.start_line`), and its round line (`Progress`) carries
both; the run's ETA comes from the finished units' durations
(`run_remaining_s`), so it learns how long each arm takes as the run goes.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time

from testbed import output


def span(seconds: float | None) -> str:
    """A duration as progress lines say it: ``45 s``, ``12 min 05 s``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    return f"{s} s" if s < 100 else f"{s // 60} min {s % 60:02d} s"


def run_remaining_s(units: list[tuple[str, int]], index: int,
                    durations: dict[str, list[float]], unit_elapsed_s: float,
                    unit_left_s: float | None) -> float | None:
    """Seconds until the run ends, while unit ``index`` of ``units`` runs (None: no basis yet).

    A unit not started yet is estimated at the mean wall time of the finished
    units of its arm (arms differ most: ``local`` takes seconds, a dblp arm
    under bursts minutes), else at the mean of every finished unit; before
    any unit finished, at the running unit's own projected wall time
    (``unit_elapsed_s + unit_left_s``). The running unit's remainder is
    ``unit_left_s``, its own ETA from its rounds (`Progress`), or, before
    its first round, its estimate less the time it has run.
    """
    every = [d for ds in durations.values() for d in ds]

    def estimate(arm: str) -> float | None:
        own = durations.get(arm) or every
        return sum(own) / len(own) if own else None

    left = unit_left_s
    if left is None:
        est = estimate(units[index][0])
        left = None if est is None else max(0.0, est - unit_elapsed_s)
    if left is None:
        return None
    later = [estimate(arm) if every else unit_elapsed_s + left for arm, _ in units[index + 1:]]
    if any(e is None for e in later):
        return None
    return left + sum(e for e in later if e is not None)


class RunClock:
    """Where the run is: which unit of how many runs, and the run's ETA (`run_remaining_s`).

    A unit's duration is its wall time from its start to its end: starting
    its processes and captures, its rounds, and stopping them.
    """

    def __init__(self, units: list[tuple[str, int]]):
        self.units = list(units)
        self.t0 = time.monotonic()
        self.index = -1
        self.unit_t0 = self.t0
        self.durations: dict[str, list[float]] = {}

    def start(self, index: int, now: float | None = None) -> None:
        self.index = index
        self.unit_t0 = time.monotonic() if now is None else now

    def finish(self, now: float | None = None) -> None:
        """The running unit finished: its duration now informs the estimates."""
        now = time.monotonic() if now is None else now
        self.durations.setdefault(self.units[self.index][0], []).append(now - self.unit_t0)

    def place(self) -> str:
        return f"unit {self.index + 1}/{len(self.units)}"

    def remaining_s(self, unit_left_s: float | None = None, now: float | None = None
                    ) -> float | None:
        now = time.monotonic() if now is None else now
        return run_remaining_s(self.units, self.index, self.durations, now - self.unit_t0,
                               unit_left_s)

    def start_line(self, label: str, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        return (f"[{label}] {self.place()} starts; run elapsed {span(now - self.t0)}, "
                f"run ETA {span(self.remaining_s(None, now))}")


class Progress:
    """One status line per unit ("[dblp s2] unit 3/12 round 40/200 ..."): round, rate and
    ETA from rank 0's log, and with a `RunClock` the unit's place and the whole run's ETA."""

    def __init__(self, arm: str, rounds: int, log: pathlib.Path, clock: RunClock | None = None):
        self.arm, self.rounds, self.log = arm, rounds, log
        self.clock = clock
        self.t0 = time.monotonic()
        self.last_print = 0.0
        self.round = 0
        self.tty = sys.stderr.isatty()

    def _latest_round(self) -> int:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                tail = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return self.round
        for line in reversed(tail):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "round":
                return int(rec["round"]) + 1
        return self.round

    def show(self, final: bool = False):
        now = time.monotonic()
        if not final and now - self.last_print < (1.0 if self.tty else 15.0):
            return
        self.last_print = now
        self.round = self._latest_round()
        el = now - self.t0
        # Before the first round there is no rate to extrapolate: the ETA is "?", not nan.
        eta = el / self.round * (self.rounds - self.round) if self.round else None
        place = f" {self.clock.place()}" if self.clock is not None else ""
        msg = (f"[{self.arm}]{place} round {self.round}/{self.rounds}  elapsed {el:5.0f} s  "
               f"ETA {'?' if eta is None else f'{eta:.0f}':>5} s")
        if self.clock is not None:
            msg += f"  run ETA {span(self.clock.remaining_s(eta, now))}"
        if self.tty and not final:
            output.say("\r" + msg, nl=False)
        else:
            output.say(("\r" if self.tty else "") + msg)
