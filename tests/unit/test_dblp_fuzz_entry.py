"""Fuzzing every entry point with production defaults: data, control, join, TCP framing.

The engines here are built the way ``ParameterServer`` builds them (the
``TransportConfig`` defaults, a job secret). Each input is either a mutation
of a valid message left unsealed (the MAC must stop it), or a mutation sealed
with the job's key (a member gone wrong: the parser and the state machines
must cope). Join payloads are random JSON-ish documents (deep nesting, huge
and non-finite numbers, wrong types); TCP input is random byte streams over
real sockets. Nothing may raise and no buffer may grow past its cap.
"""
import json
import random
import socket
import time

import numpy as np
import pytest

from dblp import TransportConfig, wire
from dblp.engine import PULL, PUSH, Engine, InTransfer, OutTransfer
from dblp.join import Refused, Rendezvous, parse_hello, parse_welcome
from dblp.wire import CHUNK_ELEMS, Flag, MsgType

pytestmark = pytest.mark.unit

CFG = TransportConfig(secret="a5" * 32, session_id=0x0DDBA11)
KEY = CFG.key
SESSION = CFG.session_id
ROUND = 3
NUMEL = 20 * CHUNK_ELEMS + 5
COUNT = -(-NUMEL // CHUNK_ELEMS)
SEAL = wire.Sealer(KEY)


def _server(sink) -> Engine:
    eng = Engine(2, bind=("127.0.0.1", 0), session=SESSION, key=KEY,
                 early_bytes=CFG.early_bytes, hello_timeout=CFG.hello_timeout)
    rv = Rendezvous(eng, [0, 1], {"session": SESSION, "world_size": 2, "mode": "ps",
                                  "server_rank": 2, "policy": "dblp", "bound_ppm": 8000},
                    want_tcp=False, include_table=False, listen=None)
    rv.addrs = {0: sink.getsockname(), 1: sink.getsockname()}
    rv.nonces = {0: [5], 1: [6]}
    rv.numel = NUMEL
    eng.peers.addrs = dict(rv.addrs)
    eng.begin_round(ROUND)
    return eng


def _round(eng):
    acc = np.zeros(NUMEL, np.float32)
    for m in (0, 1):
        eng.add_receiver(InTransfer(eng, PUSH, 0, m, acc, 8000, add=True, freeze=True))
    eng.add_sender(OutTransfer(eng, PULL, 0, 0, np.ones(NUMEL, np.float32), 8000))
    eng.add_receiver(InTransfer(eng, PULL, 1, 1, np.zeros(NUMEL, np.float32), 0, add=False,
                                freeze=False))
    return acc


def _bodies():
    """Valid message bodies (header + payload) of every type, this round and others."""
    pay = np.ones(CHUNK_ELEMS, np.float32).tobytes()
    bm = bytes((COUNT + 7) // 8)
    out = []
    for rnd in (ROUND, ROUND + 1, ROUND - 1):
        for src in (0, 1):
            out.append(wire.pack_body(MsgType.DATA, pay, src=src, session=SESSION, round=rnd,
                                      index=src, count=COUNT, aux=1))
            out.append(wire.pack_body(MsgType.PROBE, src=src, session=SESSION, round=rnd,
                                      index=7, count=COUNT, copies=16))
            for t in (MsgType.BITMAP, MsgType.STOP, MsgType.FINAL):
                payload = wire.final_payload(bm, bm) if t == MsgType.FINAL else bm
                out.append(wire.pack_body(t, payload, src=src,
                                          session=SESSION, round=rnd, index=2, count=COUNT,
                                          flags=Flag.PULL, copies=16))
            out.append(wire.pack_body(MsgType.DONE, src=src, session=SESSION, round=rnd,
                                      flags=Flag.PULL))
    hello = json.dumps({"rank": 0, "numel": NUMEL, "nonce": 9}).encode()
    out.append(wire.pack_body(MsgType.HELLO, hello, src=0, session=0))
    return out


def _mutate(rng: random.Random, b: bytearray) -> bytearray:
    op = rng.randrange(6)
    if op == 0:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 1:
        b[rng.randrange(wire.HEADER_SIZE)] = rng.randrange(256)
    elif op == 2:
        del b[rng.randrange(len(b)):]
    elif op == 3:
        b += rng.randbytes(rng.randint(1, 80))
    elif op == 4:
        b = bytearray(rng.randbytes(rng.randint(0, 1600)))
    else:
        off = rng.choice([wire.FIELD_OFFSETS[k][0] for k in ("index", "count", "length", "part",
                                                             "round", "copies", "bound")])
        b[off:off + 2] = rng.randbytes(2)
    return b


def _fix_length(b: bytearray) -> None:
    """Make the length field agree, so a sealed mutation gets past the size checks."""
    if len(b) >= wire.HEADER_SIZE:
        off = wire.FIELD_OFFSETS["length"][0]
        b[off:off + 2] = min(0xFFFF, len(b) - wire.HEADER_SIZE).to_bytes(2, "big")


def _json_junk(rng: random.Random, depth=0):
    k = rng.randrange(10)
    if depth > 3 or k < 3:
        return rng.choice([0, -1, 1, 2**70, 1.5, 1e308, True, None, "", "x" * 30, "0",
                           NUMEL, 65535, 2**62])
    if k < 6:
        return [_json_junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["rank", "numel", "nonce", "mode", "session", "peers", "world_size", "bound_ppm"]
    return {rng.choice(keys): _json_junk(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def _join_payload(rng: random.Random) -> bytes:
    k = rng.randrange(6)
    if k == 0:
        return rng.choice([b"[" * rng.randint(500, 1400), b"{" * 700, b'{"rank": 1e999}',
                           b'{"rank": NaN}', b'{"rank": -Infinity}', b"\xff" * 10, b"",
                           b"9" * 1400, b'{"rank": 0, "numel": 1, "nonce": 1}' * 3])
    obj = _json_junk(rng)
    if k < 3:
        obj = {"rank": rng.choice([0, 1, 2, 7, 1e999 if False else 2**40]),
               "numel": rng.choice([NUMEL, 0, -5, 2**41]), "nonce": rng.choice([9, 0, 2**62]),
               **(obj if isinstance(obj, dict) else {})}
    text = json.dumps(obj).encode()
    return text[:wire.MAX_PAYLOAD]


def test_fuzz_data_control_and_join_with_production_defaults(sink):
    rng = random.Random(13)
    eng = _server(sink)
    acc = _round(eng)
    bodies = _bodies()
    pinned, other = sink.getsockname(), ("127.0.0.1", 9)
    n = 0
    t0 = time.monotonic()
    for i in range(80_000):
        b = _mutate(rng, bytearray(rng.choice(bodies)))
        if i % 2:  # a member with the key gone wrong: sealed, so the parser is reached
            _fix_length(b)
            raw = SEAL.seal(b, 2)
        else:  # anyone else: unsealed or zero-tagged
            raw = bytes(b) + (wire.ZERO_TAG if i % 4 else b"")
        eng.handle(memoryview(raw), len(raw), pinned if i % 3 else other, None, time.monotonic())
        n += 1
        assert eng.early.size <= CFG.early_bytes
    for i in range(20_000):  # join: HELLOs with hostile JSON, sealed and not
        pay = _join_payload(rng)
        body = wire.pack_header(MsgType.HELLO, src=rng.choice([0, 1, 2, 9]),
                                session=rng.choice([0, SESSION, 1]), length=len(pay)) + pay
        raw = SEAL.seal(body, 2) if i % 4 else body + wire.ZERO_TAG
        eng.handle(memoryview(raw), len(raw), pinned if i % 5 else other, None, time.monotonic())
        n += 1
    for _ in range(10_000):  # the member side's parsers directly
        pay = _join_payload(rng)
        for parse in (parse_hello, lambda p: parse_welcome(p, 0)):
            try:
                parse(pay)
            except Refused:
                pass
        n += 1
    c = eng.counters
    elapsed = time.monotonic() - t0
    assert n >= 110_000
    # From the pinned address a forged datagram meets the MAC (unauthenticated); from any
    # other one it is dropped before it (foreign), as is another session.
    assert c.unauthenticated > 20_000 and c.malformed > 1_000 and c.foreign > 1_000
    assert acc.shape == (NUMEL,) and np.isfinite(acc).all()
    assert eng.peers.addrs == {0: pinned, 1: pinned}  # no join moved a pinned address
    assert elapsed < 60, elapsed
    eng.close()


def _frame(msg: bytes) -> bytes:
    return len(msg).to_bytes(2, "big") + msg


def test_fuzz_tcp_framing_with_production_defaults(sink):
    """Random byte streams on unbound and bound TCP control connections."""
    from dblp.framing import TcpControl
    rng = random.Random(29)
    eng = _server(sink)
    acc = _round(eng)
    bodies = _bodies()
    inputs = 0
    lis = socket.create_server(("127.0.0.1", 0))
    for i in range(3_000):
        a = socket.create_connection(lis.getsockname())
        b, _ = lis.accept()
        conn = TcpControl(b, peer=None if i % 2 else rng.choice([0, 1]))
        if conn.peer is not None:
            eng.peers.tcp[conn.peer] = conn
        eng.register_tcp(conn, max_unbound=10)
        stream = bytearray()
        for _ in range(rng.randint(1, 6)):
            k = rng.randrange(5)
            body = bytearray(rng.choice(bodies))
            if k == 0:
                stream += _frame(SEAL.seal(body, 2))
            elif k == 1:
                stream += _frame(SEAL.seal(_mutate(rng, body), 2))
            elif k == 2:
                stream += _frame(bytes(_mutate(rng, body)))
            elif k == 3:
                stream += rng.randbytes(rng.randint(0, 200))
            else:
                stream += rng.randint(0, 65535).to_bytes(2, "big") + rng.randbytes(30)
        try:
            a.sendall(bytes(stream))
            if rng.random() < 0.5:
                a.close()
            eng.poll(0.0)
            eng.poll(0.0)
        finally:
            a.close()
        inputs += 1
        assert len(eng.joining.unbound) <= 10
        assert len(conn.rx) <= 2 + wire.MAX_DATAGRAM
        if conn.peer is not None and eng.peers.tcp.get(conn.peer) is conn:
            del eng.peers.tcp[conn.peer]
        eng.poll(0.0)
        conn.close()
    assert inputs == 3_000
    assert np.isfinite(acc).all()
    lis.close()
    eng.close()
