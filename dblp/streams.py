"""The two per-stream state machines of a round: ``OutTransfer`` (sender) and ``InTransfer`` (receiver).

A stream is one part of the gradient travelling one way between two ranks,
keyed by (kind, part, peer) with kind PUSH (member -> aggregator) or PULL
(aggregator -> member). The sender paces a pass of chunks in a per-round
seeded order, PROBEs, and resends exactly what the receiver's BITMAP lists
until STOP; the receiver accepts chunks and says STOP as soon as the missing
fraction is within the bound, checked after every chunk. Both talk to the
network only through their ``Engine`` (sending, timers, estimates), and take
the job's chunk size, chunk order and probe timer from it (the prototype
mode of ``TransportConfig``).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from . import wire
from .errors import TransportError
from .wire import HEADER_SIZE, Flag, MsgType

if TYPE_CHECKING:
    from .link import TransferLink

PUSH, PULL = 0, 1
SENDING, PROBING, DONE = "sending", "probing", "done"
_DATA = int(MsgType.DATA)


def copies_for_loss(p: float, max_copies: int) -> int:
    """Control redundancy so one control message gets through with ~98 %."""
    if p <= 0.01:
        return 1
    if p >= 0.999:
        return max_copies
    return max(1, min(max_copies, math.ceil(math.log(0.02) / math.log(p))))


def stream_order(session: int, round: int, kind: int, part: int, src: int, count: int,
                 order: str = "shuffled") -> np.ndarray:
    """The chunk indices of one stream in the order a pass sends them.

    "shuffled": a per-round seeded permutation, so early stops drop a
    different random subset every round instead of always the tail of the
    model; "fixed": index order, the prototype's (``dblp.config.ORDERS``).
    """
    if order == "fixed":
        return np.arange(count, dtype=np.int64)
    rng = np.random.default_rng([session & 0xFFFFFFFF, session >> 32, round, kind, part, src])
    return rng.permutation(count).astype(np.int64)


def pack_bitmap(held: np.ndarray) -> bytes:
    return np.packbits(held.astype(np.uint8)).tobytes()


def unpack_bitmap(payload, count: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(payload, np.uint8), count=count).astype(bool)

class OutTransfer:
    """Sender of one stream: paced passes, PROBE, resend what BITMAP lists, until STOP.

    An unanswered PROBE is resent after ``Engine.probe_timeout``: the adaptive
    RTO with backoff, the prototype's fixed ``probe_wait``, or never over TCP
    control (TCP retransmits it).

    The prototype's no-progress rule (``no_progress_probes`` = N > 0): a
    BITMAP equal to the one the last resend pass was made from says that pass
    delivered nothing; the sender then waits ``Engine.reprobe_wait`` and
    probes again instead of resending, up to N probe rounds in a row, and
    resends at the next one. Each such round is counted
    (``counters.resends_skipped``). Pull repairs (FINAL's, not the
    prototype's) always resend.
    """

    __slots__ = (
        # which stream: owner engine, PUSH/PULL, part, destination, round, header flags
        "eng", "kind", "part", "peer", "round", "flags",
        # the payload and its chunking (``rows``: the full chunks as rows, for batched sends)
        "data", "raw", "rows", "nbytes", "chunk_bytes", "count", "bound_ppm",
        # the current pass: chunk order, what is left to send, where we are
        "order", "queue", "pos", "state", "passes", "sent_at",
        # what the receiver holds (its last bitmap) and, in repair, what must arrive
        "held", "required",
        # probing: ids, their send times (RTT samples), the probe timer and its backoff,
        # the peer's loss estimate before this wait's first timeout (undone if it was late)
        "probe_id", "probe_first", "probe_times", "next_probe_t", "backoff", "loss_undo",
        # the no-progress rule: the bitmap the last resend was made from, the probe
        # rounds skipped since, and whether the pending probe timer is such a round's
        "resent_from", "skipped", "reprobe",
        # accounting for RoundStats
        "chunks_sent", "retransmitted", "probes", "t_done",
        # the header of this pass's batches, by the copies it asks for (``send_batch``)
        "_template",
    )

    def __init__(self, eng: TransferLink, kind: int, part: int, peer: int, data: np.ndarray,
                 bound_ppm: int, flags: int = 0):
        self.eng, self.kind, self.part, self.peer = eng, kind, part, peer
        self.round = eng.round
        data = np.ascontiguousarray(data, dtype="<f4")
        self.data = data
        self.raw = data.view(np.uint8).data
        self.nbytes = data.nbytes
        self.chunk_bytes = eng.chunk_bytes
        self.count = max(1, -(-self.nbytes // self.chunk_bytes))
        if self.count > wire.MAX_PART_CHUNKS:
            raise TransportError(f"stream of {self.count} chunks exceeds MAX_PART_CHUNKS")
        full = self.nbytes // self.chunk_bytes
        self.rows = data.view(np.uint8)[:full * self.chunk_bytes].reshape(full, self.chunk_bytes)
        self.bound_ppm = bound_ppm
        self.flags = flags | (Flag.PULL if kind == PULL else 0)
        self.order = stream_order(eng.session, self.round, kind, part, eng.rank, self.count,
                                  eng.chunk_order)
        self.queue = self.order
        self.pos = 0
        self.state = SENDING
        self.passes = 1
        self.chunks_sent = 0
        self.retransmitted = 0
        self.probes = 0
        self.held: np.ndarray | None = None  # receiver's bitmap at STOP (or last BITMAP)
        self.required: np.ndarray | None = None  # repair mode: chunks that must arrive
        self.t_done: float | None = None
        self._template: tuple[tuple[int, int] | None, bytes] = (None, b"")
        self.probe_id = 0
        self.probe_first = 1
        self.probe_times: dict[int, float] = {}
        self.next_probe_t = math.inf
        self.backoff = 1.0
        self.loss_undo: float | None = None
        self.resent_from: np.ndarray | None = None
        self.skipped = 0
        self.reprobe = False
        self.sent_at = np.full(self.count, math.inf)  # when each chunk last left (loss samples)
        if self.nbytes == 0:
            self.state = DONE
            self.held = np.ones(self.count, bool)

    # -- sending ---------------------------------------------------------------
    def has_pending(self) -> bool:
        return self.state == SENDING and self.pos < len(self.queue)

    def pending(self) -> int:
        """Chunks of the pass still to send."""
        return len(self.queue) - self.pos if self.state == SENDING else 0

    def send_next(self, now: float) -> int:
        """Send the next chunk of the pass; returns bytes sent (0 if socket full)."""
        c = int(self.queue[self.pos])
        start = c * self.chunk_bytes
        end = min(start + self.chunk_bytes, self.nbytes)
        eng = self.eng
        hdr = wire.pack_header(_DATA, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=c, count=self.count, length=end - start,
                               bound=self.bound_ppm, aux=self.passes, flags=self.flags,
                               copies=eng.copies(self.peer))
        n = eng.send_data(hdr, self.raw[start:end], self.peer)
        if n == 0:
            return 0
        self._sent(self.queue[self.pos:self.pos + 1], now)
        return n

    def send_batch(self, now: float, k: int) -> int:
        """Send up to ``k`` chunks of the pass in one call; returns datagrams sent (0: none).

        Fewer than ``k`` leave when the socket buffer fills part way; the rest
        stay the pass's next.

        Every datagram is the one ``send_next`` would send (same header, payload,
        tag), and the accounting is per datagram as there. A batch holds full
        chunks only: the stream's last chunk, when shorter, leaves alone through
        ``send_next`` (one GSO send cuts every segment to one size).
        """
        batch = self.queue[self.pos:self.pos + k]
        if len(self.rows) < self.count:  # the last chunk is short
            short = np.flatnonzero(batch == self.count - 1)
            if len(short):
                batch = batch[:max(1, int(short[0]))]
        if len(batch) == 1:
            return 1 if self.send_next(now) else 0
        eng = self.eng
        key = (self.passes, eng.copies(self.peer))
        if self._template[0] != key:
            self._template = (key, wire.pack_header(
                _DATA, src=eng.rank, part=self.part, session=eng.session, round=self.round,
                index=0, count=self.count, length=self.chunk_bytes, bound=self.bound_ppm,
                aux=self.passes, flags=self.flags, copies=key[1]))
        template = self._template[1]
        n = eng.send_data_batch(template, batch, self.rows, self.peer)
        if n:
            self._sent(batch[:n], now)
        return n

    def _sent(self, chunks: np.ndarray, now: float) -> None:
        """Account ``chunks`` (the next ones of the pass) as sent; PROBE after the pass."""
        self.sent_at[chunks] = now
        self.pos += len(chunks)
        self.chunks_sent += len(chunks)
        if self.passes > 1:
            self.retransmitted += len(chunks)
        if self.pos >= len(self.queue):
            self.state = PROBING
            self.probe_first = self.probe_id + 1
            self.backoff = 1.0
            self._send_probe(now)

    def _send_probe(self, now: float) -> None:
        eng = self.eng
        now = time.monotonic()  # the loop's ``now`` may predate a batch of sends
        self.reprobe = False
        self.probe_id += 1
        self.probe_times[self.probe_id] = now
        copies = eng.copies(self.peer)
        msg = wire.pack_header(MsgType.PROBE, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=self.probe_id, count=self.count,
                               bound=self.bound_ppm, flags=self.flags, copies=copies)
        eng.send_ctrl(self.peer, msg, copies)
        self.probes += 1
        self.next_probe_t = now + eng.probe_timeout(self.peer, self.backoff)

    def on_timer(self, now: float) -> float:
        if self.state != PROBING:
            return math.inf
        if now >= self.next_probe_t and self.reprobe:
            # A probe round the no-progress rule skipped: probe again, no loss shown.
            self._send_probe(now)
        elif now >= self.next_probe_t:
            # No reply: the probe or its answer was lost. Treat it as evidence of loss so
            # the next probe (and the peer's reply) go out with more copies, until an
            # answer shows it was only late (``on_reply``).
            if self.loss_undo is None:
                self.loss_undo = self.eng.peers.loss.get(self.peer, 0.0)
            self.eng.peers.loss_timeout(self.peer)
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
        self._late_probes(h, now)
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
                self.eng.peers.loss_sample(self.peer, float(np.count_nonzero(~held[last])) / len(last))
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
        if self._no_progress(held, now):
            return
        self.queue = self.order[missing[self.order]]
        self.pos = 0
        self.passes += 1
        self.state = SENDING

    def _no_progress(self, held: np.ndarray, now: float) -> bool:
        """Whether the no-progress rule skips this resend (class docstring); it then re-probes.

        Replies to the probe just answered (its other copies) no longer answer:
        the next probe's id is the first that does.
        """
        rule = self.eng.no_progress_probes
        if not rule or self.required is not None:
            return False
        if self.resent_from is not None and self.skipped < rule \
                and np.array_equal(held, self.resent_from):
            self.skipped += 1
            self.eng.counters.resends_skipped += 1
            self.probe_first = self.probe_id + 1
            self.reprobe = True
            self.next_probe_t = now + self.eng.reprobe_wait(self.peer)
            return True
        self.resent_from = held
        self.skipped = 0
        return False

    def _late_probes(self, h: wire.Header, now: float) -> None:
        """What an answer says of the probes out: an RTT sample, and whether timeouts were late.

        A reply names the probe it answers (ids are unique: the sample is
        unambiguous). A STOP sent unasked (id 0) while we probe was sent when the
        last chunk of the pass arrived, which left before the first probe: the
        time since that probe is a lower bound of the round trip the probe
        needed. Without that sample a loss-free round never measures its RTT
        (its STOP always comes first), and on a fast link whose receiver queues
        tens of milliseconds the RTO stays the idle link's 2 ms: every wait for
        a reply timed out several times, each timeout raised the loss estimate,
        and probes and replies went out 16 times over (about 850 control
        datagrams per 64 MiB round at 10 Gbit/s, each through the Python path).
        Either answer, unless it is to the newest probe, also shows that the
        timeouts were late answers, not losses (Eifel, RFC 3522): the estimate
        goes back to what it was before them. An answer to a probe of an earlier
        wait shows nothing about this one's.
        """
        sent_at = self.probe_times.get(h.index)
        if sent_at is not None and h.index >= self.probe_first:
            self.eng.peers.rtt_sample(self.peer, now - sent_at)
            self.probe_times.clear()
        elif h.type == MsgType.STOP and h.index == 0 and self.state == PROBING:
            waited = [t for i, t in self.probe_times.items() if i >= self.probe_first]
            if waited:
                self.eng.peers.rtt_sample(self.peer, now - min(waited))
                self.probe_times.clear()
        late = (h.type == MsgType.STOP and h.index == 0) or \
            self.probe_first <= h.index < self.probe_id  # an answer from this wait, not its last
        if self.loss_undo is not None and late and self.state == PROBING:
            self.eng.peers.undo_loss_timeouts(self.peer, self.loss_undo)
        if self.state == PROBING:
            self.loss_undo = None

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
            self.eng.peers.loss_sample(self.peer, float(np.count_nonzero(~held[sent])) / len(sent))

    def _finish(self) -> None:
        self.t_done = time.monotonic()
        self.state = DONE
        self.next_probe_t = math.inf
        self.eng.sender_done(self)

    @property
    def held_mask(self) -> np.ndarray:
        """The receiver's last bitmap (its STOP's once DONE); nothing known counts as lacking."""
        return self.held if self.held is not None else np.zeros(self.count, bool)

    def overtaken(self, taken: np.ndarray) -> None:
        """The owner's FINAL for this part arrived, saying which chunks it ``taken``.

        The aggregate is fixed, so a STOP still missing is moot: waiting for it
        would need the owner to answer probes, and the owner may already have
        returned to its caller (that wait is how a round used to hang until its
        deadline). The FINAL's bitmap is the STOP's, so error feedback stays exact.
        """
        if self.state == DONE:
            return
        self.held = taken
        self._finish()

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

    __slots__ = (
        # which stream: owner engine, PUSH/PULL, part, source, round, header flags
        "eng", "kind", "part", "peer", "round", "flags",
        # where chunks land: accumulate (aggregator) or copy (replica), in chunks of how many
        # bytes; ``out_rows``: the full chunks as rows (float32 to add, bytes to copy), for batches
        "out", "out_u8", "out_rows", "nbytes", "chunk_bytes", "count", "add", "freeze",
        # the bound (ours, never a datagram's) and how many chunks it lets go missing
        "bound_ppm", "allowed",
        # what arrived
        "have", "n_have", "max_pass", "t_first",
        # STOP and its repeats, probe replies
        "stopped", "t_stop", "last_stop_t", "last_probe",
        # FINAL (pull streams): the zero-filled set, next bound and phase, the part's
        # norm figures, last id acked
        "final", "final_next_bound", "final_flags", "final_figures", "last_final",
    )

    def __init__(self, eng: TransferLink, kind: int, part: int, peer: int, out: np.ndarray,
                 bound_ppm: int, *, add: bool, freeze: bool):
        self.eng, self.kind, self.part, self.peer = eng, kind, part, peer
        self.round = eng.round
        self.out = out
        self.nbytes = out.nbytes
        self.out_u8 = out.view(np.uint8).data if not add else None
        self.chunk_bytes = eng.chunk_bytes
        self.count = max(1, -(-self.nbytes // self.chunk_bytes))
        full = self.nbytes // self.chunk_bytes
        cb = self.chunk_bytes
        self.out_rows = (out[:full * (cb // 4)].reshape(full, cb // 4) if add
                         else out.view(np.uint8)[:full * cb].reshape(full, cb))
        self.add = add
        self.freeze = freeze
        self.bound_ppm = bound_ppm
        self.allowed = wire.allowed_missing(self.count, bound_ppm)
        self.have = np.zeros(self.count, bool)
        self.n_have = 0
        self.max_pass = 0
        # monotonic times, for latency breakdowns
        self.t_first: float | None = None
        self.t_stop: float | None = None
        self.stopped = False
        self.final: np.ndarray | None = None
        self.last_stop_t = -math.inf
        self.last_probe = 0  # highest probe id answered: copies of one probe get one reply
        self.last_final = 0  # highest FINAL transmission id acknowledged
        self.final_next_bound = 0
        self.final_flags = 0
        self.final_figures: tuple[float, int] = (math.nan, 0)
        self.flags = Flag.PULL if kind == PULL else 0
        if self.nbytes == 0:
            self.have[:] = True
            self.n_have = self.count
            self.stopped = True

    def _reply(self, type_: int, copies: int, probe_id: int = 0) -> None:
        eng = self.eng
        msg = wire.pack_header(type_, src=eng.rank, part=self.part, session=eng.session,
                               round=self.round, index=probe_id, count=self.count,
                               length=(self.count + 7) // 8, bound=self.bound_ppm,
                               flags=self.flags, copies=copies) + pack_bitmap(self.have)
        eng.send_ctrl(self.peer, msg, eng.reply_copies(self.peer, copies))

    def on_data(self, h: wire.Header, buf, n: int, now: float) -> None:
        c = h.index
        start = c * self.chunk_bytes
        if h.count != self.count or h.length != min(self.chunk_bytes, self.nbytes - start):
            self.eng.counters.malformed += 1
            return
        if (self.stopped and self.freeze) or self.final is not None:
            self.eng.counters.late += 1
            self._repeat_stop(h.copies, now)
            return
        if self.have[c]:
            self.eng.counters.duplicates += 1
            if self.stopped:
                self._repeat_stop(h.copies, now)
            return
        if self.out_u8 is None:  # accumulate
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
        if not self.stopped and self.count - self.n_have <= self.allowed:
            self._send_stop(h.copies, now)

    def _send_stop(self, copies: int, now: float) -> None:
        self.stopped = True
        self.last_stop_t = self.t_stop = now
        self._reply(MsgType.STOP, copies)
        self.eng.progress = True

    def on_data_batch(self, h: np.ndarray, data: np.ndarray, rows: np.ndarray,
                      now: float) -> None:
        """``on_data`` for a run of this stream's DATA datagrams (``dblp.batch.deliver``).

        ``h``: their headers (``batch.HEADER_DTYPE``, already valid DATA of this round
        and stream), ``data[rows]``: the datagrams. The outcome is the one of calling
        ``on_data`` per datagram in order: the same chunks applied bit for bit, the
        same counters, the STOP sent at the same datagram with the same bitmap (with
        ``freeze``, what follows it is late), a repeated STOP where one would be.
        """
        idx = h["index"].astype(np.int64)
        want = np.minimum(self.chunk_bytes, self.nbytes - idx * self.chunk_bytes)
        ok = (h["count"] == self.count) & (h["length"].astype(np.int64) == want)
        if not ok.all():
            self.eng.counters.malformed += len(ok) - int(np.count_nonzero(ok))
            h, idx, rows = h[ok], idx[ok], rows[ok]
            if not len(idx):
                return
        copies = h["copies"]
        if (self.stopped and self.freeze) or self.final is not None:
            self.eng.counters.late += len(idx)
            self._repeat_stop(int(copies[0]), now)
            return
        new = self._new_positions(idx)
        end, stop_at = len(idx), -1
        if not self.stopped and len(new) >= self.count - self.allowed - self.n_have:
            stop_at = int(new[self.count - self.allowed - self.n_have - 1])
            if self.freeze:  # frozen at the STOP: the rest of the run is late
                end = stop_at + 1
                self.eng.counters.late += len(idx) - end
                new = new[new < end]
        dup = np.ones(end, bool)
        dup[new] = False
        dups = np.flatnonzero(dup)
        self.eng.counters.duplicates += len(dups)
        # What a datagram sends, at its place in the run: the STOP, and a repeat of
        # it at the first duplicate while stopped (later ones fall within one RTT).
        marks = []
        if stop_at >= 0:
            marks.append((stop_at, -1))
        stopped_dups = dups if self.stopped else dups[dups > stop_at] if stop_at >= 0 else dups[:0]
        if len(stopped_dups):
            marks.append((int(stopped_dups[0]), int(copies[stopped_dups[0]])))
        done = 0
        for pos, repeat_copies in sorted(marks):
            upto = int(np.searchsorted(new, pos, side="right"))
            self._accept(h, idx, data, rows, new[done:upto], now)
            done = upto
            if repeat_copies < 0:
                self._send_stop(int(copies[pos]), now)
            else:
                self._repeat_stop(repeat_copies, now)
        self._accept(h, idx, data, rows, new[done:], now)

    def _new_positions(self, idx: np.ndarray) -> np.ndarray:
        """Positions in the run of the datagrams that bring a chunk we lack, in order.

        A chunk arriving twice in one run counts at its first arrival. The usual
        run (a pass: distinct chunks, none held) needs no sort by first arrival.
        """
        fresh = ~self.have[idx]
        if fresh.all():
            s = np.sort(idx)
            if (s[1:] != s[:-1]).all():
                return np.arange(len(idx))
        _, first = np.unique(idx, return_index=True)
        first.sort()
        return first[fresh[first]]

    def _accept(self, h: np.ndarray, idx: np.ndarray, data: np.ndarray, rows: np.ndarray,
                pos: np.ndarray, now: float) -> None:
        """Apply the chunks at run positions ``pos`` (each new to us) and mark them held."""
        if not len(pos):
            return
        cb = self.chunk_bytes
        c, r = idx[pos], rows[pos]
        whole = c < len(self.out_rows)  # a shorter last chunk has index len(out_rows)
        if not whole.all():  # the short last chunk: as ``on_data`` applies it
            (j,) = np.flatnonzero(~whole)
            self._apply_one(int(c[j]), data[r[j]], int(h["length"][pos[j]]))
            c, r = c[whole], r[whole]
        payload = data[r, HEADER_SIZE:HEADER_SIZE + cb]
        if self.out_u8 is None:  # accumulate (distinct chunks: no element twice)
            self.out_rows[c] += payload.view("<f4")
        else:
            self.out_rows[c] = payload
        if not self.n_have:
            self.t_first = now
        self.have[idx[pos]] = True
        self.n_have += len(pos)
        aux = int(h["aux"][pos].max())
        if aux > self.max_pass:
            self.max_pass = aux

    def _apply_one(self, c: int, row: np.ndarray, length: int) -> None:
        start = c * self.chunk_bytes
        if self.out_u8 is None:
            e0 = start // 4
            self.out[e0:e0 + length // 4] += row[HEADER_SIZE:HEADER_SIZE + length].view("<f4")
        else:
            self.out_u8[start:start + length] = row[HEADER_SIZE:HEADER_SIZE + length].data

    def _repeat_stop(self, copies: int, now: float) -> None:
        """The sender keeps sending: our STOP was lost; repeat it, once per RTT.

        Chunks already in flight when the sender got the STOP arrive for up to one
        RTT after it; repeating the STOP for each of them (times ``copies``) only
        floods the reverse path, so repeats wait at least a smoothed RTT.
        """
        if self.eng.control == "tcp" and self.peer in self.eng.peers.tcp:
            return  # TCP delivers the first STOP; repeats would only queue behind it
        if self.final is None and now - self.last_stop_t >= self.eng.peers.stop_repeat_interval(self.peer):
            self.last_stop_t = now
            self._reply(MsgType.STOP, copies)

    def on_probe(self, h: wire.Header, now: float) -> None:
        if h.count != self.count:
            self.eng.counters.malformed += 1
            return
        if h.index <= self.last_probe:
            # Another copy (or an older probe): its probe id was answered already, with
            # ``copies`` replies. Answering every copy again would send copies^2 replies.
            return
        # Our own loss estimate sizes our replies (a request cannot amplify), so feed it
        # what the data we received shows: the loss of the whole first pass. Repeated
        # probes are no evidence: anyone repeating requests could raise it at will.
        if self.last_probe == 0 and not self.stopped and self.max_pass == 1:
            self.eng.peers.loss_sample(self.peer, (self.count - self.n_have) / self.count)
        self.last_probe = h.index
        self._reply(MsgType.STOP if self.stopped else MsgType.BITMAP, h.copies, h.index)

    def on_final(self, h: wire.Header, payload) -> None:
        if h.count != self.count:
            self.eng.counters.malformed += 1
            return
        if self.final is None:
            nb = (self.count + 7) // 8
            dropped = unpack_bitmap(payload[:nb], self.count)
            # Zero-fill what every replica zero-fills; anything else we lack
            # (cannot happen with an honest aggregator) is zeroed and counted.
            zero = dropped | ~self.have
            if (~self.have & ~dropped).any():
                self.eng.counters.malformed += 1
            if zero.any():
                self.out[np.repeat(zero, self.chunk_bytes // 4)[:self.out.size]] = 0
            self.final = dropped
            self.final_next_bound = h.aux
            self.final_flags = h.flags
            sumsq, kept = wire.FINAL_NORM.unpack_from(payload, 2 * nb)
            if not (math.isfinite(sumsq) and sumsq >= 0 and kept <= self.nbytes // 4):
                # (cannot come from an honest owner) a NaN norm: the policy skips the round
                self.eng.counters.malformed += 1
                sumsq, kept = math.nan, 0
            self.final_figures = (sumsq, kept)
            self.eng.progress = True
            push = self.eng.senders.get((PUSH, self.part, self.peer))
            if push is not None:
                push.overtaken(unpack_bitmap(payload[nb:2 * nb], self.count))
        if h.index and h.index <= self.last_final:
            return  # another copy of a FINAL transmission we acknowledged already
        self.last_final = h.index
        eng = self.eng
        done = wire.pack_header(MsgType.DONE, src=eng.rank, part=self.part, session=eng.session,
                                round=h.round, flags=self.flags, copies=h.copies)
        eng.send_ctrl(self.peer, done, eng.reply_copies(self.peer, h.copies))

    def describe(self) -> str:
        what = "pull" if self.kind == PULL else "push"
        return (f"{what} part {self.part} from rank {self.peer}: {self.n_have}/{self.count} chunks"
                f" (may miss {self.allowed}), {'stopped' if self.stopped else 'receiving'}"
                + (", waiting for FINAL" if self.kind == PULL and self.final is None else ""))


