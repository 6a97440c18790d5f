"""A burst kind defined outside the project, in this one file: ``sham``, a placebo burst.

It opens a burst window in the logs (start, end, the rounds it covers) and
touches nothing in the fabric, so a report over sham bursts must find no
burst effect: the analysis's control. Registered by the test that uses it
(``controllers.bursts.register_kind(ShamKind)``).
"""
from __future__ import annotations

import time

from controllers.bursts import BurstKind, Param, Range


class ShamKind(BurstKind):
    """No mechanism: the window is logged, nothing is dropped."""

    name = "sham"
    params = {"label": Param(Range(0, 1000, "use a label number of 0..1000", integer=True), 0,
                             "a number the record carries, to tell sham bursts apart")}
    doc = "a placebo: the burst's window is logged, no packet is touched"

    def start(self) -> None:
        self.switched_on = [tp.intf for tp in self.ports]
        return None

    def stop(self) -> None:
        self.rec.actual_end_ns = time.time_ns()
        self.rec.dropped_packets, self.rec.seen_packets = 0, None
        self.rec.detail = {"label": self.spec.params["label"], "ports": self.switched_on}
