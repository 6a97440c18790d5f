"""The emulator's invariants: what a unit must have kept for its figures to count.

Mininet-HiFi's principle: an emulated network is a network only while the
machine running it keeps up, so a result counts only while the emulator kept
its invariants. The runner measures them per unit (manifest
``units[].fidelity``, written by `testbed.run.fidelity`); the analysis judges
them here and leaves a unit that broke one out of every interval and verdict
(its figures stay in the tables, marked). Both read this one declaration, so
a limit is defined once and a stored run can be judged again under it.

Why these (each measured per unit):
- CPU busy: the fabric's switches, the workers' training and the transport's
  pacers share the machine's cores; a saturated CPU stretches every round
  whatever the network did.
- CPU steal: time the hypervisor gave another guest looks the same in a
  round's wall time; a unit under it measured a neighbour.
- The other servers' CPU busy and steal, in a fabric across machines
  (`testbed.emulation.cluster`): a saturated server stretches the rounds of
  every worker and link it carries, as this machine does; the busiest one
  is judged.
- The bottleneck's rate while busy: while its queue holds packets, a shaped
  link sends at its shaped rate. Less means the queue was not served in time
  (the kernel's shaper starved of CPU), so the link was slower than the spec.
- Packet spacing: while the queue holds packets, consecutive packets leave
  one transmission time apart. A gap longer than that by more than one
  packet time is a link that stalled; Mininet-HiFi's packet-spacing check.
- The transport's pacing error: how much later than its token bucket asked
  the sender woke to send, as a share of the time it spent sending. A late
  pacer sends slower than its configured rate, so a round measures the CPU.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Invariant:
    """One invariant: a field of the fidelity record and the limit it must keep.

    ``most`` True: the value must be at most ``limit``; False: at least.
    A record without the field (a run made before the field existed, or a unit
    whose measurement failed) is not judged on it: `broken` says nothing.
    """

    name: str
    field: str
    limit: float
    most: bool
    doc: str

    def broken(self, fidelity: dict) -> str | None:
        """A one-line reason when ``fidelity`` breaks this invariant, else None."""
        value = fidelity.get(self.field)
        if value is None:
            return None
        if (value > self.limit) if self.most else (value < self.limit):
            rel = "above" if self.most else "below"
            return f"{self.name} {_pct(value)} {rel} {_pct(self.limit)}"
        return None


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


#: Every invariant a unit must keep, by name. The limits' reasons are in the
#: module docstring; the presets are sized so an idle machine of the project's
#: kind stays well inside them (docs/results/default.md, "CPU budget").
INVARIANTS: dict[str, Invariant] = {inv.name: inv for inv in (
    Invariant("cpu busy", "cpu_busy_frac", 0.85, most=True,
              doc="machine-wide CPU busy over the unit, steal included"),
    Invariant("cpu steal", "cpu_steal_frac", 0.05, most=True,
              doc="CPU time the hypervisor gave to other guests"),
    Invariant("other servers' cpu busy", "others_cpu_busy_frac", 0.85, most=True,
              doc="the busiest other server's CPU busy over the unit (a fabric across machines)"),
    Invariant("other servers' cpu steal", "others_cpu_steal_frac", 0.05, most=True,
              doc="the most CPU time any other server's hypervisor gave to other guests"),
    Invariant("link rate while busy", "link_busy_rate_frac", 0.90, most=False,
              doc="bytes the bottleneck sent while its queue held packets, over its shaped rate"),
    Invariant("packet spacing", "link_spacing_ok_frac", 0.90, most=False,
              doc="share of the bottleneck's back-to-back departures no more than one "
                  "packet time later than the line rate allows"),
    Invariant("pacing error", "pacing_late_frac", 0.10, most=True,
              doc="the transport's pacer lateness over its sending time, worst rank"),
)}


#: The invariants measured from the bottleneck's kernel trace (`testbed.run.queuetrace`).
TRACE_FIELDS = frozenset({"link_busy_rate_frac", "link_spacing_ok_frac"})


def unjudged(fidelity: dict) -> frozenset[str]:
    """The fields of ``fidelity`` that decide nothing: the trace's, when its buffer lost
    events and the record predates reading it only as far as it is whole (no
    ``trace_complete_s``). Counting past a loss sees a backlog that was not there, so a
    link that kept its rate read as one at a quarter of it; such a figure was measured
    on counts with holes, in either direction."""
    if fidelity.get("trace_lost_events") and "trace_complete_s" not in fidelity:
        return TRACE_FIELDS
    return frozenset()


def broken(fidelity: dict | None) -> list[str]:
    """Every invariant ``fidelity`` (a unit's manifest record) breaks, as one-line reasons."""
    if not fidelity:
        return []
    skip = unjudged(fidelity)
    return [r for inv in INVARIANTS.values()
            if inv.field not in skip and (r := inv.broken(fidelity)) is not None]
