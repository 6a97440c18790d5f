"""Scapy layer ``DBLP`` generated from ``dblp.wire.HEADER_FIELDS`` (the one declaration).

``bind(port)`` binds it to UDP on that port (both directions), so
``rdpcap`` dissects captures of the transport; the payload after the header
is ``Raw`` (chunk floats or a bitmap), ``length`` bytes long, and the trailer
that ``wire.TRAILER_FIELDS`` declares (the MAC) follows as padding, read back
with ``DBLP.trailer``. Building appends a zero trailer (an unauthenticated
message: a real tag needs the job's secret). Tests check that dissecting the
packer's bytes gives back every field and that ``bytes(DBLP(...) / payload)``
equals ``wire.pack(...)``.
"""
from __future__ import annotations

from scapy.fields import ByteEnumField, ByteField, FlagsField, IntField, LongField, ShortField, XShortField
from scapy.layers.inet import UDP
from scapy.packet import Packet, Padding, bind_layers

from . import wire

_BY_CODE = {"B": ByteField, "H": ShortField, "I": IntField, "Q": LongField}
_DEFAULTS = {"version": wire.VERSION, "copies": 1}


def _field(name: str, code: str):
    default = _DEFAULTS.get(name, 0)
    if name == "length":  # None: filled in from the payload by post_build
        return ShortField(name, None)
    if name == "magic":
        return XShortField(name, wire.MAGIC)
    if name == "type":
        return ByteEnumField(name, int(wire.MsgType.DATA), {int(t): t.name for t in wire.MsgType})
    if name == "flags":
        names = [f.name or f"b{i}" for i, f in enumerate(wire.Flag)]
        return FlagsField(name, 0, 8, names + ["b3", "b4", "b5", "b6", "b7"])
    return _BY_CODE[code](name, default)


class DBLP(Packet):
    """A DBLP message header; ``length`` is filled in from the payload when left None."""

    name = "DBLP"
    fields_desc = [_field(name, code) for name, code, _ in wire.HEADER_FIELDS]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None:
            off = _offset_of("length")
            pkt = pkt[:off] + len(pay).to_bytes(2, "big") + pkt[off + 2:]
        return pkt + pay + wire.ZERO_TAG

    def extract_padding(self, s: bytes):
        n = self.length or 0
        return s[:n], s[n:]

    @property
    def trailer(self) -> dict:
        """The dissected trailer by ``wire.TRAILER_FIELDS`` name (empty if truncated)."""
        pad = self.getlayer(Padding)
        raw = bytes(pad.load) if pad is not None else b""
        out, off = {}, 0
        for name, size, _ in wire.TRAILER_FIELDS:
            if len(raw) < off + size:
                break
            out[name] = raw[off:off + size]
            off += size
        return out


def _offset_of(field: str) -> int:
    return wire.FIELD_OFFSETS[field][0]


assert len(DBLP.fields_desc) == len(wire.HEADER_FIELDS)


def bind(port: int = wire.DEFAULT_PORT) -> None:
    """Dissect UDP traffic to or from ``port`` as DBLP."""
    bind_layers(UDP, DBLP, dport=port)
    bind_layers(UDP, DBLP, sport=port)
