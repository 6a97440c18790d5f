"""Probe timeouts that were late answers, not losses (``OutTransfer._late_probes``).

On a fast link a receiver can queue tens of milliseconds of datagrams ahead
of a PROBE. The RTO learnt on the idle link (2 ms) then fires several times
per wait, and each timeout raised the loss estimate: probes and replies went
out up to 16 times over on a loss-free link. An answer shows what happened:
it names the probe it answers, and a STOP sent unasked left after the pass.
"""
import time

import numpy as np
import pytest

from dblp import wire
from dblp.engine import PUSH, OutTransfer
from dblp.streams import PROBING, pack_bitmap
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

SESSION, ROUND, PEER = 0xBEEF, 2, 2


@pytest.fixture
def waiting(loopback_engine):
    """A sender whose pass is out and whose first probe has timed out twice."""
    eng = loopback_engine
    assert (eng.session, eng.round, PEER in eng.peers.addrs) == (SESSION, ROUND, True)
    s = OutTransfer(eng, PUSH, 0, PEER, np.arange(20 * wire.CHUNK_ELEMS, dtype=np.float32), 0)
    eng.add_sender(s)
    end = time.monotonic() + 5
    while s.state != PROBING and time.monotonic() < end:
        eng._send_some(time.monotonic())
    assert s.state == PROBING and s.probe_id == 1
    t_probe = s.probe_times[1]
    for _ in range(2):
        s.on_timer(s.next_probe_t)
    assert s.probe_id == 3 and eng.peers.loss[PEER] == 0.5 and eng.copies(PEER) > 1
    yield eng, s, t_probe


def _stop(s: OutTransfer, probe_id: int):
    body = wire.pack(MsgType.STOP, pack_bitmap(np.ones(s.count, bool)), src=PEER, part=0,
                     session=SESSION, round=ROUND, index=probe_id, count=s.count)
    return wire.unpack(body)


def test_an_answer_to_an_earlier_probe_undoes_the_timeouts(waiting):
    eng, s, t_probe = waiting
    h, payload = _stop(s, 1)
    now = t_probe + 0.030
    s.on_reply(h, payload, now)
    assert eng.peers.loss[PEER] == 0.0  # late, not lost: the STOP's own sample is loss-free too
    assert eng.peers.rtt(PEER).srtt == pytest.approx(0.030)


def test_an_answer_to_the_newest_probe_keeps_them(waiting):
    eng, s, t_probe = waiting
    h, payload = _stop(s, 3)
    s.on_reply(h, payload, s.probe_times[3] + 0.001)
    assert eng.peers.loss[PEER] == pytest.approx(0.125)  # 0.5, then one loss-free sample (x 0.25)


def test_an_answer_to_a_probe_of_an_earlier_wait_keeps_them(waiting):
    """Probe 1 belongs to a wait before this one (a resend pass since): its answer, however
    late, says nothing of whether this wait's probes were lost."""
    eng, s, t_probe = waiting
    s.probe_first = 2
    body = wire.pack(MsgType.BITMAP, pack_bitmap(np.ones(s.count, bool)), src=PEER, part=0,
                     session=SESSION, round=ROUND, index=1, count=s.count)
    s._late_probes(wire.unpack(body)[0], t_probe + 0.030)
    assert eng.peers.loss[PEER] == 0.5


def test_a_stop_sent_unasked_is_a_round_trip_sample_and_undoes_them(waiting):
    """The STOP left when the last chunk of the pass arrived, before the first probe
    could: the time since that probe is a round trip it needed at least."""
    eng, s, t_probe = waiting
    before = eng.peers.rtt(PEER).samples
    h, payload = _stop(s, 0)
    s.on_reply(h, payload, t_probe + 0.025)
    assert eng.peers.rtt(PEER).samples == before + 1
    assert eng.peers.rtt(PEER).srtt == pytest.approx(0.025)
    assert eng.peers.loss[PEER] == 0.0
    assert eng.probe_timeout(PEER, 1.0) > 0.025  # the next wait outlasts such a queue
