"""The wire format: packer vs scapy layer, validation of every field that can be wrong."""
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Raw

from dblp import wire
from dblp.scapy_layer import DBLP, bind
from dblp.wire import MalformedDatagram, MsgType

pytestmark = pytest.mark.unit

FIELD_RANGES = {"flags": 255, "copies": 255, "src": 65535, "part": 65535, "session": 2**64 - 1,
                "round": 2**32 - 1, "index": 2**32 - 1, "count": 2**32 - 1,
                "bound": wire.PPM - 1, "aux": wire.PPM - 1}


@st.composite
def messages(draw):
    t = draw(st.sampled_from([MsgType.PROBE, MsgType.DONE, MsgType.HELLO, MsgType.WELCOME,
                              MsgType.DATA, MsgType.STOP]))
    f = {k: draw(st.integers(0, hi)) for k, hi in FIELD_RANGES.items()}
    if t == MsgType.DATA:
        f["count"] = max(1, f["count"])
        f["index"] = f["index"] % f["count"]
        payload = draw(st.binary(min_size=1, max_size=wire.MAX_PAYLOAD // 4)) * 4
    elif t == MsgType.STOP:
        f["count"] = draw(st.integers(1, wire.MAX_PART_CHUNKS))
        payload = draw(st.binary(min_size=(f["count"] + 7) // 8, max_size=(f["count"] + 7) // 8))
    else:
        payload = draw(st.binary(max_size=64))
    return t, f, payload


def test_header_is_declared_once_and_fits_the_mtu():
    assert wire.HEADER_SIZE == struct.calcsize(wire.HEADER_FORMAT) == 48
    assert wire.HEADER_SIZE + wire.CHUNK_BYTES + wire.TAG_SIZE <= wire.MAX_DATAGRAM == 1472
    assert [f.name for f in DBLP.fields_desc] == list(wire.FIELD_NAMES)
    # a FINAL's two bitmaps and its norm figures
    assert 2 * ((wire.MAX_PART_CHUNKS + 7) // 8) + wire.FINAL_NORM.size <= wire.MAX_PAYLOAD


@settings(max_examples=300, deadline=None)
@given(messages())
def test_packer_and_scapy_agree(msg):
    t, f, payload = msg
    raw = wire.pack(t, payload, **f)
    h, pay = wire.unpack(raw)
    assert pay == payload and h.type == t and h.length == len(payload)
    for k, v in f.items():
        assert getattr(h, k) == v
    # scapy dissects the packer's bytes into the same fields ...
    d = DBLP(raw)
    for name in wire.FIELD_NAMES:
        assert int(getattr(d, name)) == getattr(h, name), name
    assert (bytes(d[Raw].load) if d.haslayer(Raw) else b"") == payload
    assert d.trailer == {"tag": wire.ZERO_TAG}  # the declared trailer, zeros without a key
    # ... and builds the same bytes from the same fields
    built = DBLP(**{k: v for k, v in f.items()}, type=int(t)) / payload
    assert bytes(built) == raw


def test_scapy_dissects_udp_on_the_bound_port():
    from scapy.layers.inet import IP, UDP
    bind(47999)
    raw = wire.pack(MsgType.PROBE, src=2, session=7, round=3, index=11, count=5)
    pkt = IP(bytes(IP(dst="10.0.0.2") / UDP(sport=40000, dport=47999) / raw))
    assert pkt.haslayer(DBLP) and pkt[DBLP].index == 11 and pkt[DBLP].type == MsgType.PROBE


def _data(**kw):
    f = dict(src=0, part=0, session=1, round=0, index=0, count=4)
    f.update(kw)
    return wire.pack(MsgType.DATA, b"\0" * 8, **f)


@pytest.mark.parametrize("raw,why", [
    (b"", "truncated"),
    (_data()[:39], "truncated"),
    (b"\x00\x00" + _data()[2:], "magic"),
    (_data()[:2] + b"\x09" + _data()[3:], "version"),
    (_data()[:3] + b"\x63" + _data()[4:], "type"),
    (_data()[:-1], "length"),
    (_data() + b"x", "length"),
    (_data(index=4), "index"),
    (wire.pack(MsgType.DATA, b"abc", count=1), "float32"),
    (wire.pack(MsgType.STOP, b"\0\0", count=4), "bitmap"),
    (wire.pack(MsgType.PROBE, bound=wire.PPM, count=1), "bound"),
])
def test_malformed_datagrams_are_rejected_with_a_reason(raw, why):
    with pytest.raises(MalformedDatagram, match=why):
        wire.unpack_header(raw)


def test_bound_ppm_math_is_integer_and_exact():
    assert wire.bound_to_ppm(0.408) == 408_000
    assert wire.allowed_missing(2929, 8000) == 23  # floor(2929 * 0.008)
    assert wire.allowed_missing(2929, 0) == 0
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        wire.pack(MsgType.DATA, b"\0" * (wire.MAX_PAYLOAD + 4), count=1)
