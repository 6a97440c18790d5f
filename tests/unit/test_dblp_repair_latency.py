"""No receive coalescing while a reply or a repair is under way (``Engine._in_repair``).

Coalescing lets a batch of datagrams gather before a read (a NIC's interrupt
moderation). While a sender waits for a probe's answer, or a receiver that
answered a probe waits for the resent chunks, the link idles until the next
message is handled, so a sleep there lengthens the round instead of
batching work.
"""
import time

import numpy as np
import pytest

from dblp import wire
from dblp.engine import PULL, PUSH, InTransfer, OutTransfer
from dblp.streams import PROBING, SENDING
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

PEER = 2  # loopback_engine's one peer


def test_a_sender_waiting_for_an_answer_is_in_repair(loopback_engine):
    eng = loopback_engine
    s = OutTransfer(eng, PUSH, 0, PEER, np.arange(20 * wire.CHUNK_ELEMS, dtype=np.float32), 0)
    eng.add_sender(s)
    assert s.state == SENDING and not eng._in_repair()
    end = time.monotonic() + 5
    while s.state != PROBING and time.monotonic() < end:
        eng._send_some(time.monotonic())
    assert s.state == PROBING and eng._in_repair()


def test_a_receiver_is_in_repair_from_its_first_probe_until_it_stops(loopback_engine):
    eng = loopback_engine
    count = 4
    r = InTransfer(eng, PULL, 0, PEER, np.zeros(count * wire.CHUNK_ELEMS, np.float32), 0,
                   add=False, freeze=False)
    eng.add_receiver(r)
    assert not eng._in_repair()  # the first pass: nothing asked yet
    ids = dict(src=PEER, part=0, session=eng.session, round=eng.round, count=count,
               flags=wire.Flag.PULL)
    probe = wire.unpack(wire.pack(MsgType.PROBE, b"", index=1, **ids))[0]
    r.on_probe(probe, time.monotonic())
    assert r.last_probe == 1 and not r.stopped and eng._in_repair()
    chunk = np.ones(wire.CHUNK_ELEMS, np.float32).tobytes()
    for c in range(count):
        buf = wire.pack(MsgType.DATA, chunk, index=c, aux=2, **ids)
        h = wire.unpack_header(buf, len(buf), eng.chunk_bytes)
        r.on_data(h, buf, len(buf), time.monotonic())
    assert r.stopped and not eng._in_repair()
