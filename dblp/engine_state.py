"""The engine's state by role, one small object per role (as PyTorch's ``PowerSGDState`` groups its own).

Why: the engine's ``__init__`` used to set 52 fields side by side, and the rules
that change them (an estimate's update, a FINAL's backoff, the next-round
buffer's caps) sat in the engine's methods beside its I/O. Each object here
keeps one role's fields and those rules; `dblp.engine.Engine` composes them
(``peers``, ``finals``, ``early``, ``joining``) and does the I/O.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from . import wire
from .framing import TcpControl
from .pacing import RttEstimator
from .streams import copies_for_loss

#: (peer, part, round): the FINAL of one part of one round, to one peer.
FinalKey = tuple[int, int, int]


class PeerState:
    """What this participant knows of each peer: address, TCP control, RTT and loss estimates."""

    __slots__ = (
        # where each rank is: its address (pinned at join) and its TCP control connection
        "addrs", "tcp",
        # ranks whose TCP control connection closed (an error only if a round still needs them)
        "closed",
        # estimates per rank: RTT (made on first use with ``rtt_args``) and loss fraction
        "rtts", "loss", "rtt_args",
        # control tunables: most copies of a control message, least time between STOP repeats
        "max_copies", "stop_repeat_s",
    )

    def __init__(self, *, initial_rto: float, min_rto: float, max_rto: float, max_copies: int,
                 stop_repeat_s: float):
        self.addrs: dict[int, tuple[str, int]] = {}
        self.tcp: dict[int, TcpControl] = {}
        self.closed: set[int] = set()
        self.rtts: dict[int, RttEstimator] = {}
        self.loss: dict[int, float] = {}
        self.rtt_args = (initial_rto, min_rto, max_rto)
        self.max_copies = max_copies
        self.stop_repeat_s = stop_repeat_s

    def rtt(self, peer: int) -> RttEstimator:
        est = self.rtts.get(peer)
        if est is None:
            est = self.rtts[peer] = RttEstimator(*self.rtt_args)
        return est

    def rtt_sample(self, peer: int, rtt: float) -> None:
        self.rtt(peer).sample(rtt)

    def loss_sample(self, peer: int, frac: float) -> None:
        old = self.loss.get(peer)
        # Fast up (a burst must not cost probe timeouts); down within a few samples (one
        # per stream and round), so a burst's redundancy does not outlive it for long.
        self.loss[peer] = frac if old is None or frac > old else 0.25 * old + 0.75 * frac

    def loss_timeout(self, peer: int) -> None:
        self.loss[peer] = min(0.95, self.loss.get(peer, 0.0) + 0.25)

    def undo_loss_timeouts(self, peer: int, before: float) -> None:
        """Probe timeouts that were late answers: the estimate goes back to ``before`` them."""
        if self.loss.get(peer, 0.0) > before:
            self.loss[peer] = before

    def stop_repeat_interval(self, peer: int) -> float:
        """Least time between two repeats of a STOP: one smoothed RTT (or the RTO)."""
        est = self.rtt(peer)
        return max(self.stop_repeat_s, est.srtt if est.srtt is not None else est.rto)

    def copies(self, peer: int) -> int:
        """Copies of a control message over UDP, from the loss estimate of ``peer``."""
        return copies_for_loss(self.loss.get(peer, 0.0), self.max_copies)


class FinalRetry:
    """One FINAL being retransmitted until its DONE: the message and its timer."""

    __slots__ = (
        "body",     # the message; its ``index`` field carries ``id``
        "due",      # when it is sent again unless acknowledged
        "backoff",  # factor on the RTO (1.0 until the first retransmission)
        "sent_at",  # first transmission (an RTT sample when acknowledged before any retry)
        "id",       # transmission id: acknowledged once per transmission, not per copy
    )

    def __init__(self, body: bytearray, due: float, sent_at: float):
        self.body = body
        self.due = due
        self.backoff = 1.0
        self.sent_at = sent_at
        self.id = 1


class FinalRetries:
    """FINAL retransmission (aggregator) and acknowledgement (member) bookkeeping."""

    __slots__ = (
        # FINALs sent and not yet acknowledged, by (peer, part, round)
        "pending",
        # stale FINALs this member answered: the last transmission id answered
        "acked",
    )

    #: ``acked`` is bounded: past this many entries the oldest rounds are forgotten.
    ACKED_MAX = 4096
    ACKED_FORGET = 3072

    def __init__(self) -> None:
        self.pending: dict[FinalKey, FinalRetry] = {}
        self.acked: dict[FinalKey, int] = {}

    def implicit_ack(self, src: int, round: int) -> None:
        """Any message of a later round from a peer proves it got our FINALs."""
        for key in [k for k in self.pending if k[0] == src and k[2] < round]:
            del self.pending[key]

    def forget_peer(self, peer: int) -> None:
        for key in [k for k in self.pending if k[0] == peer]:
            del self.pending[key]

    def answer_once(self, key: FinalKey, index: int) -> bool:
        """Whether a stale FINAL transmission ``index`` needs a DONE (once per id, not per copy)."""
        if index and index <= self.acked.get(key, 0):
            return False
        self.acked[key] = index
        if len(self.acked) > self.ACKED_MAX:  # bounded: forget the oldest rounds
            for k in sorted(self.acked, key=lambda k: k[2])[:self.ACKED_FORGET]:
                del self.acked[k]
        return True


#: A message of the next round: its bytes, the address it came from, the TCP peer it came on.
EarlyMessage = tuple[bytes, "tuple[str, int] | None", "int | None"]


class EarlyBuffer:
    """Messages of the next round, kept until it starts; capped in entries and in bytes."""

    __slots__ = ("items", "cap", "max_bytes", "size")

    def __init__(self, cap: int, max_bytes: int):
        self.items: list[EarlyMessage] = []
        self.cap = cap              # most messages kept
        self.max_bytes = max_bytes  # most bytes kept
        self.size = 0               # bytes kept now

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[EarlyMessage]:
        return iter(self.items)

    def keep(self, buf, n: int, addr, tcp_peer: int | None) -> bool:
        """Keep a copy of the message ``buf[:n]`` if both caps allow it; False if it is dropped."""
        if len(self.items) >= self.cap or self.size + n > self.max_bytes:
            return False
        self.items.append((bytes(buf[:n]), addr, tcp_peer))
        self.size += n
        return True

    def take(self) -> list[EarlyMessage]:
        """Every message kept, in arrival order; the buffer is empty after."""
        items, self.items = self.items, []
        self.size = 0
        return items


class Joining:
    """Joining: handlers the rendezvous installs, TCP connections not yet bound to a rank."""

    __slots__ = (
        # f(header, payload, addr, tcp peer) for HELLO/WELCOME; f() when the listener is ready
        "handler", "accept_handler",
        # conn -> when it is closed unless a valid HELLO binds it to a rank
        "unbound", "hello_timeout",
        # the unbound TCP connection whose frame is being handled
        "current_conn",
        # f(buf, n, addr, now) for a message whose tag failed (wrong-secret diagnosis)
        "on_bad_tag",
        # f(type, src, session): whether a join message is worth verifying at all
        "admit",
    )

    def __init__(self, hello_timeout: float):
        self.handler: Callable[[wire.Header, bytes, Any, int | None], None] | None = None
        self.accept_handler: Callable[[], None] | None = None
        self.unbound: dict[TcpControl, float] = {}
        self.hello_timeout = hello_timeout
        self.current_conn: TcpControl | None = None
        self.on_bad_tag: Callable[[Any, int, Any, float], None] | None = None
        #: Which join messages (by type, claimed sender and session, read before the MAC)
        #: the installed handler could take: anything else is dropped unverified.
        self.admit: Callable[[int, int, int], bool] | None = None


class BadSources:
    """Failed tags: a global budget for the work spent on them, and blocks only under a flood.

    WireGuard's and QUIC's rule: an unauthenticated datagram is dropped
    silently and never acted on. A failed tag proves nothing about the source
    address it arrived from (anyone can forge that address), so a handful of
    them must never cut off the address of a rank that is about to join
    (a sniffer that spoofed 65 bad tags from a joining member's address used
    to lock it out of its job).

    * The work a failed tag may cause beyond its verification (a refusal, a
      log line, the join's diagnosis) is bounded for all sources together by
      a token bucket of ``RATE`` failed tags a second (burst ``BURST``):
      `failed` says whether this one may have it.
    * Only while that bucket is empty, i.e. under a flood of more failed tags a
      second than any number of misconfigured members sends, does a source
      that sends more than ``LIMIT`` of them within ``WINDOW`` seconds get
      blocked for ``BLOCK`` seconds (its later datagrams are dropped on their
      address alone, by the socket's kernel filter where there is one), so a
      single flooding source stops costing verifications. A pinned peer's
      address and a candidate's (an address a HELLO with a valid tag came
      from: `trust`) are never blocked.
    * Blocks expire on a timer (`expire`, which the engine's poll consults),
      never only inside a socket read that the filter itself would prevent;
      the tables are bounded (``MAX_SOURCES``, ``MAX_BLOCKED``, ``MAX_TRUSTED``).
    """

    __slots__ = ("tokens", "stamp", "windows", "blocked", "keys", "trusted")

    RATE = 10_000.0  # failed tags a second acted on, all sources together
    BURST = 10_000.0
    LIMIT = 64
    WINDOW = 1.0
    BLOCK = 5.0
    MAX_SOURCES = 4096  # sources counted at once (a spoofing flood cannot grow it further)
    MAX_BLOCKED = 256  # sources blocked at once (the kernel filter lists each one)
    MAX_TRUSTED = 4096  # candidate addresses kept (least recently proved forgotten first)

    def __init__(self) -> None:
        self.tokens = self.BURST
        self.stamp: float | None = None
        self.windows: dict[tuple, list[float]] = {}  # addr -> [window start, failures]
        self.blocked: dict[tuple, float] = {}  # addr -> blocked until
        self.keys: bytes | None = None  # ``blocked`` as dblp.batch.blocked_keys packs them
        self.trusted: dict[tuple, None] = {}  # addresses a valid HELLO came from, oldest first

    def failed(self, addr, now: float, peers: dict) -> bool:
        """Count one failed tag from ``addr`` (None: a TCP frame); True if the budget allows
        acting on it (a refusal, a diagnosis), False under a flood, where a source past the
        limit may be blocked (never a peer's or a candidate's address)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        if addr is not None:
            self._count((addr[0], addr[1]), 1, now, peers)
        return False

    def unverified(self, total: int, heavy, now: float, peers: dict) -> None:
        """``total`` datagrams dropped before any MAC (another session, or not from a
        member's pinned address); ``heavy``: (address, count) of the sources that sent the
        most of them. They draw on the same budget as failed tags, and once it is spent (a
        flood) a heavy source past the limit is blocked, so the socket's kernel filter
        drops the rest of it; a flood that rotates its sources is dropped by header and
        address, each source too light to block."""
        self._refill(now)
        take = min(self.tokens, float(total))
        self.tokens -= take
        if take < total:
            for addr, n in heavy:
                self._count((addr[0], addr[1]), n, now, peers)

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            self.tokens = min(self.BURST, self.tokens + (now - self.stamp) * self.RATE)
        self.stamp = now

    def _count(self, addr: tuple, n: int, now: float, peers: dict) -> None:
        """``n`` more unproven datagrams from ``addr`` under a flood: blocked past the limit."""
        w = self.windows.get(addr)
        if w is None or now - w[0] > self.WINDOW:
            if w is None and len(self.windows) >= self.MAX_SOURCES:
                self.windows.clear()
            w = self.windows[addr] = [now, 0.0]
        w[1] += n
        if w[1] > self.LIMIT and len(self.blocked) < self.MAX_BLOCKED \
                and addr not in self.trusted and addr not in peers.values():
            self.blocked[addr] = now + self.BLOCK
            del self.windows[addr]
            self.keys = None

    def is_blocked(self, addr, now: float) -> bool:
        until = self.blocked.get((addr[0], addr[1]))
        if until is None:
            return False
        if now < until:
            return True
        del self.blocked[(addr[0], addr[1])]
        self.keys = None
        return False

    def expire(self, now: float) -> float:
        """Lift the blocks that are over; when the next one is (inf: none left)."""
        for addr, until in list(self.blocked.items()):
            if now >= until:
                del self.blocked[addr]
                self.keys = None
        return min(self.blocked.values(), default=math.inf)

    def trust(self, addr) -> None:
        """A HELLO with a valid tag came from ``addr``: a candidate address of a rank, never
        blocked (a replay from a forged address can make one too, which costs only
        verifications; the table keeps the most recent ``MAX_TRUSTED``)."""
        addr = (addr[0], addr[1])
        self.trusted.pop(addr, None)
        self.trusted[addr] = None
        if len(self.trusted) > self.MAX_TRUSTED:
            del self.trusted[next(iter(self.trusted))]
        self.forgive(addr)

    def forgive(self, addr) -> None:
        """``addr`` proved itself (a rank joined from it): never blocked while it is a peer's."""
        if self.blocked.pop((addr[0], addr[1]), None) is not None:
            self.keys = None
        self.windows.pop((addr[0], addr[1]), None)
