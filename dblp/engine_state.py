"""The engine's state by role, one small object per role (as PyTorch's ``PowerSGDState`` groups its own).

Why: the engine's ``__init__`` used to set 52 fields side by side, and the rules
that change them (an estimate's update, a FINAL's backoff, the next-round
buffer's caps) sat in the engine's methods beside its I/O. Each object here
keeps one role's fields and those rules; `dblp.engine.Engine` composes them
(``peers``, ``finals``, ``early``, ``joining``) and does the I/O.
"""
from __future__ import annotations

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
    )

    def __init__(self, hello_timeout: float):
        self.handler: Callable[[wire.Header, bytes, Any, int | None], None] | None = None
        self.accept_handler: Callable[[], None] | None = None
        self.unbound: dict[TcpControl, float] = {}
        self.hello_timeout = hello_timeout
        self.current_conn: TcpControl | None = None
        self.on_bad_tag: Callable[[Any, int, Any, float], None] | None = None


class BadSources:
    """Sources that keep sending messages whose tags fail: dropped before verification.

    A MAC is the most expensive check a datagram meets, so a flood of forged
    datagrams would otherwise make the receiver spend its CPU verifying them.
    A source (address) with more than ``LIMIT`` failed tags within ``WINDOW``
    seconds is blocked for ``BLOCK`` seconds: its datagrams are counted as
    unauthenticated and dropped on its address alone. The address of a known
    peer (pinned at join) is never blocked, so forging a peer's address
    cannot cut that peer off; it only keeps costing verifications.
    """

    __slots__ = ("windows", "blocked", "keys")

    LIMIT = 64
    WINDOW = 1.0
    BLOCK = 5.0
    MAX_SOURCES = 4096  # sources tracked at once (a spoofing flood cannot grow it further)

    def __init__(self) -> None:
        self.windows: dict[tuple, list[float]] = {}  # addr -> [window start, failures]
        self.blocked: dict[tuple, float] = {}  # addr -> blocked until
        self.keys: bytes | None = None  # ``blocked`` as dblp.batch.blocked_keys packs them

    def failed(self, addr, now: float, peers: dict) -> None:
        """Count one failed tag from ``addr``; block it past the limit (unless it is a peer's)."""
        addr = (addr[0], addr[1])
        w = self.windows.get(addr)
        if w is None or now - w[0] > self.WINDOW:
            if w is None and len(self.windows) >= self.MAX_SOURCES:
                self.windows.clear()
            w = self.windows[addr] = [now, 0.0]
        w[1] += 1
        if w[1] > self.LIMIT and addr not in peers.values():
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

    def forgive(self, addr) -> None:
        """``addr`` proved itself (a rank joined from it): never blocked while it is a peer's."""
        if self.blocked.pop((addr[0], addr[1]), None) is not None:
            self.keys = None
        self.windows.pop((addr[0], addr[1]), None)
