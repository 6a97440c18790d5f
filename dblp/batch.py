"""Batched datagram I/O: many DATA datagrams per system call and per Python call.

One ``sendmsg`` per datagram and one ``recvfrom_into`` plus a header parse per
datagram cap a Python sender or receiver at about 1 Gbit/s; above that the
transport is CPU-bound while kernel TCP is not. This module moves the data
path in batches and leaves the protocol alone: every datagram on the wire is
byte for byte the one the per-datagram path sends (``tests/unit/test_dblp_batch.py``).

Sending (``SendBatch``): up to ``batch_limit`` full chunks of one stream leave
in one call, as GSO messages of up to ``GSO_MAX_SEGMENTS`` datagrams, each with
a ``UDP_SEGMENT`` control message (UDP GSO: the kernel
cuts the buffer into datagrams of one size after the qdisc, so the shaper
still sees, and counts, every segment's bytes). The headers are one template
broadcast over the rows with the ``index`` column filled per row; payload rows
are gathered from the tensor with one numpy copy (an iovec per payload would
cost a Python object per datagram; the C core, which pays no such cost, hands
the kernel the tensor's rows themselves); with a job secret each row still gets
its own MAC tag.

Receiving (``RecvRing``): ``recvmmsg`` (ctypes) fills a preallocated ring of
datagram slots; ``data_rows`` checks every header field ``wire.unpack_header``
checks for DATA, for all rows at once, so the engine can hand runs of plain
DATA datagrams of one stream to ``InTransfer.on_data_batch`` and everything
else, one by one, to the per-datagram ``Engine.handle``. Where the C core is
built the socket also asks for UDP receive offload (``UDP_GRO``): a NIC or
veth that coalesces then hands over a run of one sender's datagrams as one
message, which the core cuts back into the same datagrams before anything
looks at them (``NATIVE.recv_gro``), so every check sees what it saw before.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct
from typing import TYPE_CHECKING

import numpy as np

from . import wire
from .wire import HEADER_SIZE, PPM, TAG_SIZE, MsgType

if TYPE_CHECKING:
    from .link import ReceiveLink

#: Linux's <netinet/udp.h>: Python's socket module does not export it.
UDP_SEGMENT = 103
#: Segments per GSO send: 44 full datagrams of 1472 bytes fill one 64 KB IP packet.
GSO_MAX_SEGMENTS = 44
#: GSO messages the C core sends in one ``sendmmsg`` (one Python call): at 10 Gbit/s
#: the engine's loop then runs once per 352 datagrams instead of once per 44 (the
#: pacing's half millisecond holds 412). Eight rather than four: a keyed sharded
#: round at 10 Gbit/s took 1.08-1.09x its unkeyed twin's against 1.11-1.16x (four
#: alternated bench runs of each), the unkeyed round the same. The Python between
#: two sends runs half as often, and in a keyed rank it then took up to twice as long
#: as in an unkeyed one for the same work: the core tagged all eight messages before
#: it sent any, which passed 500 KB of payload through the cache first. It now sends
#: a keyed message as soon as it is tagged (``send_gso`` in ``_fastpath.c``).
GSO_MESSAGES = 8
#: A batch is at most this much of the pacing rate's time: at 100 Mbit/s a few
#: datagrams (what one token-bucket wake-up sends anyway), at 10 Gbit/s 44.
BATCH_SECONDS = 0.0005
#: ...but at least this many datagrams. Below ~100 Mbit/s half a millisecond is
#: under one datagram, and a loop that wakes for every datagram it sends, and
#: for every one it receives, spends its CPU per wake-up, not per byte: a
#: sharded rank paced at 19 Mbit/s (3 ranks, 1.78 MB, keyed, loopback, idle
#: machine, three alternated pairs) used 0.30-0.32 CPU seconds per 1.064 s round
#: with batches of one and 0.13 with batches of four and receive coalescing,
#: the round 1.072 s (+0.8 %). The fabric's 20 Mbit/s links queue 100 packets;
#: a batch of four is 2.4 ms of such a link.
MIN_BATCH = 4
#: After a read that drained the socket with a few datagrams, a batched engine
#: lets this long pass before it reads again (``Engine.run_until``): a batch's
#: worth of the sender's pacing, as its sends leave in batches of that length
#: (at least; ``coalesce_seconds`` gives a paced engine its own batch's time).
COALESCE_SECONDS = BATCH_SECONDS


#: ...and at most this: a receiver that only waits (a pull) sleeps this long
#: between reads, so the round's last datagram may wait as long before it is
#: read. A parameter-server worker paces at 1/N of the server's rate, and one
#: batch of its own rate (10 ms at 4.75 Mbit/s) would delay its pull's end by
#: up to that; 2.5 ms is about one batch of a 19 Mbit/s sender.
COALESCE_MAX_SECONDS = 0.0025


def coalesce_seconds(rate_bps: float | None, batch_max: int, wire_bytes: int) -> float:
    """How long a batched engine lets arrivals gather: one batch at its pacing rate.

    Peers pace as it does (sharded: one job, one config), so their batches
    arrive about that far apart: waking sooner reads a part of one.
    Between COALESCE_SECONDS and COALESCE_MAX_SECONDS.
    """
    if rate_bps is None:
        return COALESCE_SECONDS
    return min(COALESCE_MAX_SECONDS,
               max(COALESCE_SECONDS, batch_max * wire_bytes * 8 / rate_bps))
#: Receive buffer of a batched engine (bytes; root may exceed rmem_max). A GSO
#: sender can outpace a Python receiver on the same small machine for a while; a
#: deeper buffer turns that into queueing instead of loss, which would cost a
#: resend pass and probe timeouts. It is a limit, not an allocation.
RECV_BUFFER = 32 << 20
#: errno values that mean "this socket or path cannot do GSO": fall back for good.
GSO_REFUSED = frozenset({errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT,
                         errno.EMSGSIZE, errno.ENOTSUP})
_SEGMENT = struct.Struct("=H")
_DATA = int(MsgType.DATA)
_INDEX_OFF = wire.FIELD_OFFSETS["index"][0]
_SEQ_OFF = wire.SEQ_OFFSET
_SESSION = wire.FIELD_OFFSETS["session"][0]
_SRC = wire.FIELD_OFFSETS["src"][0]


def _pair_of(header: bytes, dst: int) -> tuple[int, int, int]:
    """(session, sender, ``dst``): the pair key a message with ``header`` is sealed under."""
    return (int.from_bytes(header[_SESSION:_SESSION + 8], "big"),
            int.from_bytes(header[_SRC:_SRC + 2], "big"), dst)


def _load_native():
    """``dblp._fastpath`` (C, built by the install where a compiler is), told the header layout.

    None where it was not built: the pure-Python path below does the same work
    (``tests/unit/test_dblp_batch.py`` runs both and compares them bit for bit).
    """
    try:
        from . import _fastpath  # type: ignore[attr-defined]
    except ImportError:
        return None
    off = {name: wire.FIELD_OFFSETS[name][0] for name in wire.FIELD_NAMES}
    _fastpath.set_layout((HEADER_SIZE, TAG_SIZE, off["flags"], off["src"], off["part"],
                          off["index"], off["count"], off["length"], off["bound"], off["aux"],
                          off["seq"], PPM, int(wire.Flag.PULL), *_FIXED_SPANS[0],
                          *_FIXED_SPANS[1], 0xDB1B))
    return _fastpath


#: The header as a numpy record, generated from ``wire.HEADER_FIELDS`` (its one declaration).
_NP_CODES = {"B": "u1", "H": ">u2", "I": ">u4", "Q": ">u8"}
HEADER_DTYPE = np.dtype({
    "names": list(wire.FIELD_NAMES),
    "formats": [_NP_CODES[code] for _, code, _ in wire.HEADER_FIELDS],
    "offsets": [wire.FIELD_OFFSETS[name][0] for name in wire.FIELD_NAMES],
    "itemsize": HEADER_SIZE,
})


def batch_limit(rate_bps: float | None, datagram: int, wire_bytes: int,
                messages: int = 1) -> int:
    """Datagrams one send may carry: ``BATCH_SECONDS`` of the pacing rate (at least
    ``MIN_BATCH``), 1 to 44 per message.

    Datagrams larger than one MTU (the prototype's IP-fragmented chunks) cannot be
    GSO segments: 1. Unpaced: the most ``messages`` 64 KB GSO packets hold.
    """
    if datagram > wire.MAX_DATAGRAM:
        return 1
    top = messages * per_message(datagram)
    if rate_bps is None:
        return top
    return min(top, max(MIN_BATCH, int(rate_bps * BATCH_SECONDS / (8 * wire_bytes))))


def per_message(datagram: int) -> int:
    """Datagrams of ``datagram`` bytes one GSO message (one 64 KB IP packet) may carry."""
    return max(1, min(GSO_MAX_SEGMENTS, wire.MAX_UDP_PAYLOAD // datagram))


class SendBatch:
    """The buffer of one GSO send: ``k`` rows of header + payload + tag, reused every call."""

    __slots__ = ("buf", "chunk_bytes", "datagram", "index", "seq", "_template", "_sockaddrs")

    def __init__(self, rows: int, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self.datagram = wire.datagram_size(chunk_bytes)
        self.buf = np.zeros((rows, self.datagram), np.uint8)  # tags stay zero without a key
        #: The ``index`` field of every row, as one big-endian column of the buffer.
        self.index = self.buf[:, _INDEX_OFF:_INDEX_OFF + 4].view(">u4")[:, 0]
        #: The ``seq`` field of every row (the MAC's nonce: numbered per send with a key).
        self.seq = self.buf[:, _SEQ_OFF:_SEQ_OFF + 8].view(">u8")[:, 0]
        #: The header last written to every row (with ``index`` 0): a stream's turn
        #: sends many batches under one header, which then need only their indexes.
        self._template = b""
        self._sockaddrs: dict[tuple, bytes | None] = {}

    def send(self, sock: socket.socket, template: bytes, chunks: np.ndarray,
             payload_rows: np.ndarray, sealer: wire.Sealer, addr, dst: int) -> int:
        """GSO sends of ``chunks`` to rank ``dst`` at ``addr``: the datagrams that left (the
        first of them).

        Where the C core is built (with libcrypto for a job with a secret: it
        then numbers and tags each row, ``native_mac``), the core builds the rows
        and sends them (``NATIVE.send_gso``: the same bytes); else ``fill`` and
        ``sendmsg`` here, a GSO message at a time. An error stops the send after
        whole messages, which it counts; before the first, it raises as ``sendmsg``
        would (a full socket buffer: BlockingIOError).
        """
        per = per_message(self.datagram)
        mac = native_mac(sealer, *_pair_of(template, dst))
        raw = self._sockaddr(addr) if NATIVE is not None and (sealer.key is None or mac) \
            else None
        if raw is not None and payload_rows.flags.c_contiguous:
            self._template = b""  # the core wrote its own headers (and tags) into the rows
            n = NATIVE.send_gso(sock.fileno(), self.buf, template, _INDEX_OFF, payload_rows,
                                np.ascontiguousarray(chunks, np.int64), raw, TAG_SIZE, per,
                                mac, sealer.take_seq(len(chunks)))
            if n < 0:
                raise OSError(-n, os.strerror(-n))  # EAGAIN: BlockingIOError, as sendmsg's
            return n
        buf = self.fill(template, chunks, payload_rows, sealer, dst)
        step = per * self.datagram
        for sent, lo in enumerate(range(0, len(buf), step)):
            try:
                sock.sendmsg([buf[lo:lo + step]], self.segment_cmsg(self.datagram), 0, addr)
            except OSError:
                if not sent:
                    raise
                return sent * per  # the messages that left, as the C core counts them
        return len(chunks)

    def _sockaddr(self, addr) -> bytes | None:
        """``addr`` as the ``struct sockaddr_in`` the kernel takes, if it is a dotted quad."""
        try:
            return self._sockaddrs[addr]
        except KeyError:
            raw = port_and_ip(addr)
            self._sockaddrs[addr] = None if raw is None else \
                struct.pack("=H", socket.AF_INET) + raw + bytes(8)
            return self._sockaddrs[addr]

    def fill(self, template: bytes, chunks: np.ndarray, payload_rows: np.ndarray,
             sealer: wire.Sealer, dst: int) -> memoryview:
        """Rows for ``chunks`` (full chunks only) under header ``template``, tagged for rank
        ``dst``; the bytes to send."""
        k = len(chunks)
        b = self.buf[:k]
        end = HEADER_SIZE + self.chunk_bytes
        if template != self._template:
            self.buf[:, :HEADER_SIZE] = np.frombuffer(template, np.uint8)
            self._template = template
        self.index[:k] = chunks
        b[:, HEADER_SIZE:end] = payload_rows[chunks]
        if sealer.key is not None:
            self.seq[:k] = sealer.take_seq(k) + np.arange(k, dtype=np.uint64)
            for i in range(k):
                b[i, end:] = np.frombuffer(sealer.tag(dst, b[i, :end]), np.uint8)
        return b.data.cast("B")

    @staticmethod
    def segment_cmsg(datagram: int) -> list[tuple[int, int, bytes]]:
        """The ``UDP_SEGMENT`` control message that cuts a send into ``datagram``-byte datagrams."""
        return [(socket.IPPROTO_UDP, UDP_SEGMENT, _SEGMENT.pack(datagram))]


# -- receiving ---------------------------------------------------------------------------
_PTR = ctypes.c_size_t  # pointers as integers: numpy mirrors the layout without c_void_p


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", _PTR), ("namelen", ctypes.c_uint32), ("iov", _PTR),
                ("iovlen", ctypes.c_size_t), ("control", _PTR), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


def _np_layout(struct_type) -> np.dtype:
    """The numpy record of a ctypes structure of integers (ctypes computed the padding)."""
    names, formats, offsets = [], [], []
    for name, ctype in struct_type._fields_:
        names.append(name)
        formats.append(_np_layout(ctype) if issubclass(ctype, ctypes.Structure)
                       else np.dtype(f"u{ctypes.sizeof(ctype)}"))
        offsets.append(getattr(struct_type, name).offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ctypes.sizeof(struct_type)})


_MMSG_DTYPE = _np_layout(_MMsgHdr)
_IOVEC_DTYPE = np.dtype([("base", np.uintp), ("len", np.uintp)])
_SOCKADDR_IN = 16
_MSG_DONTWAIT = 0x40
#: UDP receive offload (Linux 5.0): with it on, a socket may be handed a run of one
#: sender's equal-sized datagrams as ONE message with their size beside it (GRO on
#: a real NIC, a veth in NAPI mode, and loopback coalesce; a plain veth does not).
UDP_GRO = 104
#: Messages one read may take with it on, each into its own 64 KB (``NATIVE.recv_gro``
#: asks for fewer when they come coalesced: as many as the ring has slots for).
GRO_MESSAGES = 64
GRO_BUFFER = 65536


def _load_recvmmsg():
    """libc's ``recvmmsg`` (Linux), or None where there is none: the per-datagram path stays."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.recvmmsg
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_recvmmsg = _load_recvmmsg()


class RecvRing:
    """``slots`` datagram buffers that one ``recvmmsg`` call fills, with their sizes and senders.

    A slot holds one byte more than the longest datagram the engine accepts
    (``largest``, from ``wire.largest_datagram``): a longer one arrives cut to
    ``largest + 1`` bytes and is refused by the size check that refuses it
    whole on the per-datagram path, which reads into 64 KB. Slots are that
    small on purpose: the 128 slots of a ring of MTU-sized datagrams then take
    200 KB, which stays in cache while the core adds them up, where 64 KB slots
    made a ring of 8.5 MB (sharded at 10 Gbit/s, alternated A/B: faster or
    equal in 5 pairs of 6; at 3 Gbit/s within the noise).
    """

    __slots__ = ("data", "names", "lens", "mmsg", "iov", "slots", "slot", "stride", "_fd",
                 # receive offload: on or not, the core that reads, its messages not yet cut
                 "gro", "_core", "bounce", "bnames", "blens", "bsegs", "bstate",
                 # caches: the fixed header bytes of a round, the senders' addresses by rank
                 "_fixed", "_peers", "_pinned")

    def __init__(self, sock: socket.socket, slots: int = 128,
                 largest: int = wire.MAX_UDP_PAYLOAD, gro: bool = True):
        self.slots = slots
        self.slot = largest + 1
        self.stride = -(-self.slot // 64) * 64  # rows start on cache lines
        self._fd = sock.fileno()
        self.data = np.zeros((slots, self.stride), np.uint8)
        self.names = np.zeros((slots, _SOCKADDR_IN), np.uint8)
        self.lens = np.zeros(slots, np.int64)
        self.iov = np.zeros(slots, _IOVEC_DTYPE)
        self.iov["base"] = self.data.ctypes.data + np.arange(slots) * self.stride
        self.iov["len"] = self.slot
        self.mmsg = np.zeros(slots, _MMSG_DTYPE)
        hdr = self.mmsg["hdr"]
        hdr["name"] = self.names.ctypes.data + np.arange(slots) * _SOCKADDR_IN
        hdr["iov"] = self.iov.ctypes.data + np.arange(slots) * _IOVEC_DTYPE.itemsize
        hdr["iovlen"] = 1
        # Receive offload only where the C core reads: it alone cuts a coalesced message
        # back into datagrams, and a socket that has it on must never be read otherwise.
        self._core = NATIVE
        self.gro = gro and NATIVE is not None and _enable_gro(sock)
        n = GRO_MESSAGES if self.gro else 0
        self.bounce = np.zeros((n, GRO_BUFFER), np.uint8)
        self.bnames = np.zeros((n, _SOCKADDR_IN), np.uint8)
        self.blens = np.zeros(n, np.int64)
        self.bsegs = np.zeros(n, np.int64)
        # messages held, the next one, the offset in it, drained, datagrams per message
        self.bstate = np.zeros(6, np.int64)  # [5]: datagrams dropped unread (blocked sources)
        self._fixed: tuple[tuple[int, int], np.ndarray] | None = None
        self._peers: tuple[tuple, np.ndarray, np.ndarray] | None = None
        self._pinned: dict[tuple, bytes | None] = {}

    @staticmethod
    def available() -> bool:
        return _recvmmsg is not None

    def receive(self, blocked: bytes = b"") -> int:
        """Datagrams read into slots ``0..m-1`` (0: none waiting, -1: an error to skip).

        Fewer than ``slots`` means nothing more is waiting; a full ring may leave
        coalesced datagrams behind for the next call (``held``). ``blocked``:
        sources (``blocked_keys``) whose coalesced messages the core drops unread,
        counted in ``take_dropped``; other paths leave them to ``deliver``.
        """
        if self.gro:
            extra = (blocked,) if blocked else ()
            m = self._core.recv_gro(self._fd, self.data, self.stride, self.slot, self.names,
                                    self.lens, self.slots, self.bounce, GRO_BUFFER, self.bnames,
                                    self.blens, self.bsegs, self.bstate, *extra)
        elif NATIVE is not None:
            m = NATIVE.recv_ring(self._fd, self.data, self.stride, self.slot, self.names,
                                 self.lens, self.slots)
        else:
            assert _recvmmsg is not None
            self.mmsg["hdr"]["namelen"] = _SOCKADDR_IN
            m = _recvmmsg(self._fd, self.mmsg.ctypes.data, self.slots, _MSG_DONTWAIT, None)
            if m < 0:
                m = -ctypes.get_errno()
            else:
                self.lens[:m] = self.mmsg["len"][:m]
        if m < 0:  # -errno
            return 0 if -m in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR) else -1
        return m

    def take_dropped(self) -> int:
        """Datagrams ``receive`` dropped unread since the last call (blocked sources)."""
        n = int(self.bstate[5])
        self.bstate[5] = 0
        return n

    def held(self) -> bool:
        """Whether datagrams already read from the socket wait here (the socket may be idle)."""
        return bool(self.gro and self.bstate[1] < self.bstate[0])

    def header_bytes(self, lo: int, m: int) -> np.ndarray:
        """The headers of slots ``lo..m-1`` as an (m - lo, 40) byte array (a copy)."""
        return np.ascontiguousarray(self.data[lo:m, :HEADER_SIZE])

    def fixed(self, session: int, round: int) -> np.ndarray:
        """``fixed_bytes(session, round)``, kept for the round."""
        if self._fixed is None or self._fixed[0] != (session, round):
            self._fixed = ((session, round), fixed_bytes(session, round))
        return self._fixed[1]

    def known_senders(self, lo: int, m: int, src: np.ndarray, peers: dict,
                      pinned: bool) -> np.ndarray:
        """Rows ``lo..m-1`` whose ``src`` is a rank in ``peers`` and, if ``pinned``, came from its address.

        ``Engine.handle``'s test of who speaks: without a secret the address
        pinned at join is the only proof (compared as ``recvfrom`` would give it).
        """
        key = tuple(peers.items())
        if self._peers is None or self._peers[0] != key:
            top = max((r for r in peers if isinstance(r, int) and 0 <= r < 1 << 16),
                      default=-1) + 1
            expect, known, where = np.zeros((top, 6), np.uint8), np.zeros(top, bool), \
                np.zeros(top, bool)
            for rank, addr in peers.items():
                if isinstance(rank, int) and 0 <= rank < top:
                    known[rank] = True
                    raw = port_and_ip(addr)
                    if raw is not None:
                        expect[rank], where[rank] = np.frombuffer(raw, np.uint8), True
            self._peers = (key, expect, np.stack([known, where]))
        _, expect, flags = self._peers
        top = len(expect)
        if not top:
            return np.zeros(m - lo, bool)
        inside = src < top
        s = np.where(inside, src, 0)
        if not pinned:
            return inside & flags[0][s]
        return inside & flags[1][s] & (self.names[lo:m, 2:8] == expect[s]).all(axis=1)

    def pinned_addr(self, rank: int, peers: dict) -> bytes | None:
        """The 6 bytes ``known_senders`` compares for ``rank`` (port, IPv4), if it has them."""
        addr = peers.get(rank)
        if addr is None:
            return None
        key = (rank, addr)
        raw = self._pinned.get(key, b"?")
        if raw == b"?":
            raw = self._pinned[key] = port_and_ip(addr)
        return raw

    def addr(self, i: int) -> tuple[str, int]:
        """The sender of slot ``i`` as ``recvfrom`` gives it."""
        n = self.names[i]
        return socket.inet_ntoa(n[4:8].tobytes()), int(n[2]) << 8 | int(n[3])

    def view(self, i: int) -> memoryview:
        """Slot ``i`` as the per-datagram path's buffer (a memoryview of bytes)."""
        return self.data[i, :self.slot].data


def _enable_gro(sock: socket.socket) -> bool:
    """Turn UDP receive offload on for ``sock``; False where the kernel refuses it."""
    try:
        sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def port_and_ip(addr) -> bytes | None:
    """The port and IPv4 address bytes of a ``sockaddr_in`` for ``addr``; None if none.

    Only a dotted quad that ``recvfrom`` would give back verbatim has them: the
    per-datagram path compares address tuples, and a peer pinned under another
    spelling must keep failing that comparison (its rows take that path).
    """
    try:
        raw = socket.inet_aton(addr[0])
        if socket.inet_ntoa(raw) != addr[0] or not 0 <= int(addr[1]) < 1 << 16:
            return None
        return struct.pack("!H", int(addr[1])) + raw
    except (OSError, TypeError, ValueError, IndexError, struct.error):
        return None


def _span(first: str, last: str) -> tuple[int, int]:
    """[start, stop) of the header bytes from field ``first`` through field ``last``."""
    start, _ = wire.FIELD_OFFSETS[first]
    off, size = wire.FIELD_OFFSETS[last]
    return start, off + size


#: Header bytes every DATA datagram of one round of one job shares, as two spans:
#: magic, version, type (0-3), and session, round (10-21). The C core gets the same spans.
_FIXED_SPANS = (_span("magic", "type"), _span("session", "round"))
_FIXED_COLS = np.r_[tuple(slice(a, b) for a, b in _FIXED_SPANS)]
#: Header bytes that name a stream with the PULL flag bit: src and part (6-9).
_STREAM_COLS = np.r_[slice(*_span("src", "part"))]


def fixed_bytes(session: int, round: int) -> np.ndarray:
    """The ``_FIXED_COLS`` bytes of a DATA header of ``session`` and ``round``."""
    return np.frombuffer(wire.pack_header(_DATA, session=session, round=round),
                         np.uint8)[_FIXED_COLS]


def data_rows(hb: np.ndarray, h: np.ndarray, lens: np.ndarray, chunk_bytes: int,
              fixed: np.ndarray) -> np.ndarray:
    """Rows ``wire.unpack_header`` accepts as DATA, of the round ``fixed`` names, at once.

    ``hb``: the headers as bytes, ``h``: the same as ``HEADER_DTYPE`` records.
    The same checks: magic, version, type (and session, round: ``fixed``), size
    (declared length == payload, whole float32s, more than none, at most one
    chunk, which also bounds the datagram), index < count, bound < 1. The MAC
    and who sent it are the engine's checks, as they are in ``Engine.handle``.
    """
    payload = lens - (HEADER_SIZE + TAG_SIZE)
    return ((hb[:, _FIXED_COLS] == fixed).all(axis=1) & (h["length"] == payload)
            & (payload > 0) & (payload <= chunk_bytes) & (payload % 4 == 0)
            & (h["index"] < h["count"]) & (h["bound"] < PPM))


def runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of equal consecutive ``keys``, in order."""
    if not len(keys):
        return []
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    edges = [0, *cut.tolist(), len(keys)]
    return list(zip(edges[:-1], edges[1:], strict=True))


#: The C core, or None: set by ``_load_native`` (tests switch it off to compare the paths).
NATIVE = _load_native()
#: ``take_run``'s address argument with a key (the tag proves the sender, not the address).


def _can_authenticate(core) -> bool:
    """Whether ``core`` computes and checks tags: built with libcrypto (it then has
    ``mac_new``) and its MAC library works here (``mac_new`` raises RuntimeError when
    it does not: an OpenSSL without AES-128, or libipsec-mb finding no code for this
    CPU). Asked once, at import."""
    if core is None or not hasattr(core, "mac_new"):
        return False
    try:
        core.mac_new(bytes(wire.PAIR_KEY_SIZE))
    except RuntimeError:
        return False
    return True


_NATIVE_AUTH = _can_authenticate(NATIVE)


def native_auth() -> bool:
    """Whether the C core in use (`NATIVE`: tests may switch it off) authenticates."""
    return NATIVE is not None and _NATIVE_AUTH


def native_mac(sealer: wire.Sealer, session: int, src: int, dst: int):
    """The C core's context for ``sealer``'s pair key of (``session``, ``src``, ``dst``)
    (made once per pair, for at most ``wire.MAX_PAIR_KEYS`` pairs), or None: no secret, or
    no authenticating C core (`native_auth`)."""
    if sealer.key is None or not native_auth():
        return None
    pair = (session, src, dst)
    mac = sealer.native.get(pair)
    if mac is None:
        mac = NATIVE.mac_new(sealer.pair_key(session, src, dst))
        if len(sealer.native) < wire.MAX_PAIR_KEYS:
            sealer.native[pair] = mac
    return mac


def batching_supported() -> bool:
    """Whether this platform has what the batched paths need (Linux: GSO and recvmmsg)."""
    return RecvRing.available() and os.name == "posix"


# -- dispatch: runs of DATA as arrays, everything else through Engine.handle ----------------
def _fast_rows(eng: ReceiveLink, ring: RecvRing, hb: np.ndarray, h: np.ndarray, lo: int, m: int,
               keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (of ``lo..m-1``) ``Engine.handle`` would pass straight to a receiver's ``on_data``,
    and the rows whose tags were checked here and failed.

    Its checks, for all rows: a valid header for DATA, this session, a known
    sender from its pinned address, this round, then the MAC (with a secret).
    A row failing any of them takes ``handle`` itself, except one whose tag
    failed here: it takes ``Engine.failed_tag``, so no datagram is verified
    twice (a forged one used to be, three times with the C core).
    """
    failed = np.zeros(m - lo, bool)
    if eng.round < 0:
        return failed.copy(), failed
    lens = ring.lens[lo:m]
    fast = keep & data_rows(hb, h, lens, eng.chunk_bytes, ring.fixed(eng.session, eng.round))
    fast &= ring.known_senders(lo, m, h["src"], eng.peers.addrs, pinned=True)
    if eng.sealer.key is not None:
        rows = np.flatnonzero(fast)
        ok = _tags_hold(eng, ring, lo + rows, h["src"][rows])
        fast[rows] = ok
        failed[rows[~ok]] = True
    return fast, failed


def _tags_hold(eng: ReceiveLink, ring: RecvRing, rows: np.ndarray, srcs: np.ndarray) -> np.ndarray:
    """Whether each of the ring's ``rows`` (DATA of this session from ``srcs``, known
    senders) ends in its right tag: the C core checks a sender's rows in one call
    (``mac_check``, what ``take_run`` costs per row), else ``Sealer.verify`` one by one."""
    ok = np.zeros(len(rows), bool)
    if not native_auth():
        for j, i in enumerate(rows):
            ok[j] = eng.sealer.verify(ring.view(int(i)), int(ring.lens[i]), eng.rank)
        return ok
    for src in np.unique(srcs):
        sel = srcs == src
        res = np.zeros(int(sel.sum()), np.uint8)
        NATIVE.mac_check(native_mac(eng.sealer, eng.session, int(src), eng.rank), ring.data,
                         ring.stride, ring.lens, np.ascontiguousarray(rows[sel], np.int64), res)
        ok[sel] = res.view(bool)
    return ok


def _name_keys(names: np.ndarray) -> np.ndarray:
    """``sockaddr_in`` rows (port and IPv4 at bytes 2-7) as one integer each."""
    wide = np.zeros((len(names), 8), np.uint8)
    wide[:, 2:] = names[:, 2:8]
    return wide.view(">u8").ravel()


def blocked_keys(eng: ReceiveLink, now: float) -> bytes:
    """The sources ``eng.bad`` blocks now, 6 bytes each (port and IPv4, as ``sockaddr_in``)."""
    bad = eng.bad
    for addr, until in list(bad.blocked.items()):
        if now >= until:
            bad.is_blocked(addr, now)  # expires it
    if bad.keys is None:
        bad.keys = b"".join(r for r in (port_and_ip(a) for a in bad.blocked) if r is not None)
    return bad.keys


def _blocked_rows(eng: ReceiveLink, ring: RecvRing, lo: int, m: int, now: float) -> np.ndarray:
    """Rows ``lo..m-1`` from a source ``eng.bad`` blocks: dropped before any check costs CPU."""
    keys = np.frombuffer(blocked_keys(eng, now), np.uint8).reshape(-1, 6)
    wide = np.zeros((len(keys), 8), np.uint8)
    wide[:, 2:] = keys
    return np.isin(_name_keys(ring.names[lo:m]), wide.view(">u8").ravel())


_JOIN_TYPE_VALUES = np.array(sorted(wire.JOIN_TYPES), np.uint8)


def _stranger_rows(eng: ReceiveLink, ring: RecvRing, m: int) -> np.ndarray:
    """Rows ``0..m-1`` that cannot be this keyed job's: a whole header, not a join
    message, and another session or a sender that is no member or not at its pinned
    address. ``Engine.handle`` drops each of them as foreign before its MAC
    (``Engine.worth_verifying``); here the whole ring is sorted in a few array operations."""
    hb = ring.header_bytes(0, m)
    h = hb.view(HEADER_DTYPE).ravel()
    whole = ring.lens[:m] >= HEADER_SIZE
    join = np.isin(hb[:, wire.FIELD_OFFSETS["type"][0]], _JOIN_TYPE_VALUES)
    ours = (h["session"] == eng.session) \
        & ring.known_senders(0, m, h["src"], eng.peers.addrs, pinned=True)
    return whole & ~join & ~ours


#: How many of a batch's heaviest unverified sources the flood budget counts (`_heaviest`).
HEAVY_SOURCES = 8


def _heaviest(names: np.ndarray) -> list[tuple[tuple[str, int], int]]:
    """The (address, count) of the ``HEAVY_SOURCES`` sources with the most rows among
    ``names`` (``sockaddr_in`` rows), those with two or more: one address flooding is
    among them; a flood rotating its sources has none, and costs no Python per source."""
    keys, counts = np.unique(_name_keys(names), return_counts=True)
    out = []
    for i in np.argsort(counts)[::-1][:HEAVY_SOURCES]:
        if counts[i] < 2:
            break
        k = int(keys[i])
        out.append(((socket.inet_ntoa((k & 0xFFFFFFFF).to_bytes(4, "big")), k >> 32),
                    int(counts[i])))
    return out


def _close_up(ring: RecvRing, rest: np.ndarray) -> int:
    """Keep only the ring's slots ``rest``, in order, at its front; how many that is."""
    m = len(rest)
    ring.data[:m] = ring.data[rest]
    ring.lens[:m] = ring.lens[rest]
    ring.names[:m] = ring.names[rest]
    return m


_FLAGS_OFF = wire.FIELD_OFFSETS["flags"][0]
_SRC_OFF = wire.FIELD_OFFSETS["src"][0]
_PART_OFF = wire.FIELD_OFFSETS["part"][0]
_PULL = int(wire.Flag.PULL)


def _native_runs(eng: ReceiveLink, ring: RecvRing, m: int, now: float) -> int:
    """Rows ``0..k-1`` the C core took (``NATIVE.take_run``), a stream's run at a time; k.

    Only where its checks are the engine's: the sender's pinned address compared
    first, then, with a secret, a core that verifies the tags (``native_mac``: the
    tag is the proof), no fault injection, a receiver that has not stopped. The
    row it stops at (anything but plain DATA of the run's stream, or the chunk
    that makes the receiver STOP) and every row after it take the path below.
    """
    assert NATIVE is not None
    keyed = eng.sealer.key is not None
    if eng.round < 0 or (keyed and not native_auth()) or eng.fault_rx_drop:
        return 0
    data, fixed, i = ring.data, ring.fixed(eng.session, eng.round).tobytes(), 0
    while i < m:
        row = data[i]
        kind = int(row[_FLAGS_OFF]) & _PULL
        src = int(row[_SRC_OFF]) << 8 | int(row[_SRC_OFF + 1])
        part = int(row[_PART_OFF]) << 8 | int(row[_PART_OFF + 1])
        r = eng.receivers.get((kind, part, src))
        if r is None or r.stopped or r.final is not None or not r.out.flags.c_contiguous:
            break
        mac = native_mac(eng.sealer, eng.session, src, eng.rank) if keyed else None
        addr = ring.pinned_addr(src, eng.peers.addrs)
        room = r.count - r.allowed - r.n_have - 1
        if addr is None or room < 0:
            break
        j, new, dups, bad, aux = NATIVE.take_run(
            data, ring.stride, ring.lens, ring.names, i, m, fixed, src, part, kind, addr,
            eng.chunk_bytes, r.count, r.nbytes, r.out, r.out_u8 is None, r.have, room, mac)
        if mac is not None and j < m and new < room and ring.names[j, 2:8].tobytes() == addr \
                and _run_row(ring, j, fixed, src, part, kind, eng.chunk_bytes):
            # The core stopped at a row of this run's stream with room left: its tag
            # failed there. Counted now, so it is never verified again further down.
            _took(eng, r, new, dups, bad, aux, src, now)
            eng.failed_tag(ring.view(j), int(ring.lens[j]), ring.addr(j), now)
            i = j + 1
            continue
        if j == i:
            break
        _took(eng, r, new, dups, bad, aux, src, now)
        i = j
    return i


def _took(eng: ReceiveLink, r, new: int, dups: int, bad: int, aux: int, src: int,
          now: float) -> None:
    """What one ``take_run`` call did, in the engine's and the receiver's books."""
    if new or dups or bad:
        if eng.finals.pending:
            eng.finals.implicit_ack(src, eng.round)
        eng.seen_round = True
    eng.counters.malformed += bad
    eng.counters.duplicates += dups
    if new:
        if not r.n_have:
            r.t_first = now
        r.n_have += new
        if aux > r.max_pass:
            r.max_pass = aux


_RUN_COLS = np.array([_SRC_OFF, _SRC_OFF + 1, _PART_OFF, _PART_OFF + 1])


def _run_row(ring: RecvRing, j: int, fixed: bytes, src: int, part: int, kind: int,
             chunk_bytes: int) -> bool:
    """Whether slot ``j`` passes every check ``take_run`` makes before the tag (DATA of
    this round and of the run's stream): then only its tag can have stopped the core."""
    hb = ring.header_bytes(j, j + 1)
    h = hb.view(HEADER_DTYPE).ravel()
    if not data_rows(hb, h, ring.lens[j:j + 1], chunk_bytes,
                     np.frombuffer(fixed, np.uint8))[0]:
        return False
    want = np.array([src >> 8, src & 0xFF, part >> 8, part & 0xFF], np.uint8)
    return bool((hb[0, _RUN_COLS] == want).all()) and int(hb[0, _FLAGS_OFF]) & _PULL == kind


def deliver(eng: ReceiveLink, ring: RecvRing, m: int, now: float) -> None:
    """Handle ring slots ``0..m-1`` in arrival order, with the per-datagram path's outcome.

    A run of consecutive plain DATA datagrams of one stream of this round goes to
    its receiver's ``on_data_batch`` at once (or, first, to the C core where it is
    built: ``_native_runs``); every other datagram (control, other rounds,
    unknown or forged senders, malformed) goes to ``Engine.handle`` alone, so
    hostile input meets exactly the checks it met before. Should a datagram
    handled alone change what the checks depend on (round, session, peers), the
    rest of the batch takes ``handle`` too.
    """
    if eng.bad.blocked:
        # Sources of bad tags first, by address alone: their rows leave the ring before
        # any check (or the C core) spends anything on them, and the rest close up.
        blocked = _blocked_rows(eng, ring, 0, m, now)
        if blocked.any():
            eng.counters.unauthenticated += int(blocked.sum())
            m = _close_up(ring, np.flatnonzero(~blocked))
            if m == 0:
                return
    if eng.sealer.key is not None and eng.kernel_allow is None:
        # Strangers next, by header and address alone (``Engine.worth_verifying`` for
        # the whole ring): a flood from forged sources or sessions costs no MAC, no
        # Python per datagram, and never stops the C core's runs. Only where the
        # socket's kernel filter does not already keep them out (``kernel_allow``):
        # these array operations cost 10-20 % of a 10 Gbit/s keyed round on every
        # batch, and what a stale filter lets through still meets the pinned-address
        # checks below (the C core's runs, ``_fast_rows``, ``worth_verifying``).
        strange = _stranger_rows(eng, ring, m)
        if strange.any():
            eng.counters.foreign += int(strange.sum())
            eng.bad.unverified(int(strange.sum()), _heaviest(ring.names[:m][strange]), now,
                               eng.peers.addrs)
            m = _close_up(ring, np.flatnonzero(~strange))
            if m == 0:
                return
    lo = _native_runs(eng, ring, m, now) if NATIVE is not None else 0
    if lo == m:
        return
    n = m - lo
    keep = np.ones(n, bool)
    if eng.fault_rx_drop:
        keep = eng._fault_rng.random(n) >= eng.fault_rx_drop  # one draw per datagram, as before
    hb = ring.header_bytes(lo, m)
    h = hb.view(HEADER_DTYPE).ravel()
    fast, failed = _fast_rows(eng, ring, hb, h, lo, m, keep)
    kind = hb[:, _FLAGS_OFF] & _PULL
    if fast.all() and (kind == kind[0]).all() and (hb[:, _STREAM_COLS] == hb[0, _STREAM_COLS]).all():
        spans = [(0, n)]  # the common case: one stream's run fills the ring
    else:
        stream = np.where(fast, kind.astype(np.int64) << 32 | h["part"].astype(np.int64) << 16
                          | h["src"].astype(np.int64), -1 - np.arange(n))
        spans = runs(stream)
    state = (eng.round, eng.session, len(eng.peers.addrs))
    for a, b in spans:
        if fast[a]:
            src = int(h["src"][a])
            r = eng.receivers.get((int(kind[a]), int(h["part"][a]), src))
            if r is not None:
                if eng.finals.pending:
                    eng.finals.implicit_ack(src, eng.round)
                eng.seen_round = True
                r.on_data_batch(h[a:b], ring.data, np.arange(lo + a, lo + b), now)
                continue
        for i in range(a, b):
            if keep[i]:
                _alone(eng, ring, lo + i, bool(failed[i]), now)
        if (eng.round, eng.session, len(eng.peers.addrs)) != state:
            for i in range(b, n):
                if keep[i]:
                    _alone(eng, ring, lo + i, bool(failed[i]), now)
            return


def _alone(eng: ReceiveLink, ring: RecvRing, i: int, failed: bool, now: float) -> None:
    """Slot ``i`` through the per-datagram path; one whose tag already failed here (its
    verdict depends only on its own bytes) is counted as such, not verified again."""
    if failed:
        eng.failed_tag(ring.view(i), int(ring.lens[i]), ring.addr(i), now)
    else:
        eng.handle(ring.view(i), int(ring.lens[i]), ring.addr(i), None, now)
