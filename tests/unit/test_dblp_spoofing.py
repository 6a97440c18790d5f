"""Spoofed sources: nothing unauthenticated moves the transport (issue 60, the transport half).

An attacker on the path sniffs and spoofs but holds no key. Loopback has no
raw sockets for an unprivileged user, so a spoofed datagram is handed to the
victim's engine in its own thread with the forged source address, exactly
where ``recvfrom`` would have put it (``_Spoofed``): the engine cannot tell
the two apart. Each test used to break a job (a member locked out, a join
aborted, a forged datagram costing key derivations or three MACs) and must
now leave it working, or the work bounded.
"""
from __future__ import annotations

import json
import secrets
import threading
import time

import numpy as np
import pytest

import dblp
from dblp import batch, sockfilter, wire
from dblp.engine import Engine
from dblp.testing import free_port
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

#: engine id -> f(engine, now): what a ``_Spoofed`` engine injects before each of its polls.
_INJECT: dict[int, object] = {}


class _Spoofed(Engine):
    """An engine that, in its own thread, receives what the test forges (a spoofer's view)."""

    __slots__ = ()

    def poll(self, timeout):
        inject = _INJECT.get(id(self))
        if inject is not None:
            inject(self, time.monotonic())  # type: ignore[operator]
        return super().poll(min(timeout, 0.005))


#: engine id -> f(message bytes): what a ``_Tapped`` engine shows a sniffer.
_TAPS: dict[int, object] = {}


class _Tapped(Engine):
    """An engine whose every received message is shown to a tap first (a sniffer's view)."""

    __slots__ = ()

    def handle(self, buf, n, addr, tcp_peer, now):
        tap = _TAPS.get(id(self))
        if tap is not None:
            tap(bytes(buf[:n]))  # type: ignore[operator]
        return super().handle(buf, n, addr, tcp_peer, now)


def _spoof(eng: Engine, fn) -> None:
    _INJECT[id(eng)] = fn
    eng.__class__ = _Spoofed


def _forged(type_, *, src: int, session: int = 0, payload: bytes = b"") -> bytes:
    """A message of ``type_`` whose tag no key made (random bytes)."""
    return wire.pack_body(type_, payload, src=src, session=session) \
        + secrets.token_bytes(wire.TAG_SIZE)


def _local(addr) -> tuple[str, int]:
    return ("127.0.0.1", addr[1])


def _at_rate(per_s: float, msg: bytes, addr):
    """An injector that hands the engine ``per_s`` copies of ``msg`` a second from ``addr``."""
    state = {"t0": None, "sent": 0}

    def inject(eng: Engine, now: float) -> None:
        if state["t0"] is None:
            state["t0"] = now
        due = int((now - state["t0"]) * per_s) - state["sent"]
        for _ in range(min(due, 200)):
            eng.handle(memoryview(msg), len(msg), addr, None, now)
        state["sent"] += max(0, due)
    return inject


def test_a_member_joins_while_its_address_sends_a_thousand_bad_tags_a_second():
    """1,000 spoofed bad-tag HELLOs a second from a member's address, from before its first
    HELLO: the member joins within its normal time and rounds are exact. (The aggregator
    used to block the address after 64 of them, and the member never joined.)"""
    secret = secrets.token_hex(32)
    port = free_port()
    g = dblp.TransportGroup(0, 1, "127.0.0.1", port, policy="reliable", secret=secret,
                            join_timeout=4, round_timeout=5)
    srv = dblp.ParameterServer("127.0.0.1", port, 1, "reliable", secret=secret,
                               join_timeout=6, round_timeout=5)
    victim = _local(g.engine.address)
    _spoof(srv.engine, _at_rate(1000, _forged(MsgType.HELLO, src=0, payload=b"{}" * 40),
                                victim))
    errors: list = []

    def serve():
        try:
            srv.serve(3)
        except Exception as exc:
            errors.append(exc)
    th = threading.Thread(target=serve)
    th.start()
    try:
        time.sleep(0.3)  # the flood is on before the member's first HELLO
        t0 = time.monotonic()
        out = []
        for _ in range(3):
            t = np.full(10_000, 2.0, np.float32)
            g.allreduce_(t)
            out.append(t)
        joined_and_ran = time.monotonic() - t0
    finally:
        th.join(30)
        g.close()
        srv.close()
    assert not errors, errors
    assert all(np.all(t == 2.0) for t in out)
    assert joined_and_ran < 3.0, joined_and_ran  # the join itself takes milliseconds
    assert srv.engine.counters.unauthenticated >= 200
    assert victim not in srv.engine.bad.blocked


def test_the_aggregators_timeout_does_not_blame_an_address_on_unauthenticated_evidence():
    """Spoofed bad-tag HELLOs for a rank that never comes: the timeout names the rank as
    missing and gives the failed tags only as context, never as a verdict on the address."""
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=secrets.token_hex(32),
                               join_timeout=1.0)
    _spoof(srv.engine, _at_rate(200, _forged(MsgType.HELLO, src=0, payload=b"{}" * 40),
                                ("127.0.0.9", 4242)))
    try:
        with pytest.raises(dblp.TransportError) as err:
            srv.serve(1)
    finally:
        srv.close()
    text = str(err.value)
    assert "ranks [0] did not say HELLO" in text, text
    assert "127.0.0.9:4242" in text and "unauthenticated" in text, text
    assert "127.0.0.9" not in srv.engine.bad.blocked


@pytest.mark.parametrize("kind", [MsgType.CHALLENGE, MsgType.WELCOME])
def test_one_spoofed_answer_from_the_aggregators_address_does_not_abort_a_join(kind):
    """A member waits for an aggregator that starts late; one CHALLENGE (or WELCOME) with a
    failing tag arrives from the aggregator's address. The member used to raise "the secret
    differs" a second later; now it joins when the aggregator comes up."""
    secret = secrets.token_hex(32)
    port = free_port()
    g = dblp.TransportGroup(0, 1, "127.0.0.1", port, policy="reliable", secret=secret,
                            join_timeout=8, round_timeout=5)
    once = {"done": False}

    def inject(eng, now):
        if not once["done"]:
            once["done"] = True
            body = json.dumps({"rank": 0, "nonce": 1, "challenge": 5}).encode()
            msg = _forged(kind, src=1, session=0, payload=body)
            eng.handle(memoryview(msg), len(msg), ("127.0.0.1", port), None, now)
    _spoof(g.engine, inject)
    errors: list = []
    srv_box: list = []

    def serve():
        try:
            time.sleep(1.5)  # well past the second after which the member used to give up
            srv = dblp.ParameterServer("127.0.0.1", port, 1, "reliable", secret=secret,
                                       join_timeout=8, round_timeout=5)
            srv_box.append(srv)
            srv.serve(2)
        except Exception as exc:
            errors.append(exc)
    th = threading.Thread(target=serve)
    th.start()
    try:
        out = []
        for _ in range(2):
            t = np.full(1000, 3.0, np.float32)
            g.allreduce_(t)
            out.append(t)
    finally:
        th.join(30)
        g.close()
        for s in srv_box:
            s.close()
    assert once["done"]
    assert not errors, errors
    assert all(np.all(t == 3.0) for t in out)


def _counting_verify(monkeypatch) -> list[int]:
    calls = [0]
    real = wire.Sealer.verify

    def verify(self, buf, n, dst):
        calls[0] += 1
        return real(self, buf, n, dst)
    monkeypatch.setattr(wire.Sealer, "verify", verify)
    return calls


def test_a_foreign_session_or_a_non_member_costs_no_mac_and_no_key(monkeypatch):
    """Datagrams of another session, or claiming a rank that is not a member, are dropped
    before any MAC or key derivation: no verification, no key-cache entry."""
    calls = _counting_verify(monkeypatch)
    eng = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32))
    try:
        eng.peers.addrs[1] = ("127.0.0.1", 9)
        before = eng.counters.unauthenticated + eng.counters.foreign
        for i in range(200):
            for msg in (_forged(MsgType.DATA, src=1, session=0x1000 + i, payload=bytes(8)),
                        _forged(MsgType.PROBE, src=2 + i, session=0x77),
                        _forged(MsgType.STOP, src=1, session=0x2000 + i)):
                eng.handle(memoryview(msg), len(msg), ("127.0.0.1", 9), None, time.monotonic())
        assert calls[0] == 0
        assert not eng.sealer._aead and not eng.sealer.native
        assert eng.counters.unauthenticated + eng.counters.foreign - before == 600
        # Of this session and from a member: verified, once each, and still refused.
        msg = _forged(MsgType.PROBE, src=1, session=0x77)
        eng.handle(memoryview(msg), len(msg), ("127.0.0.1", 9), None, time.monotonic())
        assert calls[0] == 1
    finally:
        eng.close()


def test_a_forged_data_datagram_is_verified_once_on_the_batched_path(monkeypatch):
    """Forged DATA of the running round from a member, read through the receive ring with
    Python verifying: one MAC per datagram (it used to be two, three with the C core)."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    monkeypatch.setattr(batch, "NATIVE", None)
    calls = _counting_verify(monkeypatch)
    key = secrets.token_bytes(32)
    eng = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=key, batched_io=True)
    tx = Engine(1, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32))
    try:
        assert eng.ring is not None
        eng.peers.addrs[1] = _local(tx.address)
        eng.begin_round(0)
        rx = dblp.engine.InTransfer(eng, dblp.engine.PUSH, 0, 1, np.zeros(2000, np.float32), 0,
                                    add=False, freeze=False)
        eng.add_receiver(rx)
        n = 20
        for i in range(n):
            body = wire.pack_body(MsgType.DATA, bytes(400), src=1, session=0x77, round=0,
                                  index=i % rx.count, count=rx.count)
            tx.sock.sendto(tx.sealer.seal(body, 0), _local(eng.address))
        deadline = time.monotonic() + 2
        while eng.counters.unauthenticated < n and time.monotonic() < deadline:
            eng.poll(0.05)
        assert eng.counters.unauthenticated == n
        assert calls[0] == n, calls[0]
    finally:
        eng.close()
        tx.close()


def test_the_c_core_verifies_a_forged_data_datagram_once(monkeypatch):
    """With the C core: ``take_run`` stops at a forged row of its stream, and the row is
    counted there, never handed to ``mac_check`` or ``Sealer.verify`` again."""
    if not batch.batching_supported() or not batch.native_auth():
        pytest.skip("no authenticating C core here")
    real = batch.NATIVE
    checked = [0]

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def mac_check(self, mac, data, stride, lens, rows, res):
            checked[0] += len(rows)
            return real.mac_check(mac, data, stride, lens, rows, res)
    monkeypatch.setattr(batch, "NATIVE", Counting())
    calls = _counting_verify(monkeypatch)
    eng = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32),
                 batched_io=True)
    tx = Engine(1, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32))
    try:
        eng.peers.addrs[1] = _local(tx.address)
        eng.begin_round(0)
        rx = dblp.engine.InTransfer(eng, dblp.engine.PUSH, 0, 1, np.zeros(2000, np.float32), 0,
                                    add=False, freeze=False)
        eng.add_receiver(rx)
        n = 20
        for i in range(n):
            body = wire.pack_body(MsgType.DATA, bytes(400), src=1, session=0x77, round=0,
                                  index=i % rx.count, count=rx.count)
            tx.sock.sendto(tx.sealer.seal(body, 0), _local(eng.address))
        deadline = time.monotonic() + 2
        while eng.counters.unauthenticated < n and time.monotonic() < deadline:
            eng.poll(0.05)
        assert eng.counters.unauthenticated == n
        assert checked[0] == 0 and calls[0] == 0, (checked, calls)
    finally:
        eng.close()
        tx.close()


def test_a_forged_source_costs_no_mac_on_the_per_datagram_path(monkeypatch):
    """The job's session and a member's rank from an address that is not the member's
    pinned one (a flood rotating its sources) is dropped as foreign before any MAC."""
    calls = _counting_verify(monkeypatch)
    eng = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32))
    try:
        eng.peers.addrs[1] = ("127.0.0.1", 9)
        for i in range(100):
            msg = _forged(MsgType.DATA, src=1, session=0x77, payload=bytes(8))
            eng.handle(memoryview(msg), len(msg), (f"127.1.0.{i % 250 + 1}", 9), None,
                       time.monotonic())
        assert calls[0] == 0
        assert eng.counters.foreign == 100 and eng.counters.unauthenticated == 0
    finally:
        eng.close()


@pytest.mark.parametrize("core", ["python", "c"])
def test_a_forged_source_costs_no_mac_and_the_members_chunks_land(monkeypatch, core):
    """On the batched path, Python's and the C core's alike: forged DATA of the running
    round with the job's session and the member's rank, from another address, is dropped
    by address before any MAC (by the socket's kernel filter, else counted foreign; never
    unauthenticated), and the member's
    own chunks sent between the forged ones all land, exact."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    if core == "c" and not batch.native_auth():
        pytest.skip("no authenticating C core here")
    if core == "python":
        monkeypatch.setattr(batch, "NATIVE", None)
    key = secrets.token_bytes(32)
    eng = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=key, batched_io=True)
    member = Engine(1, bind=("127.0.0.1", 0), session=0x77, key=key)
    spoofer = Engine(1, bind=("127.0.0.1", 0), session=0x77, key=secrets.token_bytes(32))
    try:
        eng.peers.addrs[1] = _local(member.address)
        eng.begin_round(0)
        want = np.arange(2000, dtype=np.float32)
        rx = dblp.engine.InTransfer(eng, dblp.engine.PUSH, 0, 1, np.zeros(2000, np.float32), 0,
                                    add=False, freeze=False)
        eng.add_receiver(rx)
        floats = eng.chunk_bytes // 4
        forged = 0
        for i in range(rx.count):
            for _ in range(5):
                body = wire.pack_body(MsgType.DATA, bytes(eng.chunk_bytes), src=1, session=0x77,
                                      round=0, index=i, count=rx.count)
                spoofer.sock.sendto(spoofer.sealer.seal(body, 0), _local(eng.address))
                forged += 1
            body = wire.pack_body(MsgType.DATA, want[i * floats:(i + 1) * floats].tobytes(),
                                  src=1, session=0x77, round=0, index=i, count=rx.count)
            member.sock.sendto(member.sealer.seal(body, 0), _local(eng.address))
        deadline = time.monotonic() + 3
        while (eng.counters.foreign < forged or rx.n_have < rx.count) \
                and time.monotonic() < deadline:
            eng.poll(0.05)
        # Dropped by the socket's kernel filter (the session and the members' addresses:
        # dblp.sockfilter), or where there is none by header and address in user space.
        dropped = sockfilter.socket_drops(eng.sock) or 0
        assert eng.counters.foreign + dropped == forged and eng.counters.unauthenticated == 0
        assert rx.n_have == rx.count
        assert np.array_equal(rx.out, want)
    finally:
        eng.close()
        member.close()
        spoofer.close()


def _sealed_data(sealer: wire.Sealer, session: int, src: int, dst: int) -> bytes:
    body = wire.pack_body(MsgType.DATA, np.ones(100, np.float32).tobytes(), src=src,
                          session=session, round=0, index=0, count=1)
    return sealer.seal(body, dst)


def test_a_datagram_of_one_stream_never_verifies_in_another():
    """Two streams with one secret and one session (what a unit's streams are): keys differ
    by stream, so one stream's datagram is unauthenticated in the other (it used to verify
    and replace the other's values in the same round)."""
    key = secrets.token_bytes(32)
    msg = _sealed_data(wire.Sealer(key, stream=1), 0x77, 1, 0)
    assert wire.Sealer(key, stream=1).verify(msg, len(msg), 0)
    assert not wire.Sealer(key, stream=2).verify(msg, len(msg), 0)
    assert not wire.Sealer(key).verify(msg, len(msg), 0)
    rx = Engine(0, bind=("127.0.0.1", 0), session=0x77, key=key, stream=2)
    try:
        rx.peers.addrs[1] = ("127.0.0.1", 9)
        rx.handle(memoryview(msg), len(msg), ("127.0.0.1", 9), None, time.monotonic())
        assert rx.counters.unauthenticated == 1
    finally:
        rx.close()


def test_two_jobs_sharing_secret_and_session_keep_their_own_aggregates():
    """Job B's aggregator is fed job A's sniffed round data (same secret, same session, other
    stream): B's rounds stay exact and A's datagrams are dropped there (from the relay's
    address before any MAC; `test_a_datagram_of_one_stream_never_verifies_in_another`
    shows that one from B's member's own address would fail its tag)."""
    secret = secrets.token_hex(32)
    common = dict(secret=secret, session_id=0x5E55, round_timeout=5, join_timeout=5)
    port_b = free_port()
    srv_b = dblp.ParameterServer("127.0.0.1", port_b, 1, "reliable", stream=2, **common)
    # A reads one datagram per call, so its tap sees every DATA datagram; B reads batches.
    srv_a = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", stream=1, batched_io=False,
                                 **common)
    to_b = _attacker_socket()

    def relay(msg: bytes) -> None:
        # A sniffer at A's aggregator re-sends each DATA datagram to B's at once.
        if len(msg) > wire.HEADER_SIZE and msg[wire.FIELD_OFFSETS["type"][0]] == MsgType.DATA:
            to_b.sendto(msg, ("127.0.0.1", port_b))
    _TAPS[id(srv_a.engine)] = relay
    srv_a.engine.__class__ = _Tapped
    errors: list = []
    results: dict = {}

    def serve(srv):
        try:
            srv.serve(3)
        except Exception as exc:
            errors.append(exc)

    def work(name, port, value, stream):
        try:
            with dblp.TransportGroup(0, 1, "127.0.0.1", port, policy="reliable", stream=stream,
                                     **common) as g:
                for r in range(3):
                    t = np.full(20_000, value, np.float32)
                    g.allreduce_(t)
                    results[(name, r)] = t
                    if name == "b":
                        time.sleep(0.1)  # A's rounds, relayed, land inside B's
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=serve, args=(s,)) for s in (srv_a, srv_b)] + [
        threading.Thread(target=work, args=("a", srv_a.port, 5.0, 1)),
        threading.Thread(target=work, args=("b", port_b, 7.0, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    to_b.close()
    dropped_b = sockfilter.socket_drops(srv_b.engine.sock) or 0  # its kernel filter's
    srv_a.close()
    srv_b.close()
    assert not errors, errors
    for r in range(3):
        assert np.all(results[("a", r)] == 5.0) and np.all(results[("b", r)] == 7.0), r
    c = srv_b.engine.counters
    assert c.unauthenticated + c.foreign + dropped_b > 0


def _attacker_socket():
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def test_the_torch_backends_streams_have_keys_of_their_own():
    """One process group, two bucket sizes: two streams with one session and one secret, each
    with its own number in the key derivation, the same on every rank."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    tb = pytest.importorskip("dblp.torch_backend")
    import datetime
    store = dist.HashStore()
    config = tb.options(secret=secrets.token_hex(32), session_id=0xAB)
    out: dict = {}
    errors: list = []

    def one(rank):
        pg = tb.DblpProcessGroup(store, rank, 2, datetime.timedelta(seconds=30), config,
                                 "127.0.0.1")
        try:
            for numel in (1000, 3000):
                o = dist.AllreduceOptions()
                o.reduceOp = dist.ReduceOp.SUM
                pg.allreduce([torch.ones(numel)], o).wait()
            out[rank] = {k: g.engine.sealer for k, g in pg._streams.items()}
        except Exception as exc:
            errors.append(exc)
        finally:
            pg.shutdown()
    threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    keys = sorted(out[0])
    assert len(keys) == 2 and sorted(out[1]) == keys
    streams = [out[0][k].stream for k in keys]
    assert len(set(streams)) == 2 and [out[1][k].stream for k in keys] == streams
    a, b = keys
    msg = _sealed_data(out[1][a], 0xAB, 1, 0)
    assert out[0][a].verify(msg, len(msg), 0)
    assert not out[0][b].verify(msg, len(msg), 0)


def _tcp_job(rounds: int = 3):
    """A keyed PS job with TCP control: one server, one member (not started)."""
    secret = secrets.token_hex(32)
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=secret, control="tcp",
                               join_timeout=8, round_timeout=5)
    g = dblp.TransportGroup(0, 1, "127.0.0.1", srv.port, policy="reliable", secret=secret,
                            control="tcp", join_timeout=8, round_timeout=5)
    return srv, g


def _run_tcp_job(srv, g, rounds: int = 3) -> list:
    errors: list = []
    out: list = []

    def serve():
        try:
            srv.serve(rounds)
        except Exception as exc:
            errors.append(exc)

    def work():
        try:
            for r in range(rounds):
                t = np.full(5_000, float(r + 1), np.float32)
                g.allreduce_(t)
                out.append(t)
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=serve), threading.Thread(target=work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(out) == rounds and all(np.all(t == r + 1) for r, t in enumerate(out))
    return out


def test_a_sniffed_tcp_hello_replayed_on_an_earlier_connection_binds_nothing():
    """The member's TCP HELLO, sniffed and re-sent on a connection the attacker opened
    earlier, reaches the aggregator first. That connection used to be bound to the rank (and
    took its control messages) and the member's own refused as a replay; now the HELLO
    carries its own connection's nonce, so only the member's connection is bound."""
    srv, g = _tcp_job()
    import socket
    att = socket.create_connection(("127.0.0.1", srv.port))
    att.settimeout(5)
    replayed: list = []

    def sniff(msg: bytes) -> None:
        conn = srv.engine.joining.current_conn
        h = _kind(msg)
        if conn is None or h is None or h.type != MsgType.HELLO or replayed:
            return
        # The attacker's copy, on its own earlier connection, handled before the original.
        others = [c for c in srv.engine.joining.unbound if c is not conn and not c.closed]
        assert others, "the attacker's connection was not accepted"
        replayed.append(others[0])
        srv.engine.joining.current_conn = others[0]
        Engine.handle(srv.engine, memoryview(msg), len(msg), None, None, time.monotonic())
        srv.engine.joining.current_conn = conn
    _TAPS[id(srv.engine)] = sniff
    srv.engine.__class__ = _Tapped
    try:
        _run_tcp_job(srv, g)
        assert replayed and replayed[0].peer is None
        assert srv.engine.peers.tcp[0] is not replayed[0]
        got = b""
        try:
            while chunk := att.recv(65536):
                got += chunk
        except OSError:
            pass
        assert len(got) < 200, len(got)  # its nonce frame, and no control message of rank 0
    finally:
        att.close()
        g.close()
        srv.close()


def test_a_burst_of_connects_at_the_welcome_does_not_cost_the_member_its_control(monkeypatch):
    """400 connects fired the moment the member opens its TCP control connection (as a
    sniffer that saw its WELCOME would), before its HELLO: the burst evicts the member's
    connection from the capped unbound set (it used to end the job); now the member connects
    again until the aggregator confirms it, and every round completes exact."""
    import socket
    srv, g = _tcp_job()
    burst: list = []
    real = socket.create_connection

    def connect_then_burst(addr, *args, **kwargs):
        sock = real(addr, *args, **kwargs)
        if addr[1] == srv.port and not burst:
            for _ in range(400):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", srv.port))
                burst.append(s)
            time.sleep(0.05)  # all of them queued before the member's next byte
        return sock
    monkeypatch.setattr(socket, "create_connection", connect_then_burst)
    try:
        _run_tcp_job(srv, g)
        assert len(burst) == 400
    finally:
        for s in burst:
            s.close()
        g.close()
        srv.close()


def _kind(msg: bytes):
    try:
        return wire.unpack_header(msg)
    except wire.MalformedDatagram:
        return None


#: engine id -> [answered HELLOs of rank 1 seen, WELCOMEs sent]: what ``_Counted`` records.
_COUNTED: dict[int, list] = {}


class _Counted(Engine):
    """Rank 0 of a sharded job: keeps rank 1's answered HELLO, counts the WELCOMEs it sends."""

    __slots__ = ()

    def handle(self, buf, n, addr, tcp_peer, now):
        rec = _COUNTED.get(id(self))
        h = _kind(bytes(buf[:n]))
        if rec is not None and h is not None and h.type == MsgType.HELLO and h.src == 1 \
                and b'"answer"' in bytes(buf[:n]) and not rec[0]:
            rec[0].append((bytes(buf[:n]), addr))
        return super().handle(buf, n, addr, tcp_peer, now)

    def send_raw(self, body, addr, dst):
        rec = _COUNTED.get(id(self))
        h = _kind(bytes(body) + bytes(wire.TAG_SIZE))
        if rec is not None and h is not None and h.type == MsgType.WELCOME:
            rec[1] += 1
        return super().send_raw(body, addr, dst)


def test_a_replayed_answered_hello_does_not_make_rank0_resend_the_table():
    """Sharded, 4 ranks: rank 1's answered HELLO, replayed 200 times from its own address
    after the join. Rank 0 used to send the whole address table to every rank per replay
    (600 WELCOMEs); now the rank alone is answered, at most every ``WELCOME_REPEAT_S``."""
    secret = secrets.token_hex(32)
    world = 4
    lead = dblp.TransportGroup(0, world, "127.0.0.1", 0, mode="sharded", secret=secret,
                               join_timeout=8, round_timeout=5)
    rec: list = [[], 0]
    _COUNTED[id(lead.engine)] = rec
    lead.engine.__class__ = _Counted
    groups = [lead] + [dblp.TransportGroup(r, world, "127.0.0.1", lead.master_port,
                                           mode="sharded", secret=secret, join_timeout=8,
                                           round_timeout=5) for r in range(1, world)]
    errors: list = []
    out: dict = {}
    joined = threading.Barrier(world)
    replayed = threading.Event()

    def work(r):
        g = groups[r]
        try:
            for rnd in range(2):
                t = np.full(4_000, float(r), np.float32)
                g.allreduce_(t)
                out[(r, rnd)] = t
                if rnd == 0:
                    joined.wait(10)
                    if r == 0:
                        msg, addr = rec[0][0]
                        before = rec[1]
                        for _ in range(200):
                            g.engine.handle(memoryview(msg), len(msg), addr, None,
                                            time.monotonic())
                        rec.append(rec[1] - before)
                        replayed.set()
                    replayed.wait(10)
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for g in groups:
        g.close()
    assert not errors, errors
    mean = np.float32(sum(range(world)) / world)
    assert all(np.all(t == mean) for t in out.values()) and len(out) == 2 * world
    assert rec[2] <= 1, rec[2]  # WELCOMEs for 200 replays


def test_blocks_come_only_under_a_flood_spare_candidates_and_end_on_a_timer():
    """``BadSources``: a few failed tags block nothing; past the global budget a flooding
    source is blocked, a candidate's or a peer's address never; the table is bounded and a
    block ends by the clock alone (an engine's poll lifts it with nothing read)."""
    from dblp.engine_state import BadSources
    bad = BadSources()
    peers = {1: ("10.0.0.1", 5)}
    bad.trust(("10.0.0.2", 6))
    t = 100.0
    for _ in range(int(BadSources.BURST)):  # a budget's worth: acted on, nothing blocked
        assert bad.failed(("10.0.0.9", 7), t, peers)
    assert not bad.blocked
    for addr in (("10.0.0.9", 7), ("10.0.0.1", 5), ("10.0.0.2", 6)):
        for _ in range(BadSources.LIMIT + 1):
            assert not bad.failed(addr, t, peers)  # the budget is spent: not acted on
    assert list(bad.blocked) == [("10.0.0.9", 7)]
    for i in range(2 * BadSources.MAX_BLOCKED):
        for _ in range(BadSources.LIMIT + 1):
            bad.failed((f"10.1.{i // 250}.{i % 250}", 9), t, peers)
    assert len(bad.blocked) == BadSources.MAX_BLOCKED
    assert bad.expire(t + BadSources.BLOCK) == float("inf") and not bad.blocked

    eng = Engine(0, bind=("127.0.0.1", 0), key=secrets.token_bytes(32))
    try:
        eng.bad.blocked[("127.0.0.9", 9)] = time.monotonic() + 0.1
        eng.poll(0.3)  # nothing arrives; the block ends on its own
        eng.poll(0.0)
        assert not eng.bad.blocked and not eng.kernel_blocked
    finally:
        eng.close()


def test_a_control_send_to_a_peer_that_stops_reading_gives_up(monkeypatch):
    """A TCP control send has a deadline: a peer whose window stays shut costs the sender
    ``SEND_TIMEOUT_S``, then PeerClosed (``sendall`` used to block for ever)."""
    import socket

    from dblp import framing
    monkeypatch.setattr(framing, "SEND_TIMEOUT_S", 0.3)
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()  # never reads
    conn = framing.TcpControl(a)
    result: list = []

    def fill():
        t0 = time.monotonic()
        try:
            for _ in range(1_000_000):
                conn.send(bytes(wire.MAX_DATAGRAM))
        except dblp.errors.PeerClosed:
            result.append(time.monotonic() - t0)
    th = threading.Thread(target=fill, daemon=True)
    th.start()
    th.join(10)
    try:
        assert result and conn.closed, "the send blocked"
    finally:
        conn.close()
        b.close()
        lst.close()


def test_a_challenge_answer_is_good_for_two_cookie_epochs_at_most():
    """The aggregator's cookie key has epochs: an answer of this epoch or the one before is
    taken, an older one is not (it used to be good for the aggregator's whole life)."""
    from dblp import join
    clock = [1000.0]
    cookies = join.Cookies(clock=lambda: clock[0])
    addr = ("127.0.0.1", 4000)
    answer = cookies.make(addr, 1, 77)
    assert cookies.check(answer, addr, 1, 77)
    assert not cookies.check(answer, ("127.0.0.1", 4001), 1, 77)
    clock[0] += join.Cookies.EPOCH_S
    assert cookies.check(answer, addr, 1, 77)  # the epoch before: still good
    clock[0] += join.Cookies.EPOCH_S
    assert not cookies.check(answer, addr, 1, 77)
    assert cookies.check(cookies.make(addr, 1, 77), addr, 1, 77)


def test_one_spoofed_challenge_does_not_abort_a_sharded_member():
    """Sharded mode: rank 1 waits for rank 0 (started late); one bad-tag CHALLENGE from rank
    0's address arrives first. Rank 1 used to raise "the secret differs"; now both join."""
    secret = secrets.token_hex(32)
    port = free_port()
    member = dblp.TransportGroup(1, 2, "127.0.0.1", port, mode="sharded", secret=secret,
                                 join_timeout=8, round_timeout=5)
    once = {"done": False}

    def inject(eng, now):
        if not once["done"]:
            once["done"] = True
            body = json.dumps({"rank": 1, "nonce": 1, "challenge": 5}).encode()
            msg = _forged(MsgType.CHALLENGE, src=0, session=0, payload=body)
            eng.handle(memoryview(msg), len(msg), ("127.0.0.1", port), None, now)
    _spoof(member.engine, inject)
    errors: list = []
    out: dict = {}
    groups = [member]

    def lead():
        try:
            time.sleep(1.5)
            g = dblp.TransportGroup(0, 2, "127.0.0.1", port, mode="sharded", secret=secret,
                                    join_timeout=8, round_timeout=5)
            groups.append(g)
            t = np.full(1000, 1.0, np.float32)
            g.allreduce_(t)
            out[0] = t
        except Exception as exc:
            errors.append(exc)

    def work():
        try:
            t = np.full(1000, 3.0, np.float32)
            member.allreduce_(t)
            out[1] = t
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=lead), threading.Thread(target=work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for g in groups:
        g.close()
    assert once["done"]
    assert not errors, errors
    assert np.all(out[0] == 2.0) and np.all(out[1] == 2.0)
