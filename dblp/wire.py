"""The DBLP wire format: the single declaration the packer and the scapy layer share.

Every message, data or control, is one UDP datagram (or one length-prefixed
frame on the optional TCP control connection): the same fixed 40-byte header
(network byte order), ``length`` bytes of payload, and a 16-byte trailer.
``HEADER_FIELDS`` and ``TRAILER_FIELDS`` are the only places the layout is
written down: ``pack``/``unpack`` below and ``dblp.scapy_layer.DBLP`` are both
generated from them, and the tests check one against the other.

The trailer is an AES-128-GMAC tag (AES-GCM with header and payload as
associated data and nothing encrypted, as QUIC and WireGuard authenticate;
``Sealer``) under a key derived from the job's secret for one (session,
sender, destination, stream); a job without a secret sends zeros there and
checks nothing. The secret itself never travels. GMAC is a nonce-based MAC:
two different messages under one key and one nonce would give away the key's
hash subkey, so every message carries its nonce in the header (``seq``: a
random 62-bit start per sender, then one more per message sealed), and keys
are per session, sender, destination and stream, so only restarts of the
same rank in the same stream of the same job share a key, each from its own
random start. The stream (``TransportConfig.stream``) tells apart the jobs a
launcher runs under one session and one secret, such as the torch backend's
one ``TransportGroup`` per bucket size: each counts rounds from 0 with parts
laid out alike, so without it a datagram of one stream verified in another
and replaced its values (wire version 5). A receiver with
a secret drops (and counts) every message whose tag does not verify, before
parsing it. A key per destination means a message sealed for one rank never
verifies at another (a STOP for one member re-sent to a member pushing the
same part is dropped as unauthenticated); the session in the key and the
header ties every message after the join to one job, and the join itself is
a challenge (``dblp.join``), so no message of an earlier job or session is
taken for one of this job. Why GMAC and not the keyed BLAKE2b of wire
version 3: with AES-NI and carry-less multiplication it costs about a sixth
of BLAKE2b per datagram here, which is what lets a keyed job keep up with an
unkeyed one (docs/transport.md, "At line rate").

Payload per message type:

* DATA: ``length`` bytes of little-endian float32 (chunk ``index`` of
  ``count`` in stream (``flags & PULL``, ``part``, ``src``)).
* PROBE: empty; ``index`` is a fresh probe id the reply echoes (RTT samples
  are unambiguous), ``copies`` asks the receiver to send its reply that many
  times (control redundancy under heavy loss). The receiver answers each probe
  id once, however many copies of it arrive (else copies x copies replies).
* BITMAP / STOP: the receiver's bitmap of held chunks, ``ceil(count/8)`` bytes,
  bit ``i`` = byte ``i // 8``, bit ``7 - i % 8`` (numpy ``packbits`` order).
  STOP means "the missing fraction is within the bound: stop sending".
* FINAL: two bitmaps. First, the chunks every replica zero-fills in this
  round's pull; second, the chunks of this member's push that the aggregate
  took (its receiver's bitmap at STOP), so a member whose STOP was lost still
  knows exactly what it delivered (error feedback needs it) without waiting;
  After the bitmaps, ``FINAL_NORM``: the owner's two figures of its part
  for the phase detector's drop-corrected norm (the sum of squares of the
  elements it kept, each scaled back by n/k for k of n pushes delivered,
  and how many it kept), so every replica of a sharded job sees the norm
  that the owner of every part sees (``dblp.rounds.part_figures``); zeros
  when the job's detector asks for no such norm.
  ``aux`` is the bound (ppm) the aggregator decided for the next round and
  ``flags & CRITICAL`` its phase; ``index`` numbers the transmissions (1, 2,
  ... on retransmission), and the member acknowledges each number once.
* DONE: empty acknowledgement of FINAL.
* HELLO / CHALLENGE / WELCOME: small JSON objects for joining (``dblp.join``):
  HELLO (rank, numel, the member's fresh nonce and, once challenged, its
  answer), CHALLENGE (the aggregator's answer to a HELLO: the nonce echoed
  and a value only it can make, bound to the address the HELLO came from;
  or a refusal of a HELLO whose tag failed), WELCOME (session, settings,
  address table, the nonce of the HELLO it answers echoed).

No message exceeds ``MAX_DATAGRAM`` (1472) bytes of UDP payload, so each fits
a 1500-byte MTU without IP fragmentation; a receiver rejects anything longer.
The one exception is opt-in: a job configured with larger data chunks
(``TransportConfig.chunk_bytes``, the authors' prototype's 8 KB) sends DATA
datagrams of ``datagram_size(chunk_bytes)`` bytes, which the kernel splits
into ``fragments(...)`` IP fragments (losing one loses the chunk); its
receivers accept DATA up to that size (``unpack_header``'s ``chunk_bytes``),
control messages still only up to ``MAX_DATAGRAM``.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = 0xDB1B
VERSION = 6  # 2: the MAC trailer; 3: the MAC covers the destination rank, CHALLENGE joins;
#             4: GMAC under per-(session, sender, destination) keys, the seq nonce;
#             5: the stream in the key derivation (one stream's datagram fails in another);
#             6: FINAL carries its part's detector-norm figures (FINAL_NORM)
MTU = 1500  # the Ethernet MTU every datagram is sized for
IP_HEADER = 20
UDP_HEADER = 8
MAX_DATAGRAM = MTU - IP_HEADER - UDP_HEADER  # 1472: the largest unfragmented UDP payload
MAX_UDP_PAYLOAD = 65507  # 65535 - 20 IPv4 - 8 UDP: the largest datagram at all
DEFAULT_PORT = 47474  # the transport's UDP (and TCP control) port unless a job says otherwise
PPM = 1_000_000  # bounds travel as parts per million (integers: all peers agree exactly)


class MsgType(enum.IntEnum):
    """Message types; values are on the wire."""

    DATA = 1
    PROBE = 2
    BITMAP = 3
    STOP = 4
    FINAL = 5
    DONE = 6
    HELLO = 7
    WELCOME = 8
    CHALLENGE = 9


#: The join's messages: the only ones a sender that is not yet a member (no pinned
#: address, another session) may send; every other one is dropped unless it carries
#: the job's session from a member's pinned address, before any MAC is checked.
JOIN_TYPES = frozenset((int(MsgType.HELLO), int(MsgType.WELCOME), int(MsgType.CHALLENGE)))


class Flag(enum.IntFlag):
    """Header flag bits; values are on the wire."""

    PULL = 0x01  # stream goes aggregator -> member (else member -> aggregator)
    CRITICAL = 0x02  # phase bit: critical (P_low) when set
    TCP = 0x04  # sender uses TCP for control (informational)


# (name, struct code, description) -- THE declaration of the header.
HEADER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("magic", "H", "0xDB1B"),
    ("version", "B", "wire version (VERSION)"),
    ("type", "B", "MsgType"),
    ("flags", "B", "Flag bits"),
    ("copies", "B", "redundancy the peer should use for its control reply"),
    ("src", "H", "rank of the sender of this message"),
    ("part", "H", "part (bucket/shard) index of the stream"),
    ("session", "Q", "random 64-bit job id; other sessions are ignored"),
    ("round", "I", "training round"),
    ("index", "I", "DATA: chunk index; PROBE/BITMAP/STOP: probe id; FINAL/DONE: FINAL transmission id"),
    ("count", "I", "chunks in the stream"),
    ("length", "H", "payload bytes that follow the header"),
    ("bound", "I", "loss bound of this round, ppm"),
    ("aux", "I", "DATA: pass number; FINAL: next round's bound, ppm"),
    ("seq", "Q", "the MAC's nonce: the sender's message number under its key (zero without a secret)"),
)

# (name, bytes, description) -- THE declaration of what follows the payload.
TRAILER_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("tag", 16, "AES-128-GMAC of header + payload under the (session, src, destination, "
     "stream) key derived from the job's secret, nonce ``seq``; zeros without a secret"),
)

HEADER_FORMAT = "!" + "".join(code for _, code, _ in HEADER_FIELDS)
_HEADER = struct.Struct(HEADER_FORMAT)
HEADER_SIZE = _HEADER.size
TAG_SIZE = sum(size for _, size, _ in TRAILER_FIELDS)
ZERO_TAG = bytes(TAG_SIZE)
MAX_PAYLOAD = MAX_DATAGRAM - HEADER_SIZE - TAG_SIZE
CHUNK_ELEMS = MAX_PAYLOAD // 4  # float32 elements per full data chunk
CHUNK_BYTES = CHUNK_ELEMS * 4
#: A FINAL's tail after its two bitmaps: the part's detector-norm figures (sum of squares
#: of the kept elements, float64; elements kept, uint32), network order.
FINAL_NORM = struct.Struct("!dI")
#: A FINAL's two bitmaps and its tail must fit one datagram.
MAX_PART_CHUNKS = (MAX_PAYLOAD - FINAL_NORM.size) // 2 * 8
#: The largest configurable data chunk: whole float32s in the largest datagram.
MAX_CHUNK_BYTES = (MAX_UDP_PAYLOAD - HEADER_SIZE - TAG_SIZE) // 4 * 4
FIELD_NAMES = tuple(name for name, _, _ in HEADER_FIELDS)
FIELD_OFFSETS = {}
_off = 0
for _name, _code, _ in HEADER_FIELDS:
    FIELD_OFFSETS[_name] = (_off, struct.calcsize("!" + _code))
    _off += struct.calcsize("!" + _code)

assert HEADER_SIZE == 48, HEADER_SIZE


def datagram_size(chunk_bytes: int = CHUNK_BYTES) -> int:
    """UDP payload bytes of a full DATA datagram carrying ``chunk_bytes`` of floats."""
    return HEADER_SIZE + chunk_bytes + TAG_SIZE


def largest_datagram(chunk_bytes: int = CHUNK_BYTES) -> int:
    """The longest datagram a job with ``chunk_bytes`` chunks accepts: one chunk's DATA, or
    any message up to ``MAX_DATAGRAM``. ``unpack_header`` refuses anything longer."""
    return max(MAX_DATAGRAM, datagram_size(chunk_bytes))


def fragments(datagram: int, mtu: int = MTU) -> int:
    """IP packets a UDP datagram of ``datagram`` payload bytes becomes at ``mtu``.

    Every fragment but the last carries a multiple of 8 bytes of the IP
    payload (UDP header + datagram); 1 for anything up to ``MAX_DATAGRAM``.
    """
    per_fragment = (mtu - IP_HEADER) // 8 * 8
    return max(1, -(-(datagram + UDP_HEADER) // per_fragment))


class Header:
    """A decoded header; attributes are ``HEADER_FIELDS`` in order.

    A slotted class, not a NamedTuple: fields called ``index`` and ``count``
    would shadow the tuple methods of the same names.
    """

    __slots__ = FIELD_NAMES
    magic: int
    version: int
    type: int
    flags: int
    copies: int
    src: int
    part: int
    session: int
    round: int
    index: int
    count: int
    length: int
    bound: int
    aux: int
    seq: int

    def __init__(self, magic: int, version: int, type: int, flags: int, copies: int, src: int,
                 part: int, session: int, round: int, index: int, count: int, length: int,
                 bound: int, aux: int, seq: int) -> None:
        self.magic, self.version, self.type, self.flags = magic, version, type, flags
        self.copies, self.src, self.part, self.session = copies, src, part, session
        self.round, self.index, self.count, self.length = round, index, count, length
        self.bound, self.aux, self.seq = bound, aux, seq

    def __repr__(self) -> str:
        return "Header(" + ", ".join(f"{n}={getattr(self, n)}" for n in FIELD_NAMES) + ")"


assert tuple(Header.__init__.__code__.co_varnames[1:len(FIELD_NAMES) + 1]) == FIELD_NAMES


class MalformedDatagram(ValueError):
    """A datagram that is not a well-formed DBLP message (counted, never fatal)."""


def pack_header(type: int, *, src: int = 0, part: int = 0, session: int = 0, round: int = 0,
                index: int = 0, count: int = 0, length: int = 0, bound: int = 0, aux: int = 0,
                flags: int = 0, copies: int = 1, seq: int = 0) -> bytes:
    """Pack one header (no payload; ``seq`` is `Sealer`'s to set when it seals)."""
    return _HEADER.pack(MAGIC, VERSION, int(type), int(flags), int(copies), int(src), int(part),
                        int(session), int(round), int(index), int(count), int(length), int(bound),
                        int(aux), int(seq))


def pack_body(type: int, payload: bytes = b"", **fields) -> bytes:
    """Header + payload without the trailer (``Sealer.seal`` adds it); ``length`` filled in."""
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds MAX_PAYLOAD={MAX_PAYLOAD}")
    return pack_header(type, length=len(payload), **fields) + payload


def pack(type: int, payload: bytes = b"", *, key: bytes | None = None, dst: int = 0,
         **fields) -> bytes:
    """A whole message to rank ``dst``: header + payload + trailer (tagged with ``key``, zeros
    without)."""
    return Sealer(key).seal(pack_body(type, payload, **fields), dst)


#: What a pair key is derived from besides the secret: (session, sender, destination, stream).
_PAIR = struct.Struct("!QHHI")
#: BLAKE2b's personalisation of the derivation: keys for nothing but this use.
_KDF_PERSON = b"dblp5 gmac key"
#: The largest stream identifier (``TransportConfig.stream``): 32 bits in the derivation.
MAX_STREAM = 2**32 - 1
PAIR_KEY_SIZE = 16  # AES-128
_SEQ = struct.Struct("!Q")
SEQ_OFFSET = FIELD_OFFSETS["seq"][0]
_SESSION_OFFSET = FIELD_OFFSETS["session"][0]
_SRC_OFFSET = FIELD_OFFSETS["src"][0]
#: Pair keys one sealer keeps (a job's own pairs; forged sessions beyond it are derived
#: per message, never stored: a flood of them cannot grow memory).
MAX_PAIR_KEYS = 4096


def nonce(header) -> bytes:
    """The 96-bit GCM nonce of a message: four zero bytes, then its header's ``seq``."""
    return (bytes(4) + bytes(header[SEQ_OFFSET:SEQ_OFFSET + 8])).ljust(12, b"\0")


class Sealer:
    """Tags outgoing messages and verifies incoming ones with the job's secret.

    The state of one sender, by role:

    * ``key``: the job's secret (16-64 bytes), or None: without one every tag
      is zeros and every message verifies, so the job is open to anyone who
      can reach its port (closed networks, benchmarks).
    * ``seq``: the next message number, the GCM nonce. It starts at a random
      62-bit value, so a restarted rank of the same job does not repeat its
      predecessor's numbers, and only grows: every message sealed, in Python
      (`stamp`, `seal`) or by the C core (``dblp.batch``, which takes numbers
      with `take_seq`), gets a number of its own. Zero without a key.
    * ``stream``: which of the streams sharing this secret and session this
      sealer's job is (0 unless a launcher sets one); part of every key.
    * pair keys: one AES-128 key per (session, sender, destination) of the
      stream, derived from the secret (`pair_key`) and kept for the job's own
      pairs (``_aead`` here, ``native``: the C core's contexts,
      ``dblp.batch.native_mac``).

    A tag covers header and payload and is made under the key of the rank the
    message is for: a receiver verifies under the key of (the header's
    session, the header's sender, itself), so a message sealed for another
    rank, or for another session or stream, fails here.
    """

    __slots__ = ("key", "stream", "seq", "_aead", "native")

    def __init__(self, key: bytes | None, stream: int = 0):
        if key is not None and not 16 <= len(key) <= 64:
            raise ValueError(f"key must be 16 to 64 bytes, got {len(key)}")
        if not 0 <= stream <= MAX_STREAM:
            raise ValueError(f"stream must be in [0, {MAX_STREAM}], got {stream}")
        self.key = key
        self.stream = stream
        self.seq = secrets.randbits(62) if key is not None else 0
        self._aead: dict[tuple[int, int, int], AESGCM] = {}
        #: The C core's keyed context per pair (``dblp.batch.native_mac``).
        self.native: dict[tuple[int, int, int], object] = {}

    def pair_key(self, session: int, src: int, dst: int) -> bytes:
        """The AES-128 key of messages from rank ``src`` to rank ``dst`` in ``session`` (of
        this sealer's stream)."""
        assert self.key is not None
        return hashlib.blake2b(_PAIR.pack(session, src, dst, self.stream), key=self.key,
                               digest_size=PAIR_KEY_SIZE, person=_KDF_PERSON).digest()

    def _gmac(self, session: int, src: int, dst: int) -> AESGCM:
        pair = (session, src, dst)
        aead = self._aead.get(pair)
        if aead is None:
            aead = AESGCM(self.pair_key(session, src, dst))
            if len(self._aead) < MAX_PAIR_KEYS:
                self._aead[pair] = aead
        return aead

    def take_seq(self, n: int = 1) -> int:
        """The first of ``n`` fresh message numbers (zero without a key)."""
        if self.key is None:
            return 0
        first = self.seq
        self.seq = first + n
        return first

    def stamp(self, header) -> bytes:
        """``header`` with a fresh ``seq`` (unchanged without a key): before `tag`."""
        if self.key is None:
            return bytes(header)
        h = bytearray(header)
        _SEQ.pack_into(h, SEQ_OFFSET, self.take_seq())
        return bytes(h)

    def tag(self, dst: int, head, *rest) -> bytes:
        """The trailer of a message for rank ``dst`` made of ``head`` (its header, ``seq``
        already in it, and maybe more) and ``rest`` (buffers)."""
        if self.key is None:
            return ZERO_TAG
        h = memoryview(head)
        session = int.from_bytes(h[_SESSION_OFFSET:_SESSION_OFFSET + 8], "big")
        src = int.from_bytes(h[_SRC_OFFSET:_SRC_OFFSET + 2], "big")
        aad = b"".join((h, *rest)) if rest else bytes(h)
        return self._gmac(session, src, dst).encrypt(nonce(h), b"", aad)

    def seal(self, body, dst: int) -> bytes:
        """``body`` (header + payload) for rank ``dst``: stamped with a fresh ``seq``, followed
        by its trailer."""
        if self.key is None:
            return bytes(body) + ZERO_TAG
        b = bytearray(body)
        if len(b) >= HEADER_SIZE:  # anything shorter is refused unread (tests build such)
            _SEQ.pack_into(b, SEQ_OFFSET, self.take_seq())
        return bytes(b) + self.tag(dst, b)

    def verify(self, buf, n: int, dst: int) -> bool:
        """Whether the first ``n`` bytes of ``buf`` end in the right tag for rank ``dst``
        (always without a key)."""
        if self.key is None:
            return True
        if n < HEADER_SIZE + TAG_SIZE:
            return False
        mv = memoryview(buf)
        return hmac.compare_digest(self.tag(dst, mv[:n - TAG_SIZE]), mv[n - TAG_SIZE:n])


_TYPES = frozenset(int(t) for t in MsgType)


def unpack_header(buf, nbytes: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> Header:
    """Decode and validate a header; raise MalformedDatagram on anything off.

    ``nbytes`` is how many bytes of ``buf`` are valid (``recv_into`` style),
    trailer included; ``chunk_bytes`` is the job's data chunk size (its
    ``TransportConfig.chunk_bytes``), so a job with larger chunks accepts its
    own larger DATA and nothing larger. Checks: size (DATA at most one
    chunk's datagram, anything else at most ``MAX_DATAGRAM``), magic, version,
    type, declared length == actual payload, chunk index < count for DATA, DATA
    payloads whole float32s of at most one chunk. The tag is ``Sealer``'s job.
    """
    n = len(buf) if nbytes is None else nbytes
    if n < HEADER_SIZE + TAG_SIZE:
        raise MalformedDatagram(f"truncated: {n} bytes < header {HEADER_SIZE} + tag {TAG_SIZE}")
    largest = largest_datagram(chunk_bytes)
    if n > largest:
        raise MalformedDatagram(f"{n} bytes exceed one datagram ({largest})")
    h = Header(*_HEADER.unpack_from(buf, 0))
    if n > MAX_DATAGRAM and h.type != MsgType.DATA:
        raise MalformedDatagram(f"{n} bytes exceed one control datagram ({MAX_DATAGRAM})")
    if h.magic != MAGIC:
        raise MalformedDatagram(f"bad magic 0x{h.magic:04x}")
    if h.version != VERSION:
        raise MalformedDatagram(f"unsupported version {h.version}")
    if h.type not in _TYPES:
        raise MalformedDatagram(f"unknown type {h.type}")
    if h.length != n - HEADER_SIZE - TAG_SIZE:
        raise MalformedDatagram(f"length field {h.length} != payload "
                                f"{n - HEADER_SIZE - TAG_SIZE}")
    if h.type == MsgType.DATA:
        if h.index >= h.count:
            raise MalformedDatagram(f"chunk index {h.index} >= count {h.count}")
        if h.length % 4 or h.length == 0 or h.length > chunk_bytes:
            raise MalformedDatagram(f"data payload {h.length} bytes is not whole float32s "
                                    f"of at most one chunk ({chunk_bytes})")
    elif h.type in (MsgType.BITMAP, MsgType.STOP, MsgType.FINAL):
        final = h.type == MsgType.FINAL
        size = (2 if final else 1) * ((h.count + 7) // 8) + (FINAL_NORM.size if final else 0)
        if h.length != size or h.count > MAX_PART_CHUNKS:
            raise MalformedDatagram(f"bitmap of {h.length} bytes for {h.count} chunks")
    if h.bound >= PPM or (h.type == MsgType.FINAL and h.aux >= PPM):
        raise MalformedDatagram(f"bound {h.bound} ppm out of range")
    return h


def unpack(buf) -> tuple[Header, bytes]:
    """Decode a whole datagram into (header, payload bytes); the tag is not checked."""
    h = unpack_header(buf)
    return h, bytes(buf[HEADER_SIZE:HEADER_SIZE + h.length])


def final_payload(dropped: bytes, taken: bytes, sumsq: float = 0.0, kept: int = 0) -> bytes:
    """A FINAL's payload: the dropped and taken bitmaps, then the part's norm figures."""
    return dropped + taken + FINAL_NORM.pack(sumsq, kept)


def bound_to_ppm(p: float) -> int:
    """Loss bound as an integer number of parts per million (rounded)."""
    return int(round(float(p) * PPM))


def allowed_missing(count: int, bound_ppm: int) -> int:
    """Chunks a stream of ``count`` chunks may miss under ``bound_ppm`` (integer math)."""
    return (count * bound_ppm) // PPM
