"""Sharded rounds never wait for a FINAL until the deadline, even when the caller pauses.

A rank that has everything it needs may return from ``allreduce_`` while the
FINAL it owes a peer was lost; if the caller then blocks outside the
transport (a barrier, another collective, the bench's driver), nobody
retransmits it and the peer sits "stopped, waiting for FINAL" until the
round deadline. The bench loses packets on receive in both directions
(nftables ``numgen`` drop on the input hook); ``fault_rx_drop`` does the same
inside the engine.
"""
import threading
import time

import numpy as np
import pytest

import dblp
from dblp.testing import free_port
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

_TYPE_OFF = dblp.wire.FIELD_OFFSETS["type"][0]
_FLAGS_OFF = dblp.wire.FIELD_OFFSETS["flags"][0]


class _DropSocket:
    """Wraps an engine's UDP socket: drops the first ``n`` received datagrams of some types.

    ``push_only`` drops only replies to push streams (no PULL flag).
    """

    def __init__(self, sock, mtypes, n: int, push_only: bool = False):
        self._sock, self.mtypes, self.left = sock, {int(t) for t in mtypes}, n
        self.push_only = push_only

    def _match(self, buf, n) -> bool:
        if n <= _FLAGS_OFF or buf[_TYPE_OFF] not in self.mtypes:
            return False
        return not (self.push_only and buf[_FLAGS_OFF] & dblp.wire.Flag.PULL)

    def recvfrom_into(self, buf):
        while True:
            n, addr = self._sock.recvfrom_into(buf)
            if self.left and self._match(buf, n):
                self.left -= 1
                continue
            return n, addr

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _sharded_with_barrier(rounds, numel, *, fault=0.0, deadline=5.0, drop=None, **knobs):
    """Two sharded ranks with a barrier outside the transport between rounds."""
    port = free_port()
    bar = threading.Barrier(2)
    out, errors = {}, []

    def work(rank):
        g = dblp.TransportGroup(rank, 2, "127.0.0.1", port, mode="sharded",
                                round_timeout=deadline, fault_rx_drop=fault, **knobs)
        grad = np.random.default_rng(rank).standard_normal(numel).astype(np.float32)
        times = []
        try:
            for r in range(rounds):
                if drop is not None and r == drop[0] and rank == drop[1]:
                    g.engine.sock = _DropSocket(g.engine.sock, **drop[2])
                t0 = time.monotonic()
                g.allreduce_(grad.copy())
                times.append(time.monotonic() - t0)
                bar.wait(60)
        except Exception as exc:
            errors.append(exc)
            bar.abort()
        finally:
            out[rank] = times
            g.engine.close()
    ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out, errors


def test_lost_final_is_repeated_while_the_owner_waits_outside_the_transport():
    """The first three FINAL transmissions to rank 0 are lost: recovered in milliseconds."""
    out, errors = _sharded_with_barrier(3, 50_000, drop=(1, 0, {"mtypes": [MsgType.FINAL], "n": 3}),
                                        policy="static", p=0.008)
    assert not errors, errors
    assert max(out[0] + out[1]) < 1.0, out


def test_lost_push_stop_is_overtaken_by_the_final():
    """Rank 0 never hears its push STOP (nor a BITMAP): the owner's FINAL ends the push."""
    lose = {"mtypes": [MsgType.STOP, MsgType.BITMAP], "n": 10**6, "push_only": True}
    out, errors = _sharded_with_barrier(3, 50_000, drop=(1, 0, lose), policy="static", p=0.008)
    assert not errors, errors
    assert max(out[0] + out[1]) < 1.0, out


@pytest.mark.parametrize("policy,knobs,fault", [("static", {"p": 0.008}, 0.3),
                                                ("reliable", {}, 0.5)])
def test_sharded_rounds_under_bench_loss_never_reach_the_deadline(policy, knobs, fault):
    out, errors = _sharded_with_barrier(40, 50_000, fault=fault, deadline=5.0, policy=policy,
                                        **knobs)
    assert not errors, errors[0]
    assert len(out[0]) == len(out[1]) == 40
    assert max(out[0] + out[1]) < 2.5, sorted(out[0] + out[1])[-3:]


def test_a_round_refuses_a_result_it_cannot_sum_an_owned_part_in():
    """An owner sums its part in ``result`` itself: a float64 or strided result is refused
    at once, with what it must be, before anything is sent."""
    from dblp.engine import Engine
    from dblp.rounds import make_layout, run_round
    eng = Engine(0, bind=("127.0.0.1", 0))
    try:
        eng.begin_round(0)
        parts = make_layout(100, "sharded", 2)
        grad = np.ones(100, np.float32)
        for bad in (np.zeros(100, np.float64), np.zeros(200, np.float32)[::2]):
            with pytest.raises(ValueError, match="contiguous float32"):
                run_round(eng, parts, [0, 1], grad, bad, 0, "zero", 1.0)
        assert eng.bytes_sent == 0
    finally:
        eng.close()
