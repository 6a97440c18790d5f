"""Authentic messages replayed, as an attacker with no key and only a sniffer would.

Each test runs a keyed job on loopback (a real aggregator, real members,
each job with its own secret, or one secret reused across two jobs where the
attack needs that), captures messages the way a sniffer sees them (a tap on
what a participant receives, or a socket where the aggregator is not up
yet), and re-sends them unchanged from another socket. Every attack used to
stall a round, lock a member out or hand the aggregate to the attacker;
every round must now complete with the exact mean.
"""
from __future__ import annotations

import secrets
import socket
import threading
import time

import numpy as np
import pytest

import dblp
from dblp import sockfilter, wire
from dblp.engine import Engine
from dblp.testing import free_port
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

#: engine id -> f(message bytes, sender address): what ``_Tapped`` engines report.
_TAPS: dict[int, object] = {}


class _Tapped(Engine):
    """An engine whose every received message is shown to a tap first (a sniffer's view)."""

    __slots__ = ()

    def handle(self, buf, n, addr, tcp_peer, now):
        tap = _TAPS.get(id(self))
        if tap is not None:
            tap(bytes(buf[:n]), addr)  # type: ignore[operator]
        return super().handle(buf, n, addr, tcp_peer, now)


def _tap(eng: Engine, fn) -> None:
    _TAPS[id(eng)] = fn
    eng.__class__ = _Tapped


def _kind(msg: bytes):
    try:
        return wire.unpack_header(msg)
    except wire.MalformedDatagram:
        return None


def _sniffed(job, eng: Engine, keep, *, start_server: bool = False) -> list[bytes]:
    """Run ``job`` to its end and keep what ``eng`` received that ``keep(header)`` accepts:
    the authentic messages a sniffer on the network would have (its rounds checked exact)."""
    got: list[bytes] = []
    _tap(eng, lambda m, a: got.append(m) if (h := _kind(m)) is not None and keep(h) else None)
    if start_server:
        job.start_server()
    try:
        job.start_members()
    finally:
        job.finish()
    job.assert_exact()
    assert got, "the job sent nothing of the kind to keep"
    return got


def _attacker() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


def _drain(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(65536))
        except (BlockingIOError, InterruptedError):
            return out


def _local(addr) -> tuple[str, int]:
    return ("127.0.0.1", addr[1])


class Job:
    """A parameter server and ``n`` members (threads), each member's rounds gated by a hook.

    ``before(w, r)`` runs in member ``w``'s thread before its round ``r``; the
    members' tensors are ``w + 1`` everywhere, so the mean is exact in float32.
    """

    def __init__(self, n=2, rounds=3, numel=60_000, secret=None, port=0, start_server=True,
                 before=None, **settings):
        self.n, self.rounds, self.numel = n, rounds, numel
        self.secret = secret if secret is not None else secrets.token_hex(32)
        self.settings = dict(settings, secret=self.secret, round_timeout=5, join_timeout=8)
        self.port = port or free_port()
        self.results: dict = {}
        self.errors: list = []
        self.before = before
        self.srv: dblp.ParameterServer | None = None
        self.groups = {w: dblp.TransportGroup(w, n, "127.0.0.1", self.port, policy="reliable",
                                              **self.settings) for w in range(n)}
        self.threads: list[threading.Thread] = []
        if start_server:
            self.start_server()

    def make_server(self) -> dblp.ParameterServer:
        self.srv = dblp.ParameterServer("127.0.0.1", self.port, self.n, "reliable",
                                        idle_timeout=10, **self.settings)
        return self.srv

    def start_server(self) -> None:
        srv = self.srv or self.make_server()

        def serve():
            try:
                srv.serve(self.rounds)
            except Exception as exc:
                self.errors.append(exc)
        t = threading.Thread(target=serve)
        t.start()
        self.threads.append(t)

    def start_members(self) -> None:
        for w in range(self.n):
            t = threading.Thread(target=self._work, args=(w,))
            t.start()
            self.threads.append(t)

    def _work(self, w: int) -> None:
        g = self.groups[w]
        try:
            for r in range(self.rounds):
                if self.before is not None:
                    self.before(w, r)
                t = np.full(self.numel, float(w + 1), np.float32)
                g.allreduce_(t)
                self.results[(w, r)] = t
        except Exception as exc:
            self.errors.append(exc)

    def finish(self) -> None:
        for t in self.threads:
            t.join(60)
        for g in self.groups.values():
            g.close()
        if self.srv is not None:
            self.srv.close()

    def assert_exact(self) -> None:
        assert not self.errors, self.errors
        mean = np.float32(sum(range(1, self.n + 1)) / self.n)
        for w in range(self.n):
            for r in range(self.rounds):
                assert np.all(self.results[(w, r)] == mean), (w, r)


def test_a_stop_for_one_member_resent_to_another_is_dropped():
    """Member 0's STOP of a round, re-sent to member 1 before member 1 pushes that round.

    Both push the same part to the server; member 1 drops the copy instead of
    stopping after none of its chunks (and the round stalling until its deadline):
    re-sent from the attacker's address it is not from member 1's aggregator's pinned
    one (dropped before any MAC), and spoofed from there its tag, which covers the
    destination, would fail.
    """
    atk = _attacker()
    replayed = {r: threading.Event() for r in range(3)}

    def before(w, r):
        if w == 1 and r >= 1:  # member 1 pushes once member 0's STOP was re-sent to it
            replayed[r].wait(3)

    # A push of ~5,600 chunks: more than one sending turn, so the victim reads the STOP
    # while most of its push is still to go.
    job = Job(2, rounds=3, numel=2_000_000, before=before)
    victim = _local(job.groups[1].engine.address)

    def sniff(msg, addr):
        h = _kind(msg)
        if h is not None and h.type == MsgType.STOP and h.round >= 1 \
                and not replayed[h.round].is_set():
            for _ in range(3):
                atk.sendto(msg, victim)
            # On loopback the victim's socket filter has judged them when sendto returns.
            dropped.append(sockfilter.socket_drops(job.groups[1].engine.sock) or 0)
            replayed[h.round].set()
    dropped: list[int] = []
    _tap(job.groups[0].engine, sniff)
    try:
        job.start_members()
    finally:
        job.finish()
        atk.close()
    assert replayed[1].is_set() and replayed[2].is_set()
    job.assert_exact()
    c = job.groups[1].engine.counters
    assert c.unauthenticated + c.foreign + max(dropped, default=0) >= 3


def test_an_old_jobs_hello_does_not_move_a_rank():
    """A HELLO sniffed in one job, replayed from another address into the next job with the
    same secret between rounds: it must not re-pin the rank nor tell the attacker anything
    but a challenge it cannot answer (it used to get the WELCOME, then the aggregate)."""
    secret = secrets.token_hex(32)
    first = Job(2, rounds=1, secret=secret, start_server=False)
    first.make_server()
    assert first.srv is not None
    old = _sniffed(first, first.srv.engine, lambda h: h.type == MsgType.HELLO and h.src == 1,
                   start_server=True)

    atk = _attacker()
    got: list[bytes] = []

    def before(w, r):
        if w == 0 and r == 1:
            srv = job.srv
            assert srv is not None
            for msg in old:
                atk.sendto(msg, ("127.0.0.1", job.port))
            time.sleep(0.3)
            got.extend(_drain(atk))
            assert srv.engine.peers.addrs[1] == _local(job.groups[1].engine.address)

    job = Job(2, rounds=3, secret=secret, before=before)
    try:
        job.start_members()
        time.sleep(0.5)
    finally:
        job.finish()
        got.extend(_drain(atk))
        atk.close()
    job.assert_exact()
    kinds = [h.type for h in map(_kind, got) if h is not None]
    assert MsgType.WELCOME not in kinds and MsgType.DATA not in kinds, kinds


def test_an_old_jobs_welcome_is_not_adopted_by_a_joining_member():
    """A WELCOME sniffed in one job, sent to a member of the next (same secret) while it
    waits for its aggregator: the WELCOME must echo this join's nonce, so it is refused."""
    secret = secrets.token_hex(32)
    first = Job(1, rounds=1, secret=secret)
    old = _sniffed(first, first.groups[0].engine, lambda h: h.type == MsgType.WELCOME)

    atk = _attacker()
    job = Job(1, rounds=2, secret=secret, start_server=False)
    member = _local(job.groups[0].engine.address)
    stop = threading.Event()

    def replay():
        while not stop.is_set():
            for msg in old:
                atk.sendto(msg, member)
            time.sleep(0.01)
    t = threading.Thread(target=replay)
    t.start()
    try:
        job.start_members()
        time.sleep(0.6)  # the member says HELLO to nobody and hears only the old WELCOME
        job.start_server()
        time.sleep(0.3)
    finally:
        stop.set()
        t.join()
        job.finish()
        atk.close()
    job.assert_exact()
    assert job.srv is not None
    assert job.groups[0].engine.session == job.srv.session_id


def test_a_members_hello_replayed_from_elsewhere_before_the_aggregator_is_up():
    """The member's HELLO, sniffed while no aggregator listens, reaches the aggregator from
    another address before the member's next one: it must not pin the rank there (the
    member used to be locked out of its own job)."""
    job = Job(2, rounds=2, start_server=False)
    members = {w: _local(g.engine.address) for w, g in job.groups.items()}
    sniffer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sniffer.bind(("127.0.0.1", job.port))
    sniffer.settimeout(5)
    atk = _attacker()
    got: list[bytes] = []
    try:
        job.start_members()
        hellos: dict[int, bytes] = {}
        while len(hellos) < 2:
            msg = sniffer.recv(65536)
            h = _kind(msg)
            if h is not None and h.type == MsgType.HELLO:
                hellos.setdefault(h.src, msg)
        sniffer.close()
        srv = job.make_server()  # bound, not serving yet: the replays queue first
        for msg in hellos.values():
            for _ in range(3):
                atk.sendto(msg, ("127.0.0.1", job.port))
        job.start_server()
        time.sleep(0.5)
        got.extend(_drain(atk))
    finally:
        job.finish()
        atk.close()
    job.assert_exact()
    for w in range(2):
        assert srv.rendezvous is not None
        assert srv.rendezvous.addrs[w] == members[w]
    kinds = [h.type for h in map(_kind, got) if h is not None]
    assert MsgType.WELCOME not in kinds and MsgType.DATA not in kinds, kinds


def test_a_udp_hello_sent_as_the_tcp_control_hello_binds_nothing():
    """A member's UDP HELLO, sniffed and sent at once on a TCP connection of the attacker's
    own: the TCP HELLO must carry the session and be marked TCP under the MAC, so the
    member's own connection is the one bound (it used to be closed as a replay)."""
    conns: list[socket.socket] = []
    job = Job(2, rounds=2, control="tcp", start_server=False)
    srv = job.make_server()

    def sniff(msg, addr):
        h = _kind(msg)
        if h is not None and h.type == MsgType.HELLO and addr is not None and len(conns) < 4:
            c = socket.create_connection(("127.0.0.1", job.port))
            c.sendall(len(msg).to_bytes(2, "big") + msg)
            conns.append(c)
    _tap(srv.engine, sniff)
    job.start_server()
    try:
        job.start_members()
    finally:
        job.finish()
        for c in conns:
            c.close()
    assert conns
    job.assert_exact()
    assert srv.engine.counters.foreign >= 1
