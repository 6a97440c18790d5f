"""Pacing per destination: the sharded mode's guard against piling into one downlink.

When a rank's transfers to the other peers are done, round-robin alone would
hand the whole rate to the last one; with N-1 ranks doing that at once, one
downlink is offered N-1 times its line rate. The per-peer bucket caps each
destination at rate/(N-1). Real sockets on loopback, real Engine.
"""
import socket
import time

import pytest

from dblp.engine import Engine
from dblp.streams import PULL, PUSH

CHUNK = b"x" * 1400


class _Stream:
    """The slice of OutTransfer that Engine._send_some drives: a kind, a peer and datagrams."""

    def __init__(self, eng, peer, n, kind=PUSH, part=0, log=None):
        self.eng, self.peer, self.left, self.kind, self.part = eng, peer, n, kind, part
        self.log = log if log is not None else []

    def has_pending(self):
        return self.left > 0

    def send_next(self, now):
        n = self.eng.send_data(b"h" * 40, CHUNK, self.peer)
        if n:
            self.left -= 1
            self.log.append((self.peer, self.part))
        return n


def _drive(peer_rate, pending, seconds=0.4, kinds=None, count=10_000):
    sinks = {p: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for p in (1, 2)}
    for s in sinks.values():
        s.bind(("127.0.0.1", 0))
    # One datagram per send (the slice above has no send_batch): the pacing is what is tested.
    eng = Engine(0, bind=("127.0.0.1", 0), rate_bps=8e6, peer_rate_bps=peer_rate,
                 batched_io=False)
    try:
        eng.peers.addrs = {p: s.getsockname() for p, s in sinks.items()}
        kinds = kinds or [PUSH] * len(pending)
        streams = [_Stream(eng, p, count, k) for p, k in zip(pending, kinds, strict=True)]
        eng.active = list(streams)  # the engine drops a stream from it once it is done
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            wake = eng._send_some(time.monotonic())
            time.sleep(max(0.0, min(wake - time.monotonic(), 0.002)))
        return [count - x.left for x in streams] if kinds.count(PUSH) != len(kinds) \
            else {x.peer: count - x.left for x in streams}
    finally:
        eng.close()
        for s in sinks.values():
            s.close()


@pytest.mark.unit
def test_one_destination_gets_only_its_share_when_capped():
    # 8 Mbit/s ~ 680 datagrams/s of 1482 wire bytes; 0.4 s ~ 270 (+ the bucket's depth).
    alone = _drive(None, [1])[1]
    capped = _drive(4e6, [1])[1]
    assert alone > 200
    assert capped < 0.65 * alone          # half the rate, plus the same initial burst


@pytest.mark.unit
def test_two_destinations_share_the_rate_evenly_with_a_cap():
    sent = _drive(4e6, [1, 2])
    assert abs(sent[1] - sent[2]) <= 0.1 * max(sent.values())
    total_alone = _drive(None, [1])[1]
    assert sum(sent.values()) > 0.8 * total_alone   # the cap does not cost the total rate


@pytest.mark.unit
def test_peer_rate_is_validated():
    with pytest.raises(ValueError, match="peer_rate_bps"):
        Engine(0, bind=("127.0.0.1", 0), peer_rate_bps=0)


@pytest.mark.unit
def test_a_push_goes_before_a_pull_and_the_pull_takes_the_rest():
    """A pull carries what the other side's push delivered: serving it while a push
    waits only delays the peers' pulls (the sharded round's tail at 1 Gbit/s)."""
    # listed pull first: the order of ``active`` must not matter. 0.4 s at 8 Mbit/s
    # carries ~270 datagrams: the push's 150 go first, the pull gets the rest.
    pull, push = _drive(None, [1, 1], kinds=[PULL, PUSH], count=150)
    assert push == 150
    assert 50 <= pull < 150


@pytest.mark.unit
def test_one_destinations_parts_leave_one_at_a_time_lowest_first():
    """Its owner then has a whole part early and pulls it while the next one is pushed
    (a parameter server's parts, taking turns, all finished at the push's end). Two
    destinations still take turns."""
    sinks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for s in sinks:
        s.bind(("127.0.0.1", 0))
    eng = Engine(0, bind=("127.0.0.1", 0), rate_bps=40e6, batched_io=False)
    try:
        eng.peers.addrs = {1: sinks[0].getsockname(), 2: sinks[1].getsockname()}
        log: list = []
        # listed out of order: the part index decides, not the list
        eng.active = [_Stream(eng, 1, 60, part=2, log=log), _Stream(eng, 1, 60, part=0, log=log),
                      _Stream(eng, 2, 60, part=1, log=log)]
        end = time.monotonic() + 5
        while eng.active and time.monotonic() < end:
            wake = eng._send_some(time.monotonic())
            time.sleep(max(0.0, min(wake - time.monotonic(), 0.002)))
    finally:
        eng.close()
        for s in sinks:
            s.close()
    to_one = [part for peer, part in log if peer == 1]
    assert to_one == [0] * 60 + [2] * 60
    first = log[:60]
    assert (1, 0) in first and (2, 1) in first   # the other destination is not kept waiting


@pytest.mark.unit
def test_a_pull_uses_the_link_while_the_push_waits_for_its_destinations_tokens():
    pull, push = _drive(4e6, [2, 1], kinds=[PULL, PUSH])
    assert push > 50 and pull > 50    # each destination its capped half
