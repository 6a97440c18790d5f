"""Forged and hostile input against real aggregators on loopback, as anyone on the network could.

Each test reproduces one way a handful of datagrams (or TCP bytes) used to
disclose the session, inject into the aggregate, crash the server, amplify
replies, leak descriptors or take over a control connection. The unkeyed
tests run the job without a secret (the address pinned at join is then the
only proof of identity); the keyed ones give the job a secret, as a launcher
does, and forge without it.
"""
import json
import os
import secrets
import socket
import threading
import time

import numpy as np
import pytest

import dblp
from dblp import sockfilter, wire
from dblp.wire import Flag, MsgType

pytestmark = pytest.mark.unit

SECRET = secrets.token_hex(32)
_OFF = {k: v[0] for k, v in wire.FIELD_OFFSETS.items()}


def _seal(body: bytes, key: bytes | None = None, dst: int = 2) -> bytes:
    """A whole message for rank ``dst`` (the server of a 2-member job unless told): the body
    plus the trailer the wire format declares."""
    return wire.Sealer(key).seal(body, dst)


def _hello(rank: int, numel: int, session: int = 0, payload=None, key=None) -> bytes:
    obj = {"rank": rank, "numel": numel, "mode": "ps", "nonce": secrets.randbits(60) | 1}
    raw = json.dumps(obj if payload is None else payload).encode() if not isinstance(
        payload, bytes) else payload
    return _seal(wire.pack_header(MsgType.HELLO, src=rank, session=session, length=len(raw))
                 + raw, key)


def _attacker() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(0.3)
    return s


def _replies(sock: socket.socket, wait: float = 0.3) -> list[bytes]:
    out, end = [], time.monotonic() + wait
    while time.monotonic() < end:
        try:
            out.append(sock.recv(65536))
        except (TimeoutError, BlockingIOError):
            break
    return out


class _Job:
    """A parameter server and ``n`` workers in threads; rounds are released one at a time."""

    def __init__(self, n=2, numel=5_000, rounds=2, hook=None, **settings):
        self.n, self.numel, self.rounds = n, numel, rounds
        self.srv = dblp.ParameterServer("127.0.0.1", 0, n, "reliable", round_timeout=10,
                                        **settings)
        self.go = [threading.Event() for _ in range(rounds)]
        self.hooked = [threading.Event() for _ in range(rounds)]  # the server ran hook(r)
        self.done = [threading.Barrier(n + 1) for _ in range(rounds)]
        self.results: dict = {}
        self.errors: list = []
        self.groups: dict = {}
        self.settings = settings

        def start(r):
            if hook is not None:
                hook(self, r)
            self.hooked[r].set()

        def serve():
            try:
                self.srv.serve(rounds, on_round_start=start)
            except Exception as exc:
                self.errors.append(exc)
        self.threads = [threading.Thread(target=serve)]
        self.threads += [threading.Thread(target=self._work, args=(w,)) for w in range(n)]
        for t in self.threads:
            t.start()

    def _work(self, w):
        try:
            g = dblp.TransportGroup(w, self.n, "127.0.0.1", self.srv.port, policy="reliable",
                                    round_timeout=10, **self.settings)
            self.groups[w] = g
            for r in range(self.rounds):
                self.go[r].wait(30)
                t = np.full(self.numel, float(w + 1), np.float32)
                g.allreduce_(t)
                self.results[(w, r)] = t
                self.done[r].wait(30)
            g.close()
        except Exception as exc:
            self.errors.append(exc)
            for b in self.done:
                b.abort()

    def wait_finished(self, r):
        """Called from a hook: until every worker has returned from round ``r``."""
        end = time.monotonic() + 30
        while not all((w, r) in self.results for w in range(self.n)) and time.monotonic() < end:
            self.srv.engine.poll(0.01)

    def round(self, r):
        """Release round ``r`` (from 1 on, once the server's hook is through) and wait for it."""
        if r:
            self.hooked[r].wait(30)
        self.go[r].set()
        self.done[r].wait(30)

    def finish(self):
        for t in self.threads:
            t.join(30)
        self.srv.close()


def _two_rounds(n, numel, hook, keyed, before=None, **settings) -> _Job:
    """Run rounds 0 and 1 of a job (with the job secret if ``keyed``); the hook forges.

    ``before(job)`` runs while the server waits for the workers to join.
    """
    if keyed:
        settings["secret"] = SECRET
    job = _Job(n, numel, 2, hook, **settings)
    try:
        if before is not None:
            before(job)
        job.round(0)
        job.round(1)
    except threading.BrokenBarrierError:
        pass  # a worker failed: job.errors says why
    finally:
        job.finish()
    assert not job.errors, job.errors
    return job


def _forged_data(session, src, round_, count, index, value, key=None):
    pay = np.full(wire.CHUNK_ELEMS, value, np.float32).tobytes()
    return _seal(wire.pack_header(MsgType.DATA, src=src, session=session, round=round_,
                                  index=index, count=count, length=len(pay), aux=1) + pay, key)


@pytest.mark.parametrize("keyed", [False, True], ids=["no-secret", "secret"])
def test_session_disclosure_then_injection_leaves_the_aggregate_unchanged(keyed):
    """HELLO with session 0 mid-job, then forged DATA with the (leaked) session id."""
    numel = 5_000
    count = -(-numel // wire.CHUNK_ELEMS)
    atk = _attacker()
    seen = {}

    def hook(job, r):
        if r != 1:
            return
        # the job has joined: try to learn the session as "rank 1"
        atk.sendto(_hello(1, numel), job.srv.address)
        seen["welcome"] = _replies(atk)
        # inject round 1 (buffered as next-round input), with the session as if leaked
        for c in range(count):
            atk.sendto(_forged_data(job.srv.session_id, 1, 1, count, c, 1e6), job.srv.address)
        time.sleep(0.05)
        job.srv.engine.poll(0.05)
        seen["dropped"] = sockfilter.socket_drops(job.srv.engine.sock) or 0

    try:
        job = _two_rounds(2, numel, hook, keyed)
    finally:
        atk.close()
    assert seen["welcome"] == []  # nothing told to a sender that is not rank 1
    for w in range(2):
        assert np.all(job.results[(w, 1)] == 1.5), job.results[(w, 1)][:4]  # the true mean
    c = job.srv.engine.counters
    # From the attacker's own address: dropped by address, before any MAC, keyed or not
    # (keyed: by the socket's kernel filter, dblp.sockfilter).
    assert c.unauthenticated + c.foreign + seen["dropped"] >= count


@pytest.mark.parametrize("keyed", [False, True], ids=["no-secret", "secret"])
def test_crash_datagrams_leave_the_server_serving(keyed):
    """HELLOs holding 1e999, deep nesting, floats, junk types: counted, never raised."""
    numel = 5_000
    key = bytes.fromhex(SECRET) if keyed else None
    bad = [{"rank": 1e999, "numel": numel}, {"rank": 1, "numel": 1e999},
           {"rank": "1", "numel": numel}, {"rank": True, "numel": numel}, [1, 2],
           {"rank": 1, "numel": numel, "nonce": 2**80}, b"[" * 1400, b"\xff\xfe",
           b'{"rank": NaN}', b"1" * 1400]
    atk = _attacker()
    sent = []

    def hook(job, r):
        for p in bad:
            for src in (0, 1):  # during and after the join of rank ``src``
                msg = _hello(src, numel, payload=p, key=key)
                atk.sendto(msg, job.srv.address)
                sent.append(msg)
        job.srv.engine.poll(0.05)

    def during_join(job):
        for p in bad:
            atk.sendto(_hello(1, numel, payload=p, key=key), job.srv.address)

    try:
        job = _two_rounds(2, numel, hook, keyed, before=during_join)
    finally:
        atk.close()
    assert all(np.all(job.results[(w, r)] == 1.5) for w in range(2) for r in range(2))
    assert len(sent) == 2 * 2 * len(bad)


@pytest.mark.parametrize("keyed", [False, True], ids=["no-secret", "secret"])
def test_copy_amplification_requests_get_bounded_replies(keyed):
    """300 PROBEs asking for 16 copies each, from the member's own address (a spoofer or
    a broken member): the aggregator answers each with what its own estimate justifies."""
    numel = 5_000
    count = -(-numel // wire.CHUNK_ELEMS)
    key = bytes.fromhex(SECRET) if keyed else None
    got = {}

    def hook(job, r):
        if r != 1:
            return
        job.wait_finished(0)
        g = job.groups[0]
        sock = g.engine.sock  # the member is between rounds: nobody else reads this socket
        sock.setblocking(True)
        sock.settimeout(0.3)
        _replies(sock, 0.05)
        for i in range(300):
            probe = wire.pack_header(MsgType.PROBE, src=0, session=job.srv.session_id, round=0,
                                     index=1000 + i, count=count, copies=16)
            sock.sendto(_seal(probe, key, dst=1), job.srv.address)  # server of 1 member
            if i % 50 == 49:
                job.srv.engine.poll(0.01)
        job.srv.engine.poll(0.05)
        got["replies"] = _replies(sock, 0.3)
        sock.setblocking(False)

    _two_rounds(1, numel, hook, keyed)
    # one reply per probe id at most (loss-free: one copy), never 16
    assert 0 < len(got["replies"]) <= 300, len(got["replies"])


def _round_of_ones(port: int, **settings) -> None:
    """A lone worker's round against a server that must still be serving."""
    with dblp.TransportGroup(0, 1, "127.0.0.1", port, **settings) as g:
        t = np.ones(1000, np.float32)
        g.allreduce_(t)
        assert np.all(t == 1)


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_tcp_connections_that_never_bind_do_not_keep_descriptors():
    """150 connect/close, then idle connects: the server keeps no descriptor for them."""
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", control="tcp", join_timeout=20,
                               hello_timeout=0.5)
    th = threading.Thread(target=lambda: srv.serve(1))
    th.start()
    try:
        time.sleep(0.1)
        base = _fd_count()
        for _ in range(150):
            c = socket.create_connection(("127.0.0.1", srv.port))
            c.close()
        time.sleep(0.3)
        assert _fd_count() <= base + 3, (base, _fd_count())
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        time.sleep(0.2)
        # at most world_size + 8 unbound connections are kept at any time
        assert len(srv.engine.joining.unbound) <= 9
        time.sleep(0.8)  # hello_timeout: the rest are closed too
        assert not srv.engine.joining.unbound
        for c in idle:
            c.settimeout(1)
            got = b""
            while chunk := c.recv(4096):  # the connection's nonce, then the server's close
                got += chunk
            assert len(got) < wire.MAX_DATAGRAM  # one small frame: no amplifier
            c.close()
        assert srv.engine.counters.foreign >= 20
        _round_of_ones(srv.port, control="tcp")
    finally:
        th.join(30)
        srv.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["no-secret", "secret"])
def test_tcp_hello_cannot_replace_the_real_control_connection(keyed):
    numel = 3_000
    key = bytes.fromhex(SECRET) if keyed else None
    stolen = []

    def hook(job, r):
        if r != 1:
            return
        job.wait_finished(0)
        real = job.srv.engine.peers.tcp[0]
        # a forged HELLO for rank 0, and (with a secret) a replay of its real join nonce
        nonces = [secrets.randbits(60) | 1] + job.srv.rendezvous.nonces[0][-1:]
        for nonce in nonces:
            body = json.dumps({"rank": 0, "numel": numel, "mode": "ps", "nonce": nonce}).encode()
            msg = _seal(wire.pack_header(MsgType.HELLO, src=0, session=job.srv.session_id,
                                         length=len(body)) + body, key, dst=1)
            c = socket.create_connection(("127.0.0.1", job.srv.port))
            c.sendall(len(msg).to_bytes(2, "big") + msg)
            stolen.append(c)
        time.sleep(0.05)
        job.srv.engine.poll(0.05)
        assert job.srv.engine.peers.tcp[0] is real

    try:
        job = _two_rounds(1, numel, hook, keyed, control="tcp")
    finally:
        for c in stolen:
            c.close()
    assert np.all(job.results[(0, 1)] == 1.0)


class _BoundRewriter:
    """Wraps a member's socket: every pull DATA it receives claims a 99.9999 % bound."""

    def __init__(self, sock):
        self._sock = sock

    def recvfrom_into(self, buf):
        n, addr = self._sock.recvfrom_into(buf)
        if n > wire.HEADER_SIZE and buf[_OFF["type"]] == MsgType.DATA \
                and buf[_OFF["flags"]] & Flag.PULL:
            buf[_OFF["bound"]:_OFF["bound"] + 4] = (wire.PPM - 1).to_bytes(4, "big")
        return n, addr

    def __getattr__(self, name):
        return getattr(self._sock, name)


def test_a_data_header_cannot_set_the_pull_bound():
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable")
    th = threading.Thread(target=lambda: srv.serve(1))
    th.start()
    try:
        with dblp.TransportGroup(0, 1, "127.0.0.1", srv.port, policy="reliable") as g:
            t = np.arange(20_000, dtype=np.float32)
            g.engine.sock = _BoundRewriter(g.engine.sock)
            g.allreduce_(t)
            r = g.last_result.pull_receivers[0]
            assert (r.bound_ppm, r.allowed) == (0, 0)
            assert r.t_stop is not None and r.n_have == r.count  # STOP only once all arrived
            assert np.array_equal(t, np.arange(20_000, dtype=np.float32))
    finally:
        th.join(30)
        srv.close()


def _member_engine():
    from dblp.engine import Engine
    eng = Engine(0, bind=("127.0.0.1", 0), session=77)
    owner = _attacker()
    eng.peers.addrs = {1: owner.getsockname()}
    eng.begin_round(3)
    return eng, owner


def test_a_forged_final_from_another_address_does_not_zero_a_replica():
    from dblp.engine import PULL, InTransfer
    eng, owner = _member_engine()
    out = np.ones(10 * wire.CHUNK_ELEMS, np.float32)
    r = InTransfer(eng, PULL, 0, 1, out, 0, add=False, freeze=False)
    eng.add_receiver(r)
    payload = wire.final_payload(b"\xff\xc0", b"\xff\xc0")  # zero-fill everything; "took" everything
    final = _seal(wire.pack_header(MsgType.FINAL, src=1, session=77, round=3, index=1, count=10,
                                   length=len(payload), flags=Flag.PULL) + payload)
    eng.handle(memoryview(final), len(final), ("127.0.0.1", 9), None, time.monotonic())
    assert r.final is None and np.all(out == 1)
    assert eng.counters.foreign == 1
    eng.handle(memoryview(final), len(final), owner.getsockname(), None, time.monotonic())
    assert r.final is not None  # the owner's own FINAL still counts
    eng.close()
    owner.close()


def test_next_round_buffer_is_capped_in_bytes():
    eng, owner = _member_engine()
    cap = dblp.TransportConfig().early_bytes
    msg = _forged_data(77, 1, 4, 100_000, 0, 1.0)
    for i in range(cap // len(msg) + 500):
        raw = bytearray(msg)
        raw[_OFF["index"]:_OFF["index"] + 4] = i.to_bytes(4, "big")
        eng.handle(memoryview(bytes(raw)), len(raw), owner.getsockname(), None, 0.0)
    assert eng.early.size <= cap and sum(len(e[0]) for e in eng.early) == eng.early.size
    assert eng.counters.early_dropped >= 500
    eng.close()
    owner.close()


def test_data_longer_than_one_chunk_is_malformed():
    pay = bytes(wire.CHUNK_BYTES + 4)
    raw = wire.pack_header(MsgType.DATA, count=2, length=len(pay)) + pay + wire.ZERO_TAG
    with pytest.raises(wire.MalformedDatagram):
        wire.unpack_header(raw)
    big = bytes(8192)
    raw = wire.pack_header(MsgType.DATA, count=2, length=len(big)) + big + wire.ZERO_TAG
    with pytest.raises(wire.MalformedDatagram, match="exceed"):
        wire.unpack_header(raw)


def test_a_keyed_job_refuses_unkeyed_and_wrongly_keyed_members():
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=SECRET, join_timeout=8)
    th = threading.Thread(target=lambda: srv.serve(1))
    th.start()
    try:
        for secret in (None, secrets.token_hex(32)):
            # The member names the cause at its join timeout (never earlier: issue 60).
            g = dblp.TransportGroup(0, 1, "127.0.0.1", srv.port, secret=secret,
                                    join_timeout=1.5)
            with pytest.raises(dblp.TransportError, match="secret"):
                g.allreduce_(np.ones(10, np.float32))
            g.close()
        assert srv.engine.counters.unauthenticated >= 2
        _round_of_ones(srv.port, secret=SECRET)
    finally:
        th.join(30)
        srv.close()
