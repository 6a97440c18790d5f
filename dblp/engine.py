"""The I/O engine: one UDP socket (+ optional TCP control), pacing, timers, dispatch.

Everything a participant does in a round is a set of streams in one engine:
``OutTransfer`` (sender state machine: paced pass, PROBE, resend exactly what a
BITMAP lists, until STOP) and ``InTransfer`` (receiver state machine: accept
chunks, STOP as soon as the missing fraction is within the bound, answer PROBEs).
A stream is keyed by (kind, part, peer) where kind is PUSH or PULL. The engine
runs single-threaded and non-blocking: ``run_until`` interleaves receiving,
pacing and timers until a condition holds or the round deadline passes, which
raises ``PeerTimeout`` naming what was still missing.

Control budget: a loss-free round costs about four control datagrams per stream
(PROBE, STOP, its answer to the probe, FINAL or DONE). Redundancy (``copies``)
follows a per-peer loss estimate that every BITMAP *and* STOP updates (fast up,
down within a few rounds); each probe id and each FINAL transmission is answered
once, whatever number of copies arrives; a STOP is repeated at most once per RTT.

Anything that does not belong to the current round of this session is counted
and dropped (``Counters``); messages of the next round are kept in a bounded
buffer and replayed when that round starts; never does a stray datagram raise.
"""
from __future__ import annotations

import math
import selectors
import socket
import struct
import time

import numpy as np

from . import wire
from .errors import PeerClosed, PeerTimeout, TransportError
from .pacing import RttEstimator, TokenBucket
from .stats import Counters
from .wire import CHUNK_BYTES, HEADER_SIZE, Flag, MsgType

PUSH, PULL = 0, 1
SENDING, PROBING, DONE = "sending", "probing", "done"
_DATA = int(MsgType.DATA)
_FRAME = struct.Struct("!H")
_INDEX = struct.Struct("!I")
_INDEX_OFF = wire.FIELD_OFFSETS["index"][0]


def copies_for_loss(p: float, max_copies: int) -> int:
    """Control redundancy so one control message gets through with ~98 %."""
    if p <= 0.01:
        return 1
    if p >= 0.999:
        return max_copies
    return max(1, min(max_copies, math.ceil(math.log(0.02) / math.log(p))))


def stream_order(session: int, round: int, kind: int, part: int, src: int, count: int) -> np.ndarray:
    """The per-round seeded permutation of chunk indices of one stream.

    Early stops then drop a different random subset every round instead of
    always the tail of the model (the prototype's fixed order).
    """
    rng = np.random.default_rng([session & 0xFFFFFFFF, session >> 32, round, kind, part, src])
    return rng.permutation(count).astype(np.int64)


def pack_bitmap(held: np.ndarray) -> bytes:
    return np.packbits(held.astype(np.uint8)).tobytes()


def unpack_bitmap(payload, count: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(payload, np.uint8), count=count).astype(bool)


class TcpControl:
    """A TCP control connection (TCP_NODELAY), frames = 2-byte length + message."""

    def __init__(self, sock: socket.socket, peer: int | None = None):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(True)
        self.sock = sock
        self.peer = peer
        self.rx = bytearray()
        self.closed = False

    def send(self, msg: bytes) -> None:
        try:
            self.sock.sendall(_FRAME.pack(len(msg)) + msg)
        except OSError as exc:
            self.closed = True
            raise PeerClosed(f"control connection to peer {self.peer} failed: {exc}") from exc

    def read_frames(self) -> list[bytes]:
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.rx += data
        frames = []
        while len(self.rx) >= 2:
            (n,) = _FRAME.unpack_from(self.rx, 0)
            if len(self.rx) < 2 + n:
                break
            frames.append(bytes(self.rx[2:2 + n]))
            del self.rx[:2 + n]
        return frames

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class OutTransfer:
    """Sender of one stream: paced passes, PROBE, resend what BITMAP lists, until STOP."""

    def __init__(self, eng: "Engine", kind: int, part: int, peer: int, data: np.ndarray,
                 bound_ppm: int, flags: int = 0):
        self.eng, self.kind, self.part, self.peer = eng, kind, part, peer
        self.round = eng.round
        data = np.ascontiguousarray(data, dtype="<f4")
        self.data = data
        self.raw = memoryview(data.view(np.uint8))
        self.nbytes = data.nbytes
        self.count = max(1, -(-self.nbytes // CHUNK_BYTES))
        if self.count > wire.MAX_PART_CHUNKS:
            raise TransportError(f"stream of {self.count} chunks exceeds MAX_PART_CHUNKS")
        self.bound_ppm = bound_ppm
        self.flags = flags | (Flag.PULL if kind == PULL else 0)
        self.order = stream_order(eng.session, self.round, kind, part, eng.rank, self.count)
        self.queue = self.order
        self.pos = 0
        self.state = SENDING
        self.passes = 1
        self.chunks_sent = 0
        self.retransmitted = 0
        self.probes = 0
        self.held: np.ndarray | None = None  # receiver's bitmap at STOP (or last BITMAP)
        self.required: np.ndarray | None = None  # repair mode: chunks that must arrive
        self.t_done = None
        self.probe_id = 0
        self.probe_first = 1
        self.probe_times: dict[int, float] = {}
        self.next_probe_t = math.inf
        self.backoff = 1.0
        self.sent_at = np.full(self.count, math.inf)  # when each chunk last left (loss samples)
        if self.nbytes == 0:
            self.state = DONE
            self.held = np.ones(self.count, bool)

    # -- sending ---------------------------------------------------------------
    def has_pending(self) -> bool:
        return self.state == SENDING and self.pos < len(self.queue)

    def send_next(self, now: float) -> int:
        """Send the next chunk of the pass; returns bytes sent (0 if socket full)."""
        c = int(self.queue[self.pos])
        start = c * CHUNK_BYTES
        end = min(start + CHUNK_BYTES, self.nbytes)
        eng = self.eng
        hdr = wire.pack_header(_DATA, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=c, count=self.count, length=end - start,
                               bound=self.bound_ppm, aux=self.passes, flags=self.flags,
                               copies=eng.copies(self.peer))
        n = eng.send_data(hdr, self.raw[start:end], self.peer)
        if n == 0:
            return 0
        self.sent_at[c] = now
        self.pos += 1
        self.chunks_sent += 1
        if self.passes > 1:
            self.retransmitted += 1
        if self.pos >= len(self.queue):
            self.state = PROBING
            self.probe_first = self.probe_id + 1
            self.backoff = 1.0
            self._send_probe(now)
        return n

    def _send_probe(self, now: float) -> None:
        eng = self.eng
        now = time.monotonic()  # the loop's ``now`` may predate a batch of sends
        self.probe_id += 1
        self.probe_times[self.probe_id] = now
        copies = eng.copies(self.peer)
        msg = wire.pack_header(MsgType.PROBE, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=self.probe_id, count=self.count,
                               bound=self.bound_ppm, flags=self.flags, copies=copies)
        eng.send_ctrl(self.peer, msg, copies)
        self.probes += 1
        rto = eng.rto(self.peer)
        self.next_probe_t = now + rto * self.backoff if rto < math.inf else math.inf

    def on_timer(self, now: float) -> float:
        if self.state != PROBING:
            return math.inf
        if now >= self.next_probe_t:
            # No reply: the probe or its answer was lost. Treat it as evidence of loss so
            # the next probe (and the peer's reply) go out with more copies.
            self.eng.loss_timeout(self.peer)
            self.backoff = min(4.0, self.backoff * 1.5)
            self._send_probe(now)
        return self.next_probe_t

    # -- replies ---------------------------------------------------------------
    def on_reply(self, h: wire.Header, payload, now: float) -> None:
        if self.state == DONE or h.count != self.count:
            if h.count != self.count:
                self.eng.counters.malformed += 1
            return
        held = unpack_bitmap(payload, self.count)
        sent_at = self.probe_times.get(h.index)
        if sent_at is not None and h.index >= self.probe_first:
            self.eng.rtt_sample(self.peer, now - sent_at)
            self.probe_times.clear()
        answers_probe = self.state == PROBING and h.index >= self.probe_first
        if h.type == MsgType.STOP and self.required is None:
            self.held = held
            self._loss_sample_at_stop(held, now, answers_probe)
            self._finish()
            return
        if not answers_probe:
            return  # a reply to an older probe, or an unsolicited STOP during repair
        if h.type == MsgType.BITMAP and self.required is None:
            last = self.queue
            if len(last):
                self.eng.loss_sample(self.peer, float(np.count_nonzero(~held[last])) / len(last))
        self.held = held
        missing = ~held
        if self.required is not None:
            missing &= self.required
        if not missing.any():
            if self.required is not None or h.type == MsgType.STOP:
                self._finish()
            else:
                # BITMAP with nothing missing: the receiver holds all; probe again for STOP.
                self.next_probe_t = now
            return
        self.queue = self.order[missing[self.order]]
        self.pos = 0
        self.passes += 1
        self.state = SENDING

    def _loss_sample_at_stop(self, held: np.ndarray, now: float, answers_probe: bool) -> None:
        """A STOP carries a bitmap too: sample the loss of this pass from it.

        Without this, loss-free rounds (STOP, never a BITMAP) never lower the
        estimate a burst raised, and control stays at burst redundancy for good.
        Only chunks of the current pass that had time to arrive count: all of them
        if the STOP answers a probe sent after the pass, else those sent at least
        an RTO before the STOP arrived.
        """
        if self.passes > 1 and not answers_probe:
            return  # early STOP during a resend pass: too few chunks to judge
        sent = self.queue[:self.pos]
        if not answers_probe:
            sent = sent[self.sent_at[sent] <= now - self.eng.rto(self.peer)]
        if len(sent) >= 8 or (answers_probe and len(sent)):
            self.eng.loss_sample(self.peer, float(np.count_nonzero(~held[sent])) / len(sent))

    def _finish(self) -> None:
        self.t_done = time.monotonic()
        self.state = DONE
        self.next_probe_t = math.inf
        self.eng.sender_done(self)

    def repair(self, chunks: np.ndarray) -> None:
        """Pull repair: deliver exactly ``chunks`` (a bool mask) even after STOP."""
        self.required = chunks.copy()
        missing = chunks & ~(self.held if self.held is not None else np.zeros(self.count, bool))
        self.queue = self.order[missing[self.order]]
        self.pos = 0
        self.passes += 1
        self.state = SENDING if len(self.queue) else PROBING
        if self.state == PROBING:
            self.probe_first = self.probe_id + 1
            self._send_probe(time.monotonic())
        self.eng.sender_active(self)

    def describe(self) -> str:
        what = "pull" if self.kind == PULL else "push"
        held = "?" if self.held is None else int(self.held.sum())
        return (f"{what} part {self.part} to rank {self.peer}: {self.state}, pass {self.passes}, "
                f"receiver held {held}/{self.count} chunks")


class InTransfer:
    """Receiver of one stream: STOP as soon as missing <= bound, checked per chunk.

    ``add=True`` accumulates chunks into ``out`` (aggregator side); otherwise
    chunks are copied. ``freeze=True`` (push streams) ignores chunks after STOP,
    so what the aggregate contains is exactly what the STOP bitmap told the
    sender (error feedback relies on it). Pull streams keep accepting until
    the FINAL message says which chunks every replica zero-fills.
    """

    def __init__(self, eng: "Engine", kind: int, part: int, peer: int, out: np.ndarray,
                 bound_ppm: int, *, add: bool, freeze: bool, trust_header_bound: bool = False):
        self.eng, self.kind, self.part, self.peer = eng, kind, part, peer
        self.round = eng.round
        self.out = out
        self.nbytes = out.nbytes
        self.out_u8 = memoryview(out.view(np.uint8)) if not add else None
        self.count = max(1, -(-self.nbytes // CHUNK_BYTES))
        self.add = add
        self.freeze = freeze
        self.trust_header_bound = trust_header_bound
        self.bound_ppm = bound_ppm
        self.allowed = wire.allowed_missing(self.count, bound_ppm)
        self.have = np.zeros(self.count, bool)
        self.n_have = 0
        self.max_pass = 0
        self.t_first = self.t_stop = None  # monotonic times, for latency breakdowns
        self.stopped = False
        self.final: np.ndarray | None = None
        self.last_stop_t = -math.inf
        self.last_probe = 0  # highest probe id answered: copies of one probe get one reply
        self.last_final = 0  # highest FINAL transmission id acknowledged
        self.flags = Flag.PULL if kind == PULL else 0
        if self.nbytes == 0:
            self.have[:] = True
            self.n_have = self.count
            self.stopped = True

    @property
    def satisfied(self) -> bool:
        return self.stopped

    def _reply(self, type_: int, copies: int, probe_id: int = 0) -> None:
        eng = self.eng
        msg = wire.pack_header(type_, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=probe_id, count=self.count,
                               length=(self.count + 7) // 8, bound=self.bound_ppm,
                               flags=self.flags, copies=copies) + pack_bitmap(self.have)
        # The requester sized ``copies`` for its path to us; our own estimate (from our
        # data to that peer) covers the path this reply takes: use the larger.
        copies = max(copies, eng.copies(self.peer))
        eng.send_ctrl(self.peer, msg, min(max(1, copies), eng.max_copies))

    def on_data(self, h: wire.Header, buf, n: int, now: float) -> None:
        c = h.index
        start = c * CHUNK_BYTES
        if h.count != self.count or h.length != min(CHUNK_BYTES, self.nbytes - start):
            self.eng.counters.malformed += 1
            return
        if (self.stopped and self.freeze) or self.final is not None:
            self.eng.counters.late += 1
            self._repeat_stop(h, now)
            return
        if self.have[c]:
            self.eng.counters.duplicates += 1
            if self.stopped:
                self._repeat_stop(h, now)
            return
        if self.add:
            e0 = start // 4
            self.out[e0:e0 + h.length // 4] += np.frombuffer(buf, "<f4", h.length // 4, HEADER_SIZE)
        else:
            self.out_u8[start:start + h.length] = buf[HEADER_SIZE:HEADER_SIZE + h.length]
        if not self.n_have:
            self.t_first = now
        self.have[c] = True
        self.n_have += 1
        if h.aux > self.max_pass:
            self.max_pass = h.aux
        if self.trust_header_bound and h.bound != self.bound_ppm:
            self.bound_ppm = h.bound
            self.allowed = wire.allowed_missing(self.count, h.bound)
        if not self.stopped and self.count - self.n_have <= self.allowed:
            self.stopped = True
            self.last_stop_t = self.t_stop = now
            self._reply(MsgType.STOP, h.copies)
            self.eng.progress = True

    def _repeat_stop(self, h: wire.Header, now: float) -> None:
        """The sender keeps sending: our STOP was lost; repeat it, once per RTT.

        Chunks already in flight when the sender got the STOP arrive for up to one
        RTT after it; repeating the STOP for each of them (times ``copies``) only
        floods the reverse path, so repeats wait at least a smoothed RTT.
        """
        if self.eng.control == "tcp" and self.peer in self.eng.tcp:
            return  # TCP delivers the first STOP; repeats would only queue behind it
        if self.final is None and now - self.last_stop_t >= self.eng.stop_repeat_interval(self.peer):
            self.last_stop_t = now
            self._reply(MsgType.STOP, h.copies)

    def on_probe(self, h: wire.Header, now: float) -> None:
        if h.count != self.count:
            self.eng.counters.malformed += 1
            return
        if h.index <= self.last_probe:
            # Another copy (or an older probe): its probe id was answered already, with
            # ``copies`` replies. Answering every copy again would send copies^2 replies.
            return
        self.last_probe = h.index
        self._reply(MsgType.STOP if self.stopped else MsgType.BITMAP, h.copies, h.index)

    def on_final(self, h: wire.Header, payload) -> None:
        if h.count != self.count:
            self.eng.counters.malformed += 1
            return
        if self.final is None:
            dropped = unpack_bitmap(payload, self.count)
            # Zero-fill what every replica zero-fills; anything else we lack
            # (cannot happen with an honest aggregator) is zeroed and counted.
            zero = dropped | ~self.have
            if (~self.have & ~dropped).any():
                self.eng.counters.malformed += 1
            if zero.any():
                self.out[np.repeat(zero, CHUNK_BYTES // 4)[:self.out.size]] = 0
            self.final = dropped
            self.final_next_bound = h.aux
            self.final_flags = h.flags
            self.eng.progress = True
        if h.index and h.index <= self.last_final:
            return  # another copy of a FINAL transmission we acknowledged already
        self.last_final = h.index
        eng = self.eng
        done = wire.pack_header(MsgType.DONE, src=eng.rank, part=self.part, session=eng.session,
                                round=h.round, flags=self.flags, copies=h.copies)
        eng.send_ctrl(self.peer, done, min(max(h.copies, eng.copies(self.peer)), eng.max_copies))

    def describe(self) -> str:
        what = "pull" if self.kind == PULL else "push"
        return (f"{what} part {self.part} from rank {self.peer}: {self.n_have}/{self.count} chunks"
                f" (may miss {self.allowed}), {'stopped' if self.stopped else 'receiving'}"
                + (", waiting for FINAL" if self.kind == PULL and self.final is None else ""))


class Engine:
    """One participant's sockets, pacing, RTT state and the streams of its round."""

    def __init__(self, rank: int, *, bind: tuple[str, int] = ("0.0.0.0", 0), session: int = 0,
                 control: str = "udp", rate_bps: float | None = None,
                 peer_rate_bps: float | None = None, sock_buf: int = 8 << 20,
                 max_copies: int = 16, initial_rto: float = 0.02, min_rto: float = 0.002,
                 max_rto: float = 1.0, stop_repeat_s: float = 0.0005, early_cap: int = 65536,
                 fault_rx_drop: float = 0.0, fault_seed: int | None = None):
        if control not in ("udp", "tcp"):
            raise ValueError(f"control must be 'udp' or 'tcp', got {control!r}")
        if not 0.0 <= fault_rx_drop < 1.0:
            raise ValueError(f"fault_rx_drop must be in [0, 1), got {fault_rx_drop!r}")
        # Fault injection for tests without root: drop this fraction of received datagrams.
        self.fault_rx_drop = fault_rx_drop
        self._fault_rng = np.random.default_rng(fault_seed)
        self.rank = rank
        self.session = session
        self.control = control
        self.max_copies = max_copies
        self.stop_repeat_s = stop_repeat_s
        self._rtt_args = (initial_rto, min_rto, max_rto)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, force, sock_buf)  # *BUFFORCE (root)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, sock_buf)
        self.sock.bind(bind)
        self.sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self.bucket = TokenBucket(rate_bps)
        # Optional cap per destination (sharded mode): when the transfers to
        # the other peers finish, the last one must not take the whole rate,
        # or N-1 senders together offer N-1 times the line rate to one
        # downlink. One bucket per peer, made on first use.
        if peer_rate_bps is not None and not peer_rate_bps > 0:
            raise ValueError(f"peer_rate_bps must be positive or None, got {peer_rate_bps!r}")
        self.peer_rate_bps = peer_rate_bps
        self.peer_buckets: dict[int, TokenBucket] = {}
        self.peers: dict[int, tuple[str, int]] = {}
        self.tcp: dict[int, TcpControl] = {}
        self.rtts: dict[int, RttEstimator] = {}
        self.loss: dict[int, float] = {}
        self.counters = Counters()
        self.round = -1
        self.seen_round = False
        self.senders: dict[tuple[int, int, int], OutTransfer] = {}
        self.receivers: dict[tuple[int, int, int], InTransfer] = {}
        self.prev_receivers: dict[tuple[int, int, int], InTransfer] = {}
        self.active: list[OutTransfer] = []
        self.pending_finals: dict[tuple[int, int, int], list] = {}  # (peer, part, round) -> [msg, t, backoff, t0, id]
        self.acked_finals: dict[tuple[int, int, int], int] = {}  # stale FINALs answered: last id
        self.early: list[tuple[bytes, int | None]] = []
        self.early_cap = early_cap
        self.join_handler = None  # f(header, payload, addr, tcp) for HELLO/WELCOME
        self.current_conn: TcpControl | None = None  # an unbound TCP conn being read
        self.closed_peers: set[int] = set()  # peers whose TCP control connection closed
        self.tcp_accept_handler = None
        self.bytes_sent = 0
        # Datagrams (or TCP frames) sent, by kind: control must stay a small fraction.
        self.datagrams = {"data": 0, "control": 0}
        self.progress = False
        self._rr = 0
        self.buf = bytearray(65536)
        self.mv = memoryview(self.buf)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()

    # -- per-peer estimates ----------------------------------------------------------
    def rtt(self, peer: int) -> RttEstimator:
        est = self.rtts.get(peer)
        if est is None:
            est = self.rtts[peer] = RttEstimator(*self._rtt_args)
        return est

    def rto(self, peer: int) -> float:
        if self.control == "tcp" and peer in self.tcp:
            return math.inf  # TCP retransmits control itself (the paper's design)
        return self.rtt(peer).rto

    def rtt_sample(self, peer: int, rtt: float) -> None:
        self.rtt(peer).sample(rtt)

    def loss_sample(self, peer: int, frac: float) -> None:
        old = self.loss.get(peer)
        # Fast up (a burst must not cost probe timeouts); down within a few samples (one
        # per stream and round), so a burst's redundancy does not outlive it for long.
        self.loss[peer] = frac if old is None or frac > old else 0.25 * old + 0.75 * frac

    def loss_timeout(self, peer: int) -> None:
        self.loss[peer] = min(0.95, self.loss.get(peer, 0.0) + 0.25)

    def stop_repeat_interval(self, peer: int) -> float:
        """Least time between two repeats of a STOP: one smoothed RTT (or the RTO)."""
        est = self.rtt(peer)
        return max(self.stop_repeat_s, est.srtt if est.srtt is not None else est.rto)

    def copies(self, peer: int) -> int:
        if self.control == "tcp" and peer in self.tcp:
            return 1
        return copies_for_loss(self.loss.get(peer, 0.0), self.max_copies)

    # -- output ---------------------------------------------------------------------
    def send_data(self, hdr: bytes, payload, peer: int) -> int:
        try:
            n = self.sock.sendmsg([hdr, payload], [], 0, self.peers[peer])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            n = len(hdr) + len(payload)  # e.g. ECONNREFUSED from an earlier ICMP: count as lost
        self.datagrams["data"] += 1
        self.bytes_sent += n
        self.bucket.consume(n)
        if self.peer_rate_bps is not None:
            self.peer_bucket(peer).consume(n)
        return n

    def peer_bucket(self, peer: int) -> TokenBucket:
        b = self.peer_buckets.get(peer)
        if b is None:
            b = self.peer_buckets[peer] = TokenBucket(self.peer_rate_bps)
        return b

    def send_ctrl(self, peer: int, msg: bytes, copies: int = 1) -> None:
        conn = self.tcp.get(peer) if self.control == "tcp" else None
        if conn is not None:
            conn.send(msg)
            self.bytes_sent += len(msg) + 2
            self.datagrams["control"] += 1
            return
        addr = self.peers.get(peer)
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

    def send_raw(self, msg: bytes, addr) -> None:
        try:
            self.sock.sendto(msg, addr)
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

    def add_sender(self, s: OutTransfer) -> None:
        self.senders[(s.kind, s.part, s.peer)] = s
        if s.state == SENDING:
            self.active.append(s)

    def add_receiver(self, r: InTransfer) -> None:
        self.receivers[(r.kind, r.part, r.peer)] = r

    def replay_early(self) -> None:
        """Feed messages that arrived for this round before it started."""
        early, self.early = self.early, []
        now = time.monotonic()
        for data, tcp_peer in early:
            self.handle(memoryview(data), len(data), None, tcp_peer, now)

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
        msg = bytearray(msg)
        _INDEX.pack_into(msg, _INDEX_OFF, 1)
        self.send_ctrl(peer, bytes(msg), copies)
        self.pending_finals[(peer, part, self.round)] = [msg, now + self.rto(peer), 1.0, now, 1]

    # -- input ------------------------------------------------------------------------
    def handle(self, buf, n: int, addr, tcp_peer: int | None, now: float) -> None:
        """Dispatch one datagram/frame. Never raises on bad input: counts it."""
        try:
            h = wire.unpack_header(buf, n)
        except wire.MalformedDatagram:
            self.counters.malformed += 1
            return
        t = h.type
        if t == MsgType.HELLO or t == MsgType.WELCOME:
            if self.join_handler is not None:
                try:
                    self.join_handler(h, bytes(buf[HEADER_SIZE:n]), addr, tcp_peer)
                except (ValueError, KeyError, TypeError):
                    self.counters.malformed += 1
            else:
                self.counters.foreign += 1
            return
        if h.session != self.session or h.src not in self.peers or self.current_conn is not None \
                or (tcp_peer is not None and tcp_peer != h.src):
            self.counters.foreign += 1
            return
        if self.pending_finals:
            self._implicit_ack(h)
        if h.round != self.round:
            if h.round < self.round:
                self._handle_stale(h, buf, n, now)
            elif h.round == self.round + 1 and len(self.early) < self.early_cap:
                self.early.append((bytes(buf[:n]), tcp_peer))
            else:
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
                s.on_reply(h, buf[HEADER_SIZE:n], now)
                if s.state == SENDING:
                    self.sender_active(s)
        elif t == MsgType.FINAL:
            r = self.receivers.get(key)
            if r is None or r.kind != PULL:
                self.counters.foreign += 1
            else:
                r.on_final(h, buf[HEADER_SIZE:n])
        elif t == MsgType.DONE:
            entry = self.pending_finals.pop((h.src, h.part, h.round), None)
            if entry is None:
                self.counters.duplicates += 1
            elif entry[2] == 1.0:  # FINAL sent once: an unambiguous RTT sample
                self.rtt_sample(h.src, now - entry[3])

    def _implicit_ack(self, h: wire.Header) -> None:
        """Any message of a later round from a peer proves it got our FINALs."""
        for key in [k for k in self.pending_finals if k[0] == h.src and k[2] < h.round]:
            del self.pending_finals[key]

    def _handle_stale(self, h: wire.Header, buf, n: int, now: float) -> None:
        t = h.type
        if t == MsgType.DONE:
            self.pending_finals.pop((h.src, h.part, h.round), None)
            return
        if t == MsgType.FINAL:
            # We already applied that round; the DONE was lost: acknowledge again
            # (once per FINAL transmission id, not once per copy).
            key = (h.src, h.part, h.round)
            if h.index and h.index <= self.acked_finals.get(key, 0):
                return
            self.acked_finals[key] = h.index
            if len(self.acked_finals) > 4096:
                for k in [k for k in self.acked_finals if k[2] < h.round]:
                    del self.acked_finals[k]
            done = wire.pack_header(MsgType.DONE, src=self.rank, part=h.part, session=self.session,
                                    round=h.round, flags=h.flags & Flag.PULL, copies=h.copies)
            self.send_ctrl(h.src, done, min(max(h.copies, self.copies(h.src)), self.max_copies))
            self.counters.stale += 1
            return
        if t == MsgType.PROBE and h.round == self.round - 1:
            kind = PULL if h.flags & Flag.PULL else PUSH
            r = self.prev_receivers.get((kind, h.part, h.src))
            if r is not None:
                r.on_probe(h, now)
                return
        self.counters.stale += 1

    def _read_udp(self, now: float, limit: int = 512) -> None:
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

    def _read_tcp(self, conn: TcpControl, now: float) -> None:
        try:
            for frame in conn.read_frames():
                # an unbound connection may only say HELLO (which binds it to a rank)
                self.current_conn = conn if conn.peer is None else None
                self.handle(memoryview(frame), len(frame), None, conn.peer, now)
        finally:
            self.current_conn = None
        if conn.closed:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            if conn.peer is None or self.tcp.get(conn.peer) is not conn:
                return
            # Normal after a peer's last round; an error only if this round still needs
            # the peer (``run_until``'s ``check`` raises PeerClosed then).
            self.closed_peers.add(conn.peer)
            for key in [k for k in self.pending_finals if k[0] == conn.peer]:
                del self.pending_finals[key]

    def register_tcp(self, conn: TcpControl) -> None:
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for input and handle everything that arrived.

        Arrivals are stamped after the wait: a stamp taken before it would make
        every RTT sample short by the time spent waiting, hence RTOs too small
        and probe timers firing before the reply could arrive.
        """
        events = self.sel.select(max(0.0, timeout))
        now = time.monotonic()
        for key, _ in events:
            if key.data is None:
                self._read_udp(now)
            elif key.data == "listen":
                if self.tcp_accept_handler is not None:
                    self.tcp_accept_handler()
            else:
                self._read_tcp(key.data, now)

    # -- the loop ---------------------------------------------------------------------
    def _fire_timers(self, now: float) -> float:
        nxt = math.inf
        for s in self.senders.values():
            if s.state == PROBING:
                nxt = min(nxt, s.on_timer(now))
        if self.pending_finals:
            for key, entry in self.pending_finals.items():
                if now >= entry[1]:
                    entry[2] = min(8.0, entry[2] * 1.5)
                    entry[4] += 1
                    _INDEX.pack_into(entry[0], _INDEX_OFF, entry[4])
                    self.send_ctrl(key[0], bytes(entry[0]), self.copies(key[0]))
                    rto = self.rto(key[0])
                    entry[1] = now + (rto * entry[2] if rto < math.inf else 3600.0)
                nxt = min(nxt, entry[1])
        return nxt

    def _send_some(self, now: float, batch: int = 32) -> float:
        """Send up to ``batch`` paced datagrams round-robin; return when to try again."""
        active = self.active
        sent = 0
        while active and sent < batch:
            wait = self.bucket.wait_time(wire.MAX_DATAGRAM, now)
            if wait > 0:
                return now + wait
            self._rr %= len(active)
            if self.peer_rate_bps is not None:
                # Round-robin over the senders whose destination has tokens.
                waits = [self.peer_bucket(x.peer).wait_time(wire.MAX_DATAGRAM, now)
                         for x in active]
                ready = [i for i, w in enumerate(waits) if w <= 0]
                if not ready:
                    return now + min(waits)
                self._rr = next((i for i in ready if i >= self._rr), ready[0])
            s = active[self._rr]
            if not s.has_pending():
                active.pop(self._rr)
                continue
            if s.send_next(now) == 0:
                return now + 0.0002  # socket buffer full: let the NIC drain
            self._rr += 1
            sent += 1
        return now if active else math.inf

    def run_until(self, done, deadline: float, describe, needs=None) -> None:
        """Drive I/O until ``done()`` or raise PeerTimeout at ``deadline``.

        ``needs()`` returns the peers the caller still waits for; one of them with a
        closed TCP control connection raises PeerClosed at once.
        """
        while True:
            now = time.monotonic()
            if done():
                return
            if self.closed_peers and needs is not None:
                gone = self.closed_peers & set(needs())
                if gone:
                    raise PeerClosed(f"rank {min(gone)} closed its TCP control connection in "
                                     f"round {self.round}: {describe()}")
            if now >= deadline:
                raise PeerTimeout(describe())
            t_timer = self._fire_timers(now)
            t_send = self._send_some(now)
            self.progress = False
            wake = min(t_timer, t_send, deadline)
            self.poll(0.0 if wake <= now else min(wake - time.monotonic(), 0.05))

    def linger(self, seconds: float) -> None:
        """Keep answering (late probes, lost DONEs) for a while, e.g. before closing."""
        end = time.monotonic() + seconds
        while self.pending_finals and time.monotonic() < end:
            t = self._fire_timers(time.monotonic())
            self.poll(max(0.0, min(t, end) - time.monotonic()))

    def close(self) -> None:
        for conn in list(self.tcp.values()):
            conn.close()
        self.tcp.clear()
        try:
            self.sel.close()
        except (OSError, ValueError, KeyError):
            pass
        self.sock.close()
