"""The I/O engine: one UDP socket (+ optional TCP control), pacing, timers, dispatch.

Everything a participant does in a round is a set of streams in one engine
(``dblp.streams``: ``OutTransfer`` sends, ``InTransfer`` receives). The engine
runs single-threaded and non-blocking: ``run_until`` interleaves receiving,
pacing and timers until a condition holds or the round deadline passes, which
raises ``PeerTimeout`` naming what was still missing.

Control budget: a loss-free round costs about four control datagrams per stream
(PROBE, STOP, its answer to the probe, FINAL or DONE). Redundancy (``copies``)
follows a per-peer loss estimate that every BITMAP *and* STOP updates (fast up,
down within a few rounds); each probe id and each FINAL transmission is answered
once, whatever number of copies arrives; a STOP is repeated at most once per RTT.

Data path: with ``batched_io`` (``dblp.batch``) a stream's turn sends its chunks
in UDP GSO batches sized by the pacing rate, and reads drain ``recvmmsg`` rings
(coalesced by UDP receive offload where the link does it, cut back into
datagrams) whose runs of DATA are handled as arrays; the datagrams, the pacing guarantee
and every outcome of ``handle`` are those of the one-datagram-per-call path,
which stays for ``batched_io=False``, for fragmented chunks and where GSO is
refused.

Hostile input: with a job secret every message must carry a valid MAC
(``wire.Sealer``), checked before anything is parsed but the session and the
claimed sender and its pinned address (a message that could not be this job's
costs no MAC and no key: ``worth_verifying``), once per message; a failed tag is never acted on
beyond a global budget (``BadSources``), and no address is blocked for a few
of them (they prove nothing about their source); without one, a message
claiming a rank must come from that rank's address, pinned at join. Anything
that does not belong to the current round of this session is counted and
dropped (``Counters``); messages of the next round are kept in a buffer capped
in bytes and replayed when that round starts; reply redundancy is clamped to
what our own loss estimate justifies (a request cannot amplify); a TCP control
connection that does not bind itself with a valid HELLO within
``hello_timeout`` is closed. No datagram and no TCP byte sequence raises out
of ``handle``.
"""
from __future__ import annotations

import functools
import math
import selectors
import socket
import struct
import sys
import time

import numpy as np

from . import batch, sockfilter, wire
from .config import CONTROLS, check_setting, default_of
from .engine_state import BadSources, EarlyBuffer, FinalRetries, FinalRetry, Joining, PeerState
from .errors import PeerClosed, PeerTimeout
from .framing import TcpControl
from .pacing import FRAGMENT_OVERHEAD, WIRE_OVERHEAD, PaceAudit, TokenBucket
from .stats import Counters
from .streams import (
    DONE,
    PROBING,
    PULL,
    PUSH,
    SENDING,
    InTransfer,
    OutTransfer,
    copies_for_loss,
    pack_bitmap,
    stream_order,
    unpack_bitmap,
)
from .wire import HEADER_SIZE, Flag, MsgType

# The stream machinery is re-exported: callers see one engine API.
__all__ = ["Engine", "TcpControl", "InTransfer", "OutTransfer", "PUSH", "PULL", "SENDING",
           "PROBING", "DONE", "copies_for_loss", "pack_bitmap", "unpack_bitmap", "stream_order"]

_DATA = int(MsgType.DATA)
_TYPE_OFF = wire.FIELD_OFFSETS["type"][0]
_SRC_OFF = wire.FIELD_OFFSETS["src"][0]
_SESSION_OFF = wire.FIELD_OFFSETS["session"][0]
_INDEX = struct.Struct("!I")
_INDEX_OFF = wire.FIELD_OFFSETS["index"][0]
#: A stock Linux kernel's default socket buffer (net.core.wmem_default, rmem_default): the
#: size of the prototype's buffers (``bucket_s``; ``Engine._stock_buffers``).
STOCK_SOCKET_BUFFER = 212992
# Linux's <netinet/in.h>: Python's socket module does not export them.
_IP_MTU_DISCOVER = 10
_IP_PMTUDISC_DONT = 0  # never set Don't Fragment: the kernel fragments large datagrams


class Engine:
    """One participant's sockets, pacing, RTT state and the streams of its round.

    State is grouped by role (as in PyTorch's ``PowerSGDState``): the fields
    below by comment, and the roles with rules of their own in small objects
    (`dblp.engine_state`: ``peers``, ``finals``, ``early``, ``joining``);
    ``__slots__`` keeps a typo from silently creating a new field.
    """

    __slots__ = (
        # identity of this participant in its job, and the MAC that proves it
        "rank", "session", "control", "sealer",
        # chunking: payload bytes of a data chunk, its datagram, the order of a pass
        "chunk_bytes", "max_datagram", "chunk_order",
        # control timing: the prototype's fixed probe timer (None = adaptive), Nagle on TCP
        "probe_wait", "nagle",
        # the prototype's sender (its bucket's step, None = ours) and no-progress rule (0 = off)
        "bucket_s", "no_progress_probes",
        # sockets and the receive buffer
        "sock", "sel", "buf", "mv",
        # pacing: one bucket for the link, optional buckets per destination
        "bucket", "peer_rate_bps", "peer_buckets",
        # how far behind its bucket the sending loop fell this round (fidelity)
        "pace",
        # batched I/O (``dblp.batch``): datagrams per send (1 = one call per datagram),
        # the send buffer, the recvmmsg ring (None = one recvfrom per datagram)
        "batch_max", "send_buf", "ring",
        # datagrams the last poll read from the ring, and how long arrivals may
        # gather before the next read (receive coalescing in ``run_until``)
        "last_read", "coalesce_s",
        # what we know of each peer: address, TCP control, RTT and loss estimates (PeerState)
        "peers",
        # the current round: its streams and the round-robin sending order
        "round", "seen_round", "senders", "receivers", "prev_receivers", "active", "_rr",
        "progress",
        # FINAL retransmission (aggregator) and acknowledgement (member) bookkeeping (FinalRetries)
        "finals",
        # messages of the next round, kept until it starts (EarlyBuffer)
        "early",
        # joining: the rendezvous' handlers, TCP conns not yet bound to a rank (Joining)
        "joining",
        # sources whose tags keep failing, dropped before verification (BadSources), and
        # the ones the socket's kernel filter drops before they are queued (dblp.sockfilter)
        "bad", "kernel_blocked", "kernel_allow",
        # accounting: anomalies, bytes and datagrams sent
        "counters", "bytes_sent", "datagrams",
        # fault injection for tests without root: drop this fraction of received datagrams
        "fault_rx_drop", "_fault_rng",
    )

    def __init__(self, rank: int, *, bind: tuple[str, int] = ("0.0.0.0", 0), session: int = 0,
                 control: str = "udp", rate_bps: float | None = None,
                 peer_rate_bps: float | None = None, sock_buf: int = 8 << 20,
                 max_copies: int = 16, initial_rto: float = 0.02, min_rto: float = 0.002,
                 max_rto: float = 1.0, stop_repeat_s: float = 0.0005, early_cap: int = 65536,
                 early_bytes: int = default_of("early_bytes"), key: bytes | None = None,
                 stream: int = default_of("stream"),
                 hello_timeout: float = default_of("hello_timeout"),
                 chunk_bytes: int = default_of("chunk_bytes"),
                 chunk_order: str = default_of("chunk_order"),
                 probe_wait: float | None = default_of("probe_wait"),
                 nagle: bool = default_of("nagle"),
                 bucket_s: float | None = default_of("bucket_s"),
                 no_progress_probes: int = default_of("no_progress_probes"),
                 batched_io: bool = default_of("batched_io"),
                 fault_rx_drop: float = 0.0, fault_seed: int | None = None):
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {', '.join(map(repr, CONTROLS))}, "
                             f"got {control!r}")
        # The ranges are TransportConfig's (one home); an Engine built directly checks them too.
        for name, value in (("chunk_bytes", chunk_bytes), ("chunk_order", chunk_order),
                            ("probe_wait", probe_wait), ("nagle", nagle),
                            ("bucket_s", bucket_s), ("no_progress_probes", no_progress_probes),
                            ("batched_io", batched_io)):
            check_setting(name, value)
        if not 0.0 <= fault_rx_drop < 1.0:
            raise ValueError(f"fault_rx_drop must be in [0, 1), got {fault_rx_drop!r}")
        # Optional cap per destination (sharded mode): when the transfers to
        # the other peers finish, the last one must not take the whole rate,
        # or N-1 senders together offer N-1 times the line rate to one
        # downlink. One bucket per peer, made on first use.
        if peer_rate_bps is not None and not peer_rate_bps > 0:
            raise ValueError(f"peer_rate_bps must be positive or None, got {peer_rate_bps!r}")
        # identity
        self.rank = rank
        self.session = session
        self.control = control
        self.sealer = wire.Sealer(key, stream)
        # chunking and control timing
        self.chunk_bytes = chunk_bytes
        self.max_datagram = wire.datagram_size(chunk_bytes)
        self.chunk_order = chunk_order
        self.probe_wait = None if probe_wait is None else float(probe_wait)
        self.nagle = nagle
        self.bucket_s = None if bucket_s is None else float(bucket_s)
        self.no_progress_probes = no_progress_probes
        # sockets
        batched = batched_io and batch.batching_supported()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if self.bucket_s is not None:
            self._stock_buffers()
        else:
            rcv_buf = max(sock_buf, batch.RECV_BUFFER) if batched else sock_buf
            for opt, force, size in ((socket.SO_RCVBUF, 33, rcv_buf),
                                     (socket.SO_SNDBUF, 32, sock_buf)):
                try:
                    self.sock.setsockopt(socket.SOL_SOCKET, force, size)  # *BUFFORCE (root)
                except OSError:
                    self.sock.setsockopt(socket.SOL_SOCKET, opt, size)
        if self.max_datagram > wire.MAX_DATAGRAM:
            self._allow_fragmentation()
        self.sock.bind(bind)
        self.sock.setblocking(False)
        self.kernel_blocked = b""  # the sources the socket's filter drops (dblp.sockfilter)
        self.kernel_allow: tuple[int, bytes] | None = None  # what it lets a keyed job hear
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self.buf = bytearray(65536)
        self.mv = memoryview(self.buf)
        # pacing
        self.bucket = TokenBucket(rate_bps, largest=self.wire_size(self.max_datagram),
                                  step_s=self.bucket_s)
        self.pace = PaceAudit(self.bucket)  # the pacing error of the round (fidelity)
        self.peer_rate_bps = peer_rate_bps
        self.peer_buckets: dict[int, TokenBucket] = {}
        # batched I/O
        # Several GSO messages per call where the C core sends (with a secret, only
        # where it also makes the tags); one per call where Python fills the rows.
        messages = batch.GSO_MESSAGES if batch.NATIVE is not None and (
            key is None or batch.native_auth()) else 1
        self.batch_max = batch.batch_limit(rate_bps, self.max_datagram,
                                           self.wire_size(self.max_datagram),
                                           messages) if batched and bucket_s is None else 1
        self.send_buf = batch.SendBatch(self.batch_max, chunk_bytes) if self.batch_max > 1 else None
        self.ring = batch.RecvRing(self.sock, largest=wire.largest_datagram(chunk_bytes)) \
            if batched else None
        self.last_read = 0
        self.coalesce_s = batch.coalesce_seconds(rate_bps, self.batch_max,
                                                 self.wire_size(self.max_datagram))
        # peers
        self.peers = PeerState(initial_rto=initial_rto, min_rto=min_rto, max_rto=max_rto,
                               max_copies=max_copies, stop_repeat_s=stop_repeat_s)
        # the current round
        self.round = -1
        self.seen_round = False
        self.senders: dict[tuple[int, int, int], OutTransfer] = {}
        self.receivers: dict[tuple[int, int, int], InTransfer] = {}
        self.prev_receivers: dict[tuple[int, int, int], InTransfer] = {}
        self.active: list[OutTransfer] = []
        self._rr = 0
        self.progress = False
        self.finals = FinalRetries()
        self.early = EarlyBuffer(early_cap, early_bytes)
        self.joining = Joining(hello_timeout)
        self.bad = BadSources()
        # accounting; datagrams (or TCP frames) by kind: control must stay a small fraction
        self.counters = Counters()
        self.bytes_sent = 0
        self.datagrams = {"data": 0, "control": 0}
        # fault injection
        self.fault_rx_drop = fault_rx_drop
        self._fault_rng = np.random.default_rng(fault_seed)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    def _allow_fragmentation(self) -> None:
        """Data chunks larger than one MTU: let the kernel IP-fragment them.

        Linux's default for UDP (path-MTU discovery, IP_PMTUDISC_WANT) sends a
        datagram that fits the path MTU it knows with Don't Fragment set, so a
        smaller link further on drops it instead of fragmenting it.
        IP_PMTUDISC_DONT never sets DF and fragments to the interface MTU:
        every 8 KB chunk leaves as ~6 fragments, as the prototype's did, and
        pays their cost (any lost fragment loses the chunk).
        """
        if sys.platform.startswith("linux"):
            self.sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DONT)

    def _stock_buffers(self) -> None:
        """The prototype's socket: send and receive buffers of a stock kernel's default size.

        Set explicitly instead of left alone because the default is the
        machine's (``net.core.wmem_default``/``rmem_default``: 212992 bytes on
        a stock Linux, 4 MiB on machines tuned for bulk traffic, such as the
        one the references ran on), and the cost must not move with it. The
        kernel doubles what is asked, for its bookkeeping, so half is asked.
        """
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, STOCK_SOCKET_BUFFER // 2)

    @staticmethod
    @functools.cache
    def wire_size(datagram: int) -> int:
        """Bytes a datagram of ``datagram`` UDP payload bytes takes on the wire, fragments included.

        The shaper counts every fragment's Ethernet and IP header: pacing an
        8 KB chunk as one datagram would overrun the rate by ~2 %.
        """
        return datagram + WIRE_OVERHEAD + (wire.fragments(datagram) - 1) * FRAGMENT_OVERHEAD

    # -- per-peer estimates (``self.peers``), as the control path uses them ---------------
    def rto(self, peer: int) -> float:
        if self.control == "tcp" and peer in self.peers.tcp:
            return math.inf  # TCP retransmits control itself (the paper's design)
        return self.peers.rtt(peer).rto

    def probe_timeout(self, peer: int, backoff: float) -> float:
        """Seconds a sent PROBE waits for an answer before it is resent.

        TCP control: never (inf): TCP retransmits a lost segment itself, and a
        resent probe would only queue behind the first. UDP control with a
        fixed ``probe_wait`` (the prototype's timer): exactly that, no backoff
        and no RTO below it. Otherwise the adaptive RTO times ``backoff``.
        """
        rto = self.rto(peer)
        if rto == math.inf:
            return math.inf
        return self.probe_wait if self.probe_wait is not None else rto * backoff

    def reprobe_wait(self, peer: int) -> float:
        """Seconds a sender waits before it probes again instead of resending (no progress).

        The prototype's fixed probe wait where set, else one RTO: a probe round
        as long as one whose answer is awaited, on either control path (TCP
        control has no probe timer of its own, so the RTT estimate's RTO).
        """
        return self.probe_wait if self.probe_wait is not None else self.peers.rtt(peer).rto

    def copies(self, peer: int) -> int:
        if self.control == "tcp" and peer in self.peers.tcp:
            return 1
        return self.peers.copies(peer)

    def reply_copies(self, peer: int, requested: int) -> int:
        """Copies of a reply: what the peer asked for, clamped to what our estimate justifies.

        The reply takes the path our own data to that peer takes, so our estimate
        covers it; a request for more cannot turn one datagram into many.
        """
        return max(1, min(requested, self.copies(peer)))

    # -- output ---------------------------------------------------------------------
    def send_data(self, hdr: bytes, payload, peer: int) -> int:
        """Send one DATA datagram; its bytes, or 0 if the send buffer is full (retry later).

        With ``bucket_s`` (the prototype's sender) a full send buffer drops the
        datagram instead: it counts as sent, and only the next BITMAP shows it
        missing (``counters.sender_dropped``).
        """
        hdr = self.sealer.stamp(hdr)  # its own message number (the MAC's nonce)
        tag = self.sealer.tag(peer, hdr, payload)
        try:
            n = self.sock.sendmsg([hdr, payload, tag], [], 0, self.peers.addrs[peer])
        except (BlockingIOError, InterruptedError):
            if self.bucket_s is None:
                return 0
            n = len(hdr) + len(payload) + len(tag)
            self.counters.sender_dropped += 1  # never left: not in bytes_sent nor datagrams
        except OSError:
            # e.g. ECONNREFUSED from an earlier ICMP: count as lost
            n = len(hdr) + len(payload) + len(tag)
            self.datagrams["data"] += 1
            self.bytes_sent += n
        else:
            self.datagrams["data"] += 1
            self.bytes_sent += n
        paced = self.wire_size(n) - WIRE_OVERHEAD  # the buckets add one datagram's overhead
        self.bucket.consume(paced)
        if self.peer_rate_bps is not None:
            self.peer_bucket(peer).consume(paced)
        return n

    def send_data_batch(self, template: bytes, chunks: np.ndarray, rows: np.ndarray,
                        peer: int) -> int:
        """Send full ``chunks`` (rows of ``rows``) under ``template`` in one GSO call.

        Returns datagrams sent, the first of ``chunks``: fewer when the socket
        buffer filled after some GSO messages, 0 when it was full, or when the
        kernel refuses GSO here, which turns batched sending off for good (the
        caller retries one datagram per call). Any other error counts the batch
        as lost, as ``send_data`` counts one datagram.
        """
        assert self.send_buf is not None
        k, size = len(chunks), self.max_datagram
        try:
            k = self.send_buf.send(self.sock, template, chunks, rows, self.sealer,
                                   self.peers.addrs[peer], peer)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            if exc.errno in batch.GSO_REFUSED:
                self.batch_max, self.send_buf = 1, None
                return 0
        self.datagrams["data"] += k
        self.bytes_sent += k * size
        paced = k * (self.wire_size(size) - WIRE_OVERHEAD)
        self.bucket.consume(paced, count=k)
        if self.peer_rate_bps is not None:
            self.peer_bucket(peer).consume(paced, count=k)
        return k

    def peer_bucket(self, peer: int) -> TokenBucket:
        b = self.peer_buckets.get(peer)
        if b is None:
            b = self.peer_buckets[peer] = TokenBucket(self.peer_rate_bps,
                                                      largest=self.wire_size(self.max_datagram))
        return b

    def send_ctrl(self, peer: int, body: bytes, copies: int = 1) -> None:
        """Send a control message (header + payload; sealed here) ``copies`` times."""
        msg = self.sealer.seal(body, peer)
        conn = self.peers.tcp.get(peer) if self.control == "tcp" else None
        if conn is not None:
            conn.send(msg)
            self.bytes_sent += len(msg) + 2
            self.datagrams["control"] += 1
            return
        addr = self.peers.addrs.get(peer)
        if addr is None:
            return
        for _ in range(max(1, copies)):
            try:
                self.sock.sendto(msg, addr)
            except OSError:
                pass
            self.bytes_sent += len(msg)
            self.datagrams["control"] += 1
            self.bucket.consume(len(msg))
            if self.peer_rate_bps is not None:
                self.peer_bucket(peer).consume(len(msg))

    def send_raw(self, body: bytes, addr, dst: int) -> None:
        """Send one message (header + payload; sealed here for rank ``dst``) to an address
        that is not (yet) that rank's pinned one."""
        try:
            self.sock.sendto(self.sealer.seal(body, dst), addr)
        except OSError:
            pass

    # -- round bookkeeping ------------------------------------------------------------
    def begin_round(self, round: int) -> None:
        """Make ``round`` current: keep the previous receivers to answer late probes."""
        self.prev_receivers = self.receivers
        self.round = round
        self.seen_round = False
        self.senders = {}
        self.receivers = {}
        self.active = []
        self.pace.reset()

    def add_sender(self, s: OutTransfer) -> None:
        self.senders[(s.kind, s.part, s.peer)] = s
        if s.state == SENDING:
            self.active.append(s)

    def add_receiver(self, r: InTransfer) -> None:
        self.receivers[(r.kind, r.part, r.peer)] = r

    def replay_early(self) -> None:
        """Feed messages that arrived for this round before it started."""
        now = time.monotonic()
        for data, addr, tcp_peer in self.early.take():
            self.handle(memoryview(data), len(data), addr, tcp_peer, now)

    def sender_active(self, s: OutTransfer) -> None:
        if s not in self.active:
            self.active.append(s)

    def sender_done(self, s: OutTransfer) -> None:
        self.progress = True

    def add_final(self, peer: int, part: int, msg: bytes, copies: int) -> None:
        """Send FINAL and keep retransmitting it (each time with a fresh id) until DONE.

        The id travels in ``index``: the member acknowledges each transmission once,
        not each copy of it (copies x copies DONEs otherwise).
        """
        now = time.monotonic()
        body = bytearray(msg)
        _INDEX.pack_into(body, _INDEX_OFF, 1)
        self.send_ctrl(peer, bytes(body), copies)
        self.finals.pending[(peer, part, self.round)] = FinalRetry(body, now + self.rto(peer), now)

    # -- input ------------------------------------------------------------------------
    def handle(self, buf, n: int, addr, tcp_peer: int | None, now: float) -> None:
        """Dispatch one datagram/frame. Never raises on bad input: counts it.

        Order matters: the MAC is checked before a single field is believed, and
        only then the header is parsed and the sender's identity checked.
        """
        if addr is not None and self.bad.blocked and self.bad.is_blocked(addr, now):
            self.counters.unauthenticated += 1  # a source of bad tags: not even verified
            return
        if self.sealer.key is not None and n >= HEADER_SIZE and not self.worth_verifying(buf, addr):
            self.counters.foreign += 1  # another session, or no member: no MAC, no key
            self.bad.unverified(1, () if addr is None else ((addr, 1),), now, self.peers.addrs)
            return
        if not self.sealer.verify(buf, n, self.rank):
            self.failed_tag(buf, n, addr, now)
            return
        try:
            h = wire.unpack_header(buf, n, self.chunk_bytes)
        except wire.MalformedDatagram:
            self.counters.malformed += 1
            return
        t = h.type
        if t == MsgType.HELLO or t == MsgType.WELCOME or t == MsgType.CHALLENGE:
            if self.joining.handler is not None:
                self.joining.handler(h, bytes(buf[HEADER_SIZE:HEADER_SIZE + h.length]), addr,
                                     tcp_peer)
            else:
                self.counters.foreign += 1
            return
        if h.session != self.session or h.src not in self.peers.addrs \
                or self.joining.current_conn is not None \
                or (tcp_peer is not None and tcp_peer != h.src) \
                or (self.sealer.key is None and addr is not None and addr != self.peers.addrs[h.src]):
            # Without a key, the pinned address is the only proof of who is talking.
            self.counters.foreign += 1
            return
        if self.finals.pending:
            self.finals.implicit_ack(h.src, h.round)
        if h.round != self.round:
            if h.round < self.round:
                self._handle_stale(h, buf, n, now)
            elif h.round != self.round + 1 or not self.early.keep(buf, n, addr, tcp_peer):
                self.counters.early_dropped += 1
            return
        self.seen_round = True
        kind = PULL if h.flags & Flag.PULL else PUSH
        key = (kind, h.part, h.src)
        if t == _DATA:
            r = self.receivers.get(key)
            if r is None:
                self.counters.foreign += 1
            else:
                r.on_data(h, buf, n, now)
        elif t == MsgType.PROBE:
            r = self.receivers.get(key)
            if r is None:
                self.counters.foreign += 1
            else:
                r.on_probe(h, now)
        elif t == MsgType.BITMAP or t == MsgType.STOP:
            s = self.senders.get(key)
            if s is None:
                self.counters.foreign += 1
            else:
                s.on_reply(h, buf[HEADER_SIZE:HEADER_SIZE + h.length], now)
                if s.state == SENDING:
                    self.sender_active(s)
        elif t == MsgType.FINAL:
            r = self.receivers.get(key)
            if r is None or r.kind != PULL:
                self.counters.foreign += 1
            else:
                r.on_final(h, buf[HEADER_SIZE:HEADER_SIZE + h.length])
        elif t == MsgType.DONE:
            entry = self.finals.pending.pop((h.src, h.part, h.round), None)
            if entry is None:
                self.counters.duplicates += 1
            elif entry.backoff == 1.0:  # FINAL sent once: an unambiguous RTT sample
                self.peers.rtt_sample(h.src, now - entry.sent_at)

    def worth_verifying(self, buf, addr=None) -> bool:
        """Whether a keyed message could be this job's at all, from its header before the MAC.

        Everything after the join carries the job's session and comes from a
        member; a join message must be one the installed join handler takes
        (``Joining.admit``). Anything else is dropped before a MAC or a key
        derivation costs anything (a forged session would otherwise cost a
        derivation each), and never reaches a failed-tag diagnosis.
        """
        t = buf[_TYPE_OFF]
        src = int.from_bytes(buf[_SRC_OFF:_SRC_OFF + 2], "big")
        session = int.from_bytes(buf[_SESSION_OFF:_SESSION_OFF + 8], "big")
        if t in wire.JOIN_TYPES:
            admit = self.joining.admit
            return admit is not None and admit(t, src, session)
        if session != self.session or src not in self.peers.addrs:
            return False
        # A datagram (not a TCP frame) must come from the member's address pinned at
        # join, as without a key: a forged source costs a compare, not a MAC.
        return addr is None or addr == self.peers.addrs[src]

    def failed_tag(self, buf, n: int, addr, now: float) -> None:
        """A message whose tag failed: counted; acted on (the join's refusal and diagnosis)
        only while the global budget for failed tags allows (``BadSources``)."""
        self.counters.unauthenticated += 1
        if self.bad.failed(addr, now, self.peers.addrs) and self.joining.on_bad_tag is not None:
            self.joining.on_bad_tag(buf, n, addr, now)

    def _handle_stale(self, h: wire.Header, buf, n: int, now: float) -> None:
        t = h.type
        if t == MsgType.DONE:
            self.finals.pending.pop((h.src, h.part, h.round), None)
            return
        if t == MsgType.FINAL:
            # We already applied that round; the DONE was lost: acknowledge again
            # (once per FINAL transmission id, not once per copy).
            if not self.finals.answer_once((h.src, h.part, h.round), h.index):
                return
            done = wire.pack_header(MsgType.DONE, src=self.rank, part=h.part, session=self.session,
                                    round=h.round, flags=h.flags & Flag.PULL, copies=h.copies)
            self.send_ctrl(h.src, done, self.reply_copies(h.src, h.copies))
            self.counters.stale += 1
            return
        if t == MsgType.PROBE and h.round == self.round - 1:
            kind = PULL if h.flags & Flag.PULL else PUSH
            r = self.prev_receivers.get((kind, h.part, h.src))
            if r is not None:
                r.on_probe(h, now)
                return
        self.counters.stale += 1

    def _filter_blocked(self, now: float) -> bytes:
        """The sources ``self.bad`` blocks now (`batch.blocked_keys`), with the socket's
        kernel filter kept to the same list (`dblp.sockfilter`): a blocked source's later
        datagrams never reach the socket's buffer."""
        keys = batch.blocked_keys(self, now) if self.bad.blocked else b""
        allow = self._allowed()
        if keys != self.kernel_blocked or allow != self.kernel_allow:
            try:
                sockfilter.drop_sources(self.sock, keys, allow)
                self.kernel_blocked, self.kernel_allow = keys, allow
            except OSError:
                pass  # no socket filters here: user space alone drops them (as before)
        return keys

    def _allowed(self) -> tuple[int, bytes] | None:
        """What a keyed job's socket filter lets through beyond the joins: the session and the
        members' pinned addresses (`worth_verifying`'s checks). None without a key, a
        session or a member, or where an address has no IPv4 form the kernel would give
        (user space then compares, as before)."""
        if self.sealer.key is None or not self.session or not self.peers.addrs:
            return None
        raw = [batch.port_and_ip(a) for a in set(self.peers.addrs.values())]
        if any(r is None for r in raw):
            return None
        return self.session, b"".join(sorted(r for r in raw if r is not None))

    def refilter(self) -> None:
        """Bring the socket's kernel filter up to date at once: after a member's address or
        the session changed, before anything is sent that the member will answer."""
        self._filter_blocked(time.monotonic())

    def _read_udp(self, now: float, limit: int = 512) -> None:
        if self.ring is not None:
            self._read_udp_batched(now, limit)
            return
        if self.bad.blocked or self.kernel_blocked:
            self._filter_blocked(now)
        sock, buf, mv = self.sock, self.buf, self.mv
        for _ in range(limit):
            try:
                n, addr = sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # ICMP errors surface here on Linux; ignore
            if self.fault_rx_drop and self._fault_rng.random() < self.fault_rx_drop:
                continue
            self.handle(mv, n, addr, None, now)

    def _read_udp_batched(self, now: float, limit: int) -> None:
        """Up to ``limit`` datagrams, a ring (``recvmmsg``) at a time (``batch.deliver``)."""
        ring = self.ring
        assert ring is not None
        blocked = self._filter_blocked(now) if self.bad.blocked or self.kernel_blocked else b""
        for _ in range(-(-limit // ring.slots)):
            m = ring.receive(blocked)
            if blocked:
                self.counters.unauthenticated += ring.take_dropped()
            if m == 0:
                return
            self.last_read += max(0, m)
            if m > 0:  # < 0: an error (e.g. a late ICMP report) to skip, as recvfrom's
                batch.deliver(self, ring, m, now)
                if m < ring.slots:
                    return

    def _read_tcp(self, conn: TcpControl, now: float) -> None:
        try:
            for frame in conn.read_frames():
                if conn.peer is None:
                    # An unbound connection gets one frame: a HELLO that binds it to a rank.
                    self.joining.current_conn = conn
                    self.handle(memoryview(frame), len(frame), None, None, now)
                    if conn.peer is None:
                        conn.close()
                        break
                else:
                    self.joining.current_conn = None
                    self.handle(memoryview(frame), len(frame), None, conn.peer, now)
        finally:
            self.joining.current_conn = None
        if conn.peer is not None:
            self.joining.unbound.pop(conn, None)
        if conn.malformed:
            conn.malformed = False
            self.counters.malformed += 1
        if conn.closed:
            self._forget_conn(conn)

    def _forget_conn(self, conn: TcpControl) -> None:
        """Stop watching a closed (or refused) connection and release its descriptor."""
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.close()
        self.joining.unbound.pop(conn, None)
        if conn.peer is not None and self.peers.tcp.get(conn.peer) is conn:
            # Normal after a peer's last round; an error only if this round still needs
            # the peer (``run_until``'s ``check`` raises PeerClosed then).
            self.peers.closed.add(conn.peer)
            self.finals.forget_peer(conn.peer)

    def register_tcp(self, conn: TcpControl, max_unbound: int | None = None) -> None:
        """Watch ``conn``; one without a rank must bind itself within ``hello_timeout``.

        At most ``max_unbound`` unbound connections are kept: a flood of idle
        connects closes the oldest instead of holding a descriptor each.
        """
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)
        if conn.peer is None:
            unbound = self.joining.unbound
            unbound[conn] = time.monotonic() + self.joining.hello_timeout
            while max_unbound is not None and len(unbound) > max_unbound:
                self._forget_conn(next(iter(unbound)))
                self.counters.foreign += 1

    def _expire_unbound(self, now: float) -> float:
        """Close unbound TCP connections past their deadline; return the next deadline."""
        for conn, t in list(self.joining.unbound.items()):
            if now >= t:
                self._forget_conn(conn)
                self.counters.foreign += 1
        return min(self.joining.unbound.values(), default=math.inf)

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for input and handle everything that arrived.

        Arrivals are stamped after the wait: a stamp taken before it would make
        every RTT sample short by the time spent waiting, hence RTOs too small
        and probe timers firing before the reply could arrive.
        """
        if self.bad.blocked or self.kernel_blocked:
            # Blocks end on their timer, not at the next read: a blocked source's datagrams
            # never reach a read (the socket's filter drops them), so a read may never come.
            before = time.monotonic()
            self._filter_blocked(before)
            timeout = min(timeout, self.bad.expire(before) - before)
        # A ring cut short may hold coalesced datagrams the socket no longer signals.
        held = self.ring is not None and self.ring.held()
        events = self.sel.select(0.0 if held else max(0.0, timeout))
        now = time.monotonic()
        self.last_read = 0
        if held and not any(key.data is None for key, _ in events):
            self._read_udp(now)
        for key, _ in events:
            if key.data is None:
                self._read_udp(now)
            elif key.data == "listen":
                if self.joining.accept_handler is not None:
                    self.joining.accept_handler()
            else:
                self._read_tcp(key.data, now)

    # -- the loop ---------------------------------------------------------------------
    def _fire_timers(self, now: float) -> float:
        nxt = self._expire_unbound(now) if self.joining.unbound else math.inf
        for s in self.senders.values():
            if s.state == PROBING:
                nxt = min(nxt, s.on_timer(now))
        if self.finals.pending:
            for key, entry in self.finals.pending.items():
                if now >= entry.due:
                    entry.backoff = min(8.0, entry.backoff * 1.5)
                    entry.id += 1
                    _INDEX.pack_into(entry.body, _INDEX_OFF, entry.id)
                    self.send_ctrl(key[0], bytes(entry.body), self.copies(key[0]))
                    rto = self.rto(key[0])
                    entry.due = now + (rto * entry.backoff if rto < math.inf else 3600.0)
                nxt = min(nxt, entry.due)
        return nxt

    def _send_some(self, now: float) -> float:
        """Send what the buckets allow now, pushes first, round-robin; return when to try again.

        Without batching a stream's turn is one datagram and a call sends at most
        32. With it (``batch_max`` > 1) each send carries as many datagrams as
        the buckets allow, and a turn is four batches' worth of one stream, which
        is also all of one call: the receiver then sees long runs of one stream,
        which it handles as arrays (``batch.deliver``), and at the ~0.2 ms a turn
        lasts at 10 Gbit/s the streams still share the link evenly.
        """
        active = self.active
        full = self.wire_size(self.max_datagram) - WIRE_OVERHEAD  # a full chunk, as paced
        turn = 1 if self.batch_max == 1 else 4 * self.batch_max
        budget = 32 if self.batch_max == 1 else turn
        sent = in_turn = 0
        while active:
            wait = self._next_ready(full, now)
            if wait > 0:
                return now + wait
            s = active[self._rr]
            if not s.has_pending():
                active.pop(self._rr)
                continue
            k = self._batch_allowance(s.peer, full, now)
            if k < self.batch_max:
                # A partial batch: wait for the tokens of a whole one (or of what the
                # pass has left) instead of sending a datagram or two per loop turn,
                # which costs the same Python and system call as 44.
                wait = self._batch_wait(s, full, now)
                if wait > 0:
                    return now + wait
                k = self._batch_allowance(s.peer, full, now)
            n = s.send_batch(now, k) if k > 1 else (1 if s.send_next(now) else 0)
            if n == 0:
                return now + 0.0002  # socket buffer full (or GSO just refused): retry soon
            sent += n
            in_turn += n
            if in_turn >= turn:
                self._rr += 1
                in_turn = 0
            if sent >= budget:
                return now
        return math.inf

    def _next_ready(self, full: int, now: float) -> float:
        """Seconds until a full datagram may leave (0: now, ``_rr`` then names a stream).

        Round-robin over the senders whose destination has tokens, when each
        destination has its own bucket, and over the pushes while any has data.
        """
        wait = self.bucket.wait_time(full, now)
        if wait > 0:
            return wait
        active = self.active
        self._rr %= len(active)
        ready: list[int] | range = range(len(active))
        if self.peer_rate_bps is not None:
            waits = [self.peer_bucket(x.peer).wait_time(full, now) for x in active]
            ready = [i for i, w in enumerate(waits) if w <= 0]
            if not ready:
                return min(waits)
        # Pushes before pulls: a pull can only carry what the other side's push has
        # delivered, so link time given to a pull while a push waits delays the
        # peers' pulls and leaves their links idle at the end of the round (sharded
        # at 1 Gbit/s: rounds of 0.33-0.42 s against 0.32-0.35 s with this).
        pushes = [i for i in ready if active[i].kind == PUSH and active[i].has_pending()]
        if pushes:
            ready = pushes
        # One part at a time to each destination, the lowest first: its owner then has a
        # whole part early and pulls it while the next part's push is on the link.
        # Taking turns between one destination's parts finished them all at the end, so
        # no pull overlapped a push (a parameter server at 3 Gbit/s: pulls ending 0.155-0.185 s
        # into a round whose push ended at 0.110 s).
        heads: dict[int, int] = {}
        for i in ready:
            s = active[i]
            if s.has_pending() and (s.peer not in heads or s.part < active[heads[s.peer]].part):
                heads[s.peer] = i
        if heads:
            ready = sorted(heads.values())
        if self._rr not in ready:
            self._rr = next((i for i in ready if i >= self._rr), ready[0])
        return 0.0

    def _batch_wait(self, s: OutTransfer, full: int, now: float) -> float:
        """Seconds until ``s`` may send a whole batch (``batch_max``, or what its pass has left)."""
        want = min(self.batch_max, s.pending())
        wait = self.bucket.wait_time(full, now, count=want)
        if self.peer_rate_bps is not None:
            wait = max(wait, self.peer_bucket(s.peer).wait_time(full, now, count=want))
        return wait

    def _batch_allowance(self, peer: int, full: int, now: float) -> int:
        """Datagrams of ``full`` paced bytes the next send may carry: 1 without batching."""
        if self.batch_max == 1:
            return 1
        k = min(self.batch_max, self.bucket.allowance(full, now))
        if self.peer_rate_bps is not None:
            k = min(k, self.peer_bucket(peer).allowance(full, now))
        return max(1, k)

    def run_until(self, done, deadline: float, describe, needs=None) -> None:
        """Drive I/O until ``done()`` or raise PeerTimeout at ``deadline``.

        ``needs()`` returns the peers the caller still waits for; one of them with a
        closed TCP control connection raises PeerClosed at once.
        """
        while True:
            now = time.monotonic()
            if done():
                return
            if self.peers.closed and needs is not None:
                gone = self.peers.closed & set(needs())
                if gone:
                    raise PeerClosed(f"rank {min(gone)} closed its TCP control connection in "
                                     f"round {self.round}: {describe()}")
            if now >= deadline:
                raise PeerTimeout(describe())
            self.pace.woke(now)
            t_timer = self._fire_timers(now)
            t_send = self._send_some(now)
            self.pace.planned(now, t_send)
            self.progress = False
            wake = min(t_timer, t_send, deadline)
            wait = 0.0 if wake <= now else min(wake - time.monotonic(), 0.05)
            if wait > 0 and self.ring is not None and 0 < self.last_read < self.ring.slots \
                    and not self._in_repair():
                # Receive coalescing, as a NIC's interrupt moderation: the last read
                # drained the queue with a few datagrams, so more are on their way;
                # waking for each of them costs a loop turn of Python per datagram
                # (7 CPU s/GB at 1 Gbit/s). Let a batch gather first; the wait is
                # bounded by the next timer or send, and the reads' timestamps are
                # taken after it, so no RTT sample is short.
                time.sleep(min(wait, self.coalesce_s))
                wait = 0.0
            self.poll(wait)

    def _in_repair(self) -> bool:
        """Whether a reply or a repair is under way, so every arrival is on the round's path.

        A sender waiting for a probe's answer, or a receiver that has answered a
        probe and still lacks chunks, idles its link until the next message is
        handled: there a coalescing sleep is a round trip longer, not a batch
        bigger (at 0.1 Gbit/s under 10 % loss a round has eight such waits).
        """
        return any(s.state == PROBING for s in self.senders.values()) or \
            any(r.last_probe and not r.stopped for r in self.receivers.values())

    def linger(self, seconds: float) -> None:
        """Keep answering (late probes, lost DONEs) for a while, e.g. before closing."""
        end = time.monotonic() + seconds
        while self.finals.pending and time.monotonic() < end:
            t = self._fire_timers(time.monotonic())
            self.poll(max(0.0, min(t, end) - time.monotonic()))

    def close(self) -> None:
        for conn in list(self.peers.tcp.values()):
            conn.close()
        self.peers.tcp.clear()
        try:
            self.sel.close()
        except (OSError, ValueError, KeyError):
            pass
        self.sock.close()

