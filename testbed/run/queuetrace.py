"""The bottleneck queue, packet by packet, from the kernel's own tracepoints.

Why a kernel trace: Mininet-HiFi judges a link by its dequeue events (while
the queue holds packets, they leave one transmission time apart). The
kernel records exactly those events for us: ``net:net_dev_queue`` (a packet
handed to the port, after the burst's nftables egress drop), ``qdisc:
qdisc_enqueue`` (the HTB root accepted it; absent for a tail drop) and
``net:net_dev_start_xmit`` (it left the shaper for the wire). A tracefs
instance of our own records the three, filtered to the one port, into a
kernel ring buffer for the whole unit; it is read once after the unit, so
watching costs no process and no CPU while the unit runs (the `tc -s qdisc`
sampler it replaces forked a process every 50 ms).

From the events: the queue's backlog at every packet, its drops, the
achieved rate while it was busy and the spacing of back-to-back departures
(the invariants in `testbed.invariants`), and the queue samples the analysis
plots (``queue`` events, one per `SAMPLE_S`, as the sampler wrote them).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess

TRACEFS = pathlib.Path("/sys/kernel/tracing")
#: Per-CPU ring buffer: three events per packet of ~50 bytes each; a unit of the
#: default preset passes ~200,000 packets through the port. Overwrite is off,
#: so a longer unit (the paper-regime preset's static arm: ~1.7 million
#: events) loses its newest events, says so (`overflow`) and is judged on the
#: span before the first loss (`complete_s`).
BUFFER_KB = 65536
#: Period of the derived queue samples (the plots' and the burst join's).
SAMPLE_S = 0.05
#: Fewer back-to-back departures than this judge nothing about the link.
MIN_BUSY_GAPS = 200

_LINE = re.compile(r"\[(\d+)\]\s.*?\s(\d+\.\d+): (net_dev_queue|qdisc_enqueue|net_dev_start_xmit): "
                   r"(.*)$")
_LEN = re.compile(r"\blen=(\d+)")


def available() -> bool:
    """Whether this kernel lets us trace (tracefs mounted, or mountable by root)."""
    return _mount() is not None


def _mount() -> pathlib.Path | None:
    if (TRACEFS / "instances").is_dir():
        return TRACEFS
    if os.geteuid() == 0 and TRACEFS.is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True,
                       check=False)
        if (TRACEFS / "instances").is_dir():
            return TRACEFS
    return None


@dataclasses.dataclass
class Departure:
    """One packet that left the queue: when (s, monotonic), its length (bytes),
    the packets it left behind, and the tail drops so far."""

    t: float
    length: int
    behind: int
    dropped: int = 0


class QueueTrace:
    """A tracefs instance recording one port's queue for the span of a unit.

    ``start()`` before the unit's processes run, ``stop()`` after; ``stop``
    returns the parsed `Departure`s and writes nothing. An instance of the same
    name left by a killed run is removed and made anew.
    """

    def __init__(self, intf: str, name: str):
        self.intf, self.name = intf, name
        self.root: pathlib.Path | None = None
        self.overflow = 0
        self.drops = 0
        self.enqueued = 0
        #: Seconds of the unit the parsed departures cover without a gap (all of it
        #: when nothing was lost; see `_parse`).
        self.complete_s: float | None = None

    def start(self) -> bool:
        base = _mount()
        if base is None:
            return False
        try:
            ifindex = int((pathlib.Path("/sys/class/net") / self.intf / "ifindex").read_text())
            root = base / "instances" / self.name
            if root.exists():
                _remove(root)
            root.mkdir()
            self.root = root
            _write(root / "tracing_on", "0")
            _write(root / "trace_clock", "mono")
            _write(root / "options" / "overwrite", "0")
            _write(root / "buffer_size_kb", str(BUFFER_KB))
            for event, flt in (("net/net_dev_queue", f'name == "{self.intf}"'),
                               ("qdisc/qdisc_enqueue", f"ifindex == {ifindex}"),
                               ("net/net_dev_start_xmit", f'name == "{self.intf}"')):
                _write(root / "events" / event / "filter", flt)
                _write(root / "events" / event / "enable", "1")
            _write(root / "tracing_on", "1")
        except OSError:
            self.close()
            return False
        return True

    def stop(self) -> list[Departure]:
        """End the trace and parse it; the instance is removed either way."""
        if self.root is None:
            return []
        try:
            _write(self.root / "tracing_on", "0")
            lost = _lost_per_cpu(self.root)
            self.overflow = sum(lost.values())
            cut = None
            if self.overflow:
                with open(self.root / "trace", errors="replace") as fh:
                    cut = _complete_until(fh, {cpu for cpu, n in lost.items() if n})
            with open(self.root / "trace", errors="replace") as fh:
                return self._parse(fh, cut)
        except OSError:
            return []
        finally:
            self.close()

    def close(self) -> None:
        if self.root is not None:
            _remove(self.root)
            self.root = None

    def _parse(self, lines, cut: float | None = None) -> list[Departure]:
        """Departures with the backlog behind each; counts drops and accepted packets.

        The queue is FIFO (one HTB class over a pfifo), so the k-th accepted
        packet is the k-th to leave: the backlog behind a departure is the
        accepted count minus the departed count at that moment. That count
        needs every event: ``cut`` (`_complete_until`) ends the parse where
        the first full per-CPU buffer began to lose them, so a long unit is
        judged on the span its trace holds whole, never on counts that lost
        an enqueue or a departure (a phantom backlog, a link idle for busy).
        """
        out: list[Departure] = []
        queued = accepted = departed = 0
        first = last = None
        for line in lines:
            m = _LINE.search(line)
            if not m:
                continue
            t, kind = float(m.group(2)), m.group(3)
            if cut is not None and t > cut:
                continue
            first = t if first is None else first
            last = t
            if kind == "net_dev_queue":
                queued += 1
            elif kind == "qdisc_enqueue":
                accepted += 1
            else:
                departed += 1
                ln = _LEN.search(m.group(4))
                out.append(Departure(t, int(ln.group(1)) if ln else 0, max(0, accepted - departed),
                                     max(0, queued - accepted)))
        self.enqueued, self.drops = accepted, max(0, queued - accepted)
        self.complete_s = round(last - first, 3) if first is not None else None
        return out


def link_invariants(deps: list[Departure], rate_bps: float) -> dict:
    """The bottleneck's rate while busy and its packet spacing, from its departures.

    A gap is back to back when the packet that left second was already waiting
    when the first left (the first left a backlog behind it): the link was busy
    for the whole gap, so the gap should be the second packet's transmission
    time. HTB may let a few packets go at once after idle (its burst), so
    shorter gaps are fine; a gap longer than its packet's time plus one
    full-size packet time is a stall (Mininet-HiFi's spacing check).
    Returns None values when fewer than MIN_BUSY_GAPS gaps were busy.
    """
    mtu_s = 1514 * 8 / rate_bps
    busy_s = busy_bits = 0.0
    gaps = ok = 0
    for prev, cur in zip(deps, deps[1:], strict=False):
        if prev.behind < 1:
            continue
        gap = cur.t - prev.t
        ideal = cur.length * 8 / rate_bps
        gaps += 1
        ok += gap <= ideal + mtu_s
        busy_s += gap
        busy_bits += cur.length * 8
    if gaps < MIN_BUSY_GAPS or busy_s <= 0:
        return {"link_busy_gaps": gaps, "link_busy_rate_frac": None, "link_spacing_ok_frac": None}
    return {"link_busy_gaps": gaps,
            "link_busy_rate_frac": round(busy_bits / busy_s / rate_bps, 4),
            "link_spacing_ok_frac": round(ok / gaps, 4)}


def queue_samples(deps: list[Departure], mono_to_ns: int, period_s: float = SAMPLE_S):
    """(t_ns, backlog packets, backlog bytes, drops so far) once per `period_s`, at departures.

    The plots' queue samples. The packets behind departure i are departures
    i+1 .. i+behind (FIFO), so their bytes are exact where the trace holds them.
    ``mono_to_ns``: add to a trace time in ns (monotonic clock) to get time.time_ns().
    """
    ends = [0]
    for d in deps:
        ends.append(ends[-1] + d.length)
    nxt = None
    for i, d in enumerate(deps):
        if nxt is None or d.t >= nxt:
            last = min(len(deps), i + 1 + d.behind)
            yield int(d.t * 1e9) + mono_to_ns, d.behind, ends[last] - ends[i + 1], d.dropped
            nxt = d.t + period_s


def _write(path: pathlib.Path, text: str) -> None:
    path.write_text(text)


def _lost_per_cpu(root: pathlib.Path) -> dict[int, int]:
    """CPU -> events the instance's buffer of that CPU lost (full buffer, overwrite off)."""
    lost: dict[int, int] = {}
    for stats in root.glob("per_cpu/cpu*/stats"):
        cpu = int(stats.parent.name.removeprefix("cpu"))
        for line in stats.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("overrun", "dropped events"):
                try:
                    lost[cpu] = lost.get(cpu, 0) + int(value.strip())
                except ValueError:
                    pass
    return lost


def _complete_until(lines, full_cpus: set[int]) -> float | None:
    """The last time up to which the trace holds every event: the earliest last event of
    the CPUs whose buffer filled (each lost its newest events, the others none)."""
    last: dict[int, float] = {}
    for line in lines:
        m = _LINE.search(line)
        if m and int(m.group(1)) in full_cpus:
            last[int(m.group(1))] = float(m.group(2))
    return min(last.values()) if last else None


def _remove(root: pathlib.Path) -> None:
    try:
        _write(root / "tracing_on", "0")
        for enable in root.glob("events/*/*/enable"):
            _write(enable, "0")
        root.rmdir()
    except OSError:
        pass
