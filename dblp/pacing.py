"""Token-bucket pacing and an RTT estimator: the transport's two clocks.

The bucket meters whole datagrams: a datagram leaves only when the bucket holds
its full wire size, so pacing never splits or truncates one. The estimator is
Jacobson/Karels (SRTT + 4*RTTVAR) fed with unambiguous samples (every PROBE
transmission carries a fresh id that the reply echoes), so probe timeouts follow
the measured RTT instead of the prototype's fixed seconds.
"""
from __future__ import annotations

import math
import time

WIRE_OVERHEAD = 42  # Ethernet 14 + IPv4 20 + UDP 8: what a shaper counts per datagram
FRAGMENT_OVERHEAD = 34  # Ethernet 14 + IPv4 20 again for every further IP fragment


class TokenBucket:
    """Pace at ``rate_bps`` bits/s of wire bytes; ``None`` means unpaced.

    ``largest``: the wire size of the largest datagram it must pass (an
    IP-fragmented data chunk with every fragment's headers); the bucket is at
    least that deep, else such a datagram would wait forever.

    ``step_s``: refill in whole steps of that many seconds instead of
    continuously, the bucket one step deep (the authors' prototype's 100 ms
    bucket, ``TransportConfig.bucket_s``): each step's tokens arrive at once,
    so the sender releases a step's worth of datagrams back to back instead
    of one every datagram's time. The mean rate is the same.
    """

    def __init__(self, rate_bps: float | None, depth_bytes: int | None = None,
                 overhead: int = WIRE_OVERHEAD, clock=time.monotonic, largest: int = 1514,
                 step_s: float | None = None):
        if step_s is not None and not step_s > 0:
            raise ValueError(f"step_s must be positive or None, got {step_s!r}")
        self.step = step_s
        if rate_bps is not None:
            rate_bps = float(rate_bps)
            if not rate_bps > 0:
                raise ValueError(f"rate_bps must be positive or None, got {rate_bps!r}")
        self.rate = None if rate_bps is None else rate_bps / 8.0  # bytes/s
        self.overhead = overhead
        if depth_bytes is None and step_s is not None and self.rate is not None:
            depth_bytes = max(largest, int(self.rate * step_s))
        if depth_bytes is None:
            depth_bytes = 16 * 1514 if self.rate is None else max(8 * 1514, int(self.rate * 0.002))
            depth_bytes = max(depth_bytes, largest)
        if depth_bytes < largest:
            raise ValueError(f"depth_bytes must hold one full datagram (>= {largest}), "
                             f"got {depth_bytes}")
        self.depth = float(depth_bytes)
        self.tokens = self.depth
        self.clock = clock
        self.last = clock()

    def _refill(self, now: float) -> None:
        if now <= self.last:  # a stale ``now`` must not move the clock back
            return
        if self.step is None:
            self.tokens = min(self.depth, self.tokens + (now - self.last) * self.rate)
            self.last = now
            return
        steps = math.floor((now - self.last) / self.step)
        if steps:
            self.tokens = min(self.depth, self.tokens + steps * self.step * self.rate)
            self.last += steps * self.step

    def _until(self, need: float, now: float) -> float:
        """Seconds from ``now`` until the bucket holds ``need`` bytes (after ``_refill(now)``)."""
        if self.tokens >= need:
            return 0.0
        rate = self.rate
        assert rate is not None, "an unpaced bucket never waits (callers return 0 first)"
        if self.step is None:
            return (need - self.tokens) / rate
        steps = math.ceil((need - self.tokens) / (self.step * rate))
        return max(0.0, self.last + steps * self.step - now)

    def wait_time(self, nbytes: int, now: float | None = None, count: int = 1) -> float:
        """Seconds until ``count`` datagrams of ``nbytes`` payload may leave back to back (0 = now)."""
        if self.rate is None:
            return 0.0
        now = self.clock() if now is None else now
        self._refill(now)
        return self._until(count * (nbytes + self.overhead), now)

    def allowance(self, nbytes: int, now: float | None = None) -> int:
        """How many datagrams of ``nbytes`` payload may leave back to back now (a batch).

        Exactly as many as ``wait_time`` would let go one after the other without
        a refill in between: a batch borrows nothing a datagram alone would not.
        """
        if self.rate is None:
            return 1 << 30
        now = self.clock() if now is None else now
        self._refill(now)
        return max(0, int(self.tokens // (nbytes + self.overhead)))

    def consume(self, nbytes: int, now: float | None = None, count: int = 1) -> None:
        """Account ``count`` datagrams of ``nbytes`` payload in all that left.

        Control messages may drive tokens negative.
        """
        if self.rate is None:
            return
        now = self.clock() if now is None else now
        self._refill(now)
        self.tokens -= nbytes + count * self.overhead


class RttEstimator:
    """SRTT/RTTVAR with RTO = SRTT + 4 RTTVAR clamped to [min_rto, max_rto]."""

    def __init__(self, initial_rto: float = 0.05, min_rto: float = 0.002, max_rto: float = 1.0):
        if not 0 < min_rto <= initial_rto <= max_rto:
            raise ValueError("need 0 < min_rto <= initial_rto <= max_rto "
                             f"(got {min_rto}, {initial_rto}, {max_rto})")
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rto, self.max_rto = min_rto, max_rto
        self._rto = initial_rto
        self.samples = 0

    def sample(self, rtt: float) -> None:
        if rtt < 0:
            return
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.samples += 1
        self._rto = min(self.max_rto, max(self.min_rto, self.srtt + 4 * self.rttvar))

    @property
    def rto(self) -> float:
        return self._rto


class PaceAudit:
    """How far behind its token bucket the sender's loop fell: the pacing error.

    Why: the bucket lets a late wake-up catch up by sending its saved tokens
    at once, up to the bucket's depth. A loop that wakes later than that
    (its CPU busy elsewhere) loses the overflow for good, and the sender runs
    below its configured rate: a round then measures the machine, not the
    network. ``late_s`` sums how much later than its bucket's depth allows
    the loop woke to send; ``busy_s`` the time it had data to send. The
    harness's fidelity check reads late over busy (``testbed.invariants``).
    """

    __slots__ = ("slack_s", "due", "last", "late_s", "busy_s")

    def __init__(self, bucket: TokenBucket):
        # Waking up to the bucket's depth late costs nothing: the tokens wait.
        self.slack_s = None if bucket.rate is None else bucket.depth / bucket.rate
        self.due: float | None = None
        self.last = 0.0
        self.late_s = 0.0
        self.busy_s = 0.0

    def woke(self, now: float) -> None:
        """The loop turned at ``now``; charge it if it had data to send and woke too late."""
        if self.due is None or self.slack_s is None:
            return
        self.busy_s += max(0.0, now - self.last)
        if now > self.due + self.slack_s:
            self.late_s += now - self.due - self.slack_s

    def planned(self, now: float, send_at: float) -> None:
        """The loop means to send again at ``send_at`` (inf: nothing to send)."""
        self.due = send_at if send_at < math.inf else None
        self.last = now

    def reset(self) -> None:
        self.due, self.late_s, self.busy_s = None, 0.0, 0.0
