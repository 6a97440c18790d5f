"""Fuzzing the datagram parser and the receiver state machine.

A seeded mutation loop feeds >= 100,000 inputs (bit flips, truncations,
extensions, foreign sessions, stale and future rounds, random bytes, valid
control messages out of context) through ``Engine.handle`` and the real socket
path; hypothesis checks that foreign, stale, duplicate, truncated and random
datagrams never change an aggregate.
"""
import random
import socket
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dblp import wire
from dblp.engine import PULL, PUSH, Engine, InTransfer, OutTransfer
from dblp.wire import CHUNK_BYTES, CHUNK_ELEMS, Flag, MsgType

pytestmark = pytest.mark.unit

SESSION = 0x1234_5678_9ABC_DEF1
ROUND = 5
NUMEL = 40 * CHUNK_ELEMS + 17  # 41 chunks, a short last one
S0, S1 = wire.FIELD_OFFSETS["session"][0], sum(wire.FIELD_OFFSETS["session"])
R0, R1 = wire.FIELD_OFFSETS["round"][0], sum(wire.FIELD_OFFSETS["round"])


def _engine(sink, early_cap=256):
    eng = Engine(2, bind=("127.0.0.1", 0), session=SESSION, early_cap=early_cap)
    eng.peers.addrs = {0: sink.getsockname(), 1: sink.getsockname()}
    eng.begin_round(ROUND)
    return eng


def _member_data(m):
    return np.random.default_rng(m).standard_normal(NUMEL).astype(np.float32)


def _chunks(m, session=SESSION, round=ROUND):
    data = _member_data(m)
    raw = data.view(np.uint8)
    count = -(-data.nbytes // CHUNK_BYTES)
    out = []
    for c in range(count):
        pay = raw[c * CHUNK_BYTES:(c + 1) * CHUNK_BYTES].tobytes()
        out.append(wire.pack(MsgType.DATA, pay, src=m, part=0, session=session, round=round,
                             index=c, count=count, bound=0, aux=1))
    return out


def _setup_round(eng, bound_ppm=0):
    acc = np.zeros(NUMEL, np.float32)
    recvs = [InTransfer(eng, PUSH, 0, m, acc, bound_ppm, add=True, freeze=True) for m in (0, 1)]
    for r in recvs:
        eng.add_receiver(r)
    pull_out = np.zeros(NUMEL, np.float32)
    pull_in = InTransfer(eng, PULL, 0, 1, pull_out, 0, add=False, freeze=False)
    eng.add_receiver(pull_in)
    sender = OutTransfer(eng, PULL, 0, 0, _member_data(0), 0)
    eng.add_sender(sender)
    return acc, recvs, pull_in, sender


def _feed(eng, raw):
    """As if from the members' (pinned) address: both members share the sink's."""
    eng.handle(memoryview(raw), len(raw), eng.peers.addrs[0], None, time.monotonic())


def _truth():
    return (_member_data(0).astype(np.float32) + _member_data(1)).astype(np.float32)


def _corpus():
    count = 41
    c = _chunks(0)[:3] + _chunks(1)[:3]
    bm = bytes((count + 7) // 8)
    for t in (MsgType.PROBE, MsgType.DONE):
        c.append(wire.pack(t, src=0, session=SESSION, round=ROUND, count=count))
    for t in (MsgType.BITMAP, MsgType.STOP, MsgType.FINAL):
        payload = wire.final_payload(bm, bm) if t == MsgType.FINAL else bm
        c.append(wire.pack(t, payload, src=1, session=SESSION,
                           round=ROUND, count=count, flags=Flag.PULL))
    c.append(wire.pack(MsgType.HELLO, b'{"rank": 0, "numel": 5}', src=0))
    return c


def _mutate(rng: random.Random, base: bytes) -> bytes:
    b = bytearray(base)
    op = rng.randrange(8)
    if op == 0:  # flip bytes anywhere
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 1:  # flip header bytes only
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(wire.HEADER_SIZE)] = rng.randrange(256)
    elif op == 2:  # truncate
        del b[rng.randrange(len(b)):]
    elif op == 3:  # extend
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif op == 4:  # random bytes
        b = bytearray(rng.randbytes(rng.randint(0, 1600)))
    elif op == 5:  # foreign session
        b[S0:S1] = rng.randrange(2**64).to_bytes(8, "big")
    elif op == 6:  # another round (stale or future)
        b[R0:R1] = rng.choice([0, ROUND - 1, ROUND + 1, ROUND + 2, 2**32 - 1]).to_bytes(4, "big")
    else:  # another field value inside an otherwise valid header
        off = rng.choice([wire.FIELD_OFFSETS[k][0] for k in ("flags", "copies", "src", "part",
                                                             "index", "count", "bound", "aux")])
        b[off] = rng.randrange(256)
    return bytes(b)


def test_fuzz_100k_inputs_never_raise_and_stay_bounded(sink):
    eng = _engine(sink, early_cap=256)
    acc, recvs, pull_in, sender = _setup_round(eng, bound_ppm=0)
    rng = random.Random(20260)
    corpus = _corpus()
    shapes = (acc.shape, recvs[0].have.shape, pull_in.have.shape)
    n = 0
    for _ in range(100_000):
        _feed(eng, _mutate(rng, rng.choice(corpus)))
        n += 1
        assert len(eng.early) <= 256
    # the real socket path too
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(3000):
        tx.sendto(_mutate(rng, rng.choice(corpus)) or b"x", eng.address)
        n += 1
        if i % 200 == 199:
            eng.poll(0.01)
    eng.poll(0.05)
    tx.close()
    assert n >= 100_000
    c = eng.counters
    assert c.malformed > 10_000 and c.foreign > 1_000 and c.stale > 100
    assert (acc.shape, recvs[0].have.shape, pull_in.have.shape) == shapes
    assert len(eng.early) <= 256 and c.early_dropped > 0
    # memory stays bounded however long the junk goes on (the early buffer is full now)
    import tracemalloc
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(20_000):
        _feed(eng, _mutate(rng, rng.choice(corpus)))
    grown = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert grown < 1 << 20, grown
    eng.close()


def test_foreign_sessions_never_enter_the_aggregate(sink):
    eng = _engine(sink)
    acc, recvs, _, _ = _setup_round(eng, bound_ppm=0)
    # a whole other job's streams, plus mutated copies, before and between real chunks
    other = _chunks(0, session=SESSION ^ 1) + _chunks(1, session=0)
    for raw in other:
        _feed(eng, raw)
    assert not acc.any() and not any(r.n_have for r in recvs)
    for a, b in zip(_chunks(0), _chunks(1), strict=True):
        _feed(eng, a[:S0] + (SESSION ^ 99).to_bytes(8, "big") + a[S1:])
        _feed(eng, a)
        _feed(eng, b)
    assert np.array_equal(acc, _truth())
    assert all(r.stopped for r in recvs)
    eng.close()


JUNK = st.sampled_from(["foreign", "stale", "future", "duplicate", "truncated", "random",
                        "bitflip_foreign"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(JUNK, st.integers(0, 81), st.binary(max_size=80)), max_size=60),
       st.integers(0, 300_000), st.randoms(use_true_random=False))
def test_junk_never_changes_the_result(sink, junk, bound_ppm, rnd):
    valid = [x for pair in zip(_chunks(0), _chunks(1), strict=True) for x in pair]
    rnd.shuffle(valid)

    def run(with_junk):
        eng = _engine(sink)
        acc, recvs, _, _ = _setup_round(eng, bound_ppm)
        inserts = {}
        if with_junk:
            for kind, pos, blob in junk:
                base = valid[pos % len(valid)]
                if kind == "foreign":
                    raw = base[:S0] + (SESSION + 1).to_bytes(8, "big") + base[S1:]
                elif kind == "stale":
                    raw = base[:R0] + (ROUND - 1).to_bytes(4, "big") + base[R1:]
                elif kind == "future":
                    raw = base[:R0] + (ROUND + 3).to_bytes(4, "big") + base[R1:]
                elif kind == "duplicate":
                    raw = base  # a true duplicate: inserted after its original
                    pos = max(pos, valid.index(base) + 1)
                elif kind == "truncated":
                    raw = base[:max(0, len(base) - 1 - len(blob))]
                elif kind == "random":
                    raw = blob
                else:
                    raw = bytearray(base)
                    raw[S0] ^= 0x80  # session differs in one bit, payload intact
                    raw = bytes(raw)
                inserts.setdefault(pos, []).append(raw)
        for i, raw in enumerate(valid):
            for j in inserts.get(i, []):
                _feed(eng, j)
            _feed(eng, raw)
        for j in inserts.get(len(valid), []) + inserts.get(len(valid) + 1, []):
            _feed(eng, j)
        out = (acc.copy(), [r.have.copy() for r in recvs], [r.stopped for r in recvs])
        eng.close()
        return out

    clean, dirty = run(False), run(True)
    assert np.array_equal(clean[0], dirty[0])
    assert all(np.array_equal(a, b) for a, b in zip(clean[1], dirty[1], strict=True))
    assert clean[2] == dirty[2] == [True, True]
    if bound_ppm == 0:
        assert np.array_equal(clean[0], _truth())
