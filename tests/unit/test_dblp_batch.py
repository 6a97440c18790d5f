"""Batched I/O (dblp.batch) against the per-datagram path it replaces, bit for bit.

Sending: a stream sent in GSO batches and the same stream sent one datagram
per call put the same datagrams, in the same order, on a plain UDP socket on
loopback (the kernel cuts GSO sends into datagrams on delivery). Receiving:
the same datagrams (in order, with duplicates, forgeries, control messages and
other rounds mixed in) handed to ``batch.deliver`` at once and to
``Engine.handle`` one by one leave the same aggregate, bitmap, counters and
replies behind.
"""
import socket
import struct
import time

import numpy as np
import pytest

from dblp import batch, rounds, wire
from dblp.engine import PULL, PUSH, Engine, InTransfer, OutTransfer
from dblp.pacing import TokenBucket
from dblp.wire import MsgType

pytestmark = pytest.mark.unit

KEY = bytes(range(32))
SESSION = 0x1234_5678_9ABC
ROUND = 3
FIRST_SEQ = 1 << 40  # a sender's first message number (random in a real job)


@pytest.fixture(params=["c-core", "numpy"])
def core(request, monkeypatch):
    """Each receive test twice: with the C core (``dblp._fastpath``) taking runs, and without."""
    if request.param == "numpy":
        monkeypatch.setattr(batch, "NATIVE", None)
        return None
    if batch.NATIVE is None:
        pytest.fail("dblp._fastpath is not built: run ./setup.sh (it needs gcc and the Python "
                    "headers)")
    return _Counting(batch.NATIVE, monkeypatch)


class _Counting:
    """The C core, counting the rows ``take_run`` took and the sends ``send_gso`` made.

    A test must see it do work: a path that silently fell back would compare
    the pure-Python path with itself.
    """

    def __init__(self, native, monkeypatch):
        self.native, self.rows, self.sends, self.checked = native, 0, 0, 0
        monkeypatch.setattr(batch, "NATIVE", self)

    def mac_check(self, *args):
        self.checked += len(args[4])
        return self.native.mac_check(*args)

    def send_gso(self, *args):
        self.sends += 1
        return self.native.send_gso(*args)

    def take_run(self, *args):
        out = self.native.take_run(*args)
        self.rows += out[0] - args[4]
        return out

    def __getattr__(self, name):
        return getattr(self.native, name)


def _sans_nonce(d: bytes) -> bytes:
    """A datagram with its message number and its tag zeroed: what it says, not how it
    was sealed."""
    b = bytearray(d)
    b[wire.SEQ_OFFSET:wire.SEQ_OFFSET + 8] = bytes(8)
    b[-wire.TAG_SIZE:] = wire.ZERO_TAG
    return bytes(b)


def _rx():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2)
    return rx


def _send_stream(batched: bool, numel: int, key, passes: int = 1, rate_bps=None):
    """Every datagram one push stream's pass (and its PROBE) puts on the wire, in order."""
    rx = _rx()
    eng = Engine(1, bind=("127.0.0.1", 0), session=SESSION, key=key, batched_io=batched,
                 rate_bps=rate_bps)
    if key is not None:
        eng.sealer.seq = FIRST_SEQ  # both paths number alike, so their bytes can be compared
    try:
        eng.peers.addrs[2] = rx.getsockname()
        eng.begin_round(ROUND)
        data = np.arange(numel, dtype=np.float32) * 0.5 - 7
        s = OutTransfer(eng, PUSH, 0, 2, data, 8000)
        s.passes = passes  # a resend pass: aux and the retransmission count
        eng.add_sender(s)
        end = time.monotonic() + 5
        while s.has_pending() and time.monotonic() < end:
            eng._send_some(time.monotonic())
        got = [rx.recv(65536) for _ in range(s.count + 1)]
        return got, s, eng.datagrams["data"], eng.batch_max
    finally:
        eng.close()
        rx.close()


@pytest.mark.parametrize("key", [None, KEY], ids=["open", "keyed"])
@pytest.mark.parametrize("numel", [200 * wire.CHUNK_ELEMS, 200 * wire.CHUNK_ELEMS + 77, 5])
def test_batched_send_puts_the_same_datagrams_on_the_wire(key, numel, core):
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    old, s_old, n_old, k_old = _send_stream(False, numel, key)
    new, s_new, n_new, k_new = _send_stream(True, numel, key)
    # unpaced: the largest batch, several GSO messages where the C core sends
    messages = batch.GSO_MESSAGES if core is not None and (key is None or batch.native_auth()) \
        else 1
    assert k_old == 1 and k_new == messages * batch.GSO_MAX_SEGMENTS
    assert len(new) == len(old) == s_old.count + 1
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        assert a == b, f"datagram {i} differs"
    assert n_old == n_new == s_old.count
    assert s_new.chunks_sent == s_old.chunks_sent == s_old.count
    assert np.array_equal(np.isfinite(s_new.sent_at), np.isfinite(s_old.sent_at))
    assert wire.unpack(new[-1])[0].type == MsgType.PROBE
    if core is not None and s_old.count > 2:  # a batch: two full chunks or more
        # the C core sends, for a job with a secret too where it was built with libcrypto
        assert (core.sends > 0) == (key is None or batch.native_auth())


def test_the_scapy_layer_decodes_what_a_batch_sent():
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    from dblp.scapy_layer import DBLP
    new, s, _, _ = _send_stream(True, 50 * wire.CHUNK_ELEMS + 9, KEY)
    for i, d in enumerate(new[:-1]):
        p = DBLP(d)
        assert (p.magic, p.type, p.count, p.session) == (wire.MAGIC, MsgType.DATA, s.count, SESSION)
        assert p.index == int(s.order[i]) and p.length == len(d) - wire.HEADER_SIZE - wire.TAG_SIZE
        assert p.trailer["tag"] == wire.Sealer(KEY).tag(2, d[:-wire.TAG_SIZE])  # for rank 2


def test_a_refused_gso_send_falls_back_to_one_datagram_per_call(monkeypatch):
    """A path that refuses GSO (here: a malformed UDP_SEGMENT message, EINVAL) loses nothing."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    old, s_old, _, _ = _send_stream(False, 60 * wire.CHUNK_ELEMS, KEY)
    monkeypatch.setattr(batch, "NATIVE", None)  # Python's sendmsg, whose message we spoil
    monkeypatch.setattr(batch.SendBatch, "segment_cmsg", staticmethod(
        lambda size: [(socket.IPPROTO_UDP, batch.UDP_SEGMENT, b"\x00")]))
    new, s_new, n_new, k_after = _send_stream(True, 60 * wire.CHUNK_ELEMS, KEY)
    assert k_after == 1  # batched sending is off for good on this engine
    # The same datagrams, but under new message numbers: the refused batch's rows had
    # taken theirs, and a number is never used twice (the MAC's nonce).
    assert [_sans_nonce(d) for d in new] == [_sans_nonce(d) for d in old]
    seqs = [wire.unpack_header(d).seq for d in new]
    assert len(set(seqs)) == len(seqs) and seqs[0] > FIRST_SEQ
    assert all(wire.Sealer(KEY).verify(d, len(d), 2) for d in new)
    assert n_new == s_old.count and s_new.chunks_sent == s_old.chunks_sent


def test_a_send_cut_short_by_a_full_socket_buffer_sends_the_rest_next(monkeypatch):
    """sendmmsg stops after whole GSO messages when the buffer fills: the stream accounts
    exactly the datagrams that left, and the next call starts with the first that did not."""
    if batch.NATIVE is None:
        pytest.fail("dblp._fastpath is not built: run ./setup.sh")
    old, s_old, n_old, _ = _send_stream(False, 300 * wire.CHUNK_ELEMS + 5, None)
    real, calls = batch.NATIVE, []

    class OneMessageLeaves:
        def __getattr__(self, name):
            return getattr(real, name)

        def send_gso(self, fd, buf, template, off, rows, chunks, addr, tag, per, *auth):
            calls.append(len(chunks))
            return real.send_gso(fd, buf, template, off, rows, chunks[:per], addr, tag, per,
                                 *auth)

    monkeypatch.setattr(batch, "NATIVE", OneMessageLeaves())
    new, s_new, n_new, k_new = _send_stream(True, 300 * wire.CHUNK_ELEMS + 5, None)
    assert k_new == batch.GSO_MESSAGES * batch.GSO_MAX_SEGMENTS and max(calls) > k_new // 2
    assert new == old
    assert n_new == n_old == s_new.chunks_sent == s_old.count


@pytest.mark.parametrize("core", [True, False], ids=["core", "python"])
@pytest.mark.parametrize("key", [None, KEY], ids=["open", "keyed"])
def test_a_send_the_kernel_stops_after_one_message_counts_that_messages_datagrams(
        key, core, monkeypatch):
    """A stop between GSO messages, made by the kernel: with IP_RECVERR a port that is
    not listening answers the first message's datagrams with ICMP, and the send after it
    fails. In the C core without a secret the messages leave in one sendmmsg, which
    returns how many left; with one, each leaves in its own as soon as it is tagged; in
    Python (no core built) each leaves in its own sendmsg. Every path must add up the same."""
    if batch.NATIVE is None or (key is not None and not batch.native_auth()):
        pytest.fail("dblp._fastpath is not built with its MAC: run ./setup.sh")
    if not core:
        monkeypatch.setattr(batch, "NATIVE", None)
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    addr = closed.getsockname()
    closed.close()
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR (Linux), not in Python's socket module
    sealer = wire.Sealer(key)
    rows = np.zeros((3 * batch.GSO_MAX_SEGMENTS, wire.CHUNK_BYTES), np.uint8)
    template = wire.pack_header(MsgType.DATA, src=1, part=0, session=SESSION, round=ROUND,
                                count=len(rows), length=wire.CHUNK_BYTES)
    chunks = np.arange(len(rows), dtype=np.int64)  # three messages' worth
    try:
        sent = batch.SendBatch(len(rows), wire.CHUNK_BYTES).send(tx, template, chunks, rows,
                                                                  sealer, addr, 2)
    finally:
        tx.close()
    assert sent == batch.GSO_MAX_SEGMENTS


def test_a_resend_pass_is_counted_per_datagram():
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    old, s_old, _, _ = _send_stream(False, 90 * wire.CHUNK_ELEMS, None, passes=2)
    new, s_new, _, _ = _send_stream(True, 90 * wire.CHUNK_ELEMS, None, passes=2)
    assert old == new
    assert s_new.retransmitted == s_old.retransmitted == 90


def test_batch_size_follows_the_pacing_rate():
    wire_bytes = Engine.wire_size(wire.MAX_DATAGRAM)
    assert batch.batch_limit(20e6, wire.MAX_DATAGRAM, wire_bytes) == batch.MIN_BATCH == 4
    assert batch.batch_limit(100e6, wire.MAX_DATAGRAM, wire_bytes) == 4
    assert batch.batch_limit(1e9, wire.MAX_DATAGRAM, wire_bytes) == 41
    assert batch.batch_limit(10e9, wire.MAX_DATAGRAM, wire_bytes) == 44
    assert batch.batch_limit(None, wire.MAX_DATAGRAM, wire_bytes) == 44
    # several GSO messages per call (the C core): only where the rate asks for them
    assert batch.batch_limit(1e9, wire.MAX_DATAGRAM, wire_bytes, messages=4) == 41
    assert batch.batch_limit(3e9, wire.MAX_DATAGRAM, wire_bytes, messages=4) == 123
    assert batch.batch_limit(10e9, wire.MAX_DATAGRAM, wire_bytes, messages=4) == 176
    # IP-fragmented chunks (the prototype's 8 KB) cannot be GSO segments
    assert batch.batch_limit(10e9, wire.datagram_size(8192), Engine.wire_size(8256)) == 1


def test_a_batch_borrows_no_more_than_single_datagrams_would():
    clock = [0.0]
    b = TokenBucket(100e6, clock=lambda: clock[0])
    full = wire.MAX_DATAGRAM
    k = b.allowance(full)
    assert k == int(b.depth // (full + b.overhead)) >= 1
    b.consume(k * full, count=k)
    assert 0 <= b.tokens < full + b.overhead
    assert b.allowance(full) == 0 and b.wait_time(full) > 0


def test_paced_batches_keep_the_rate():
    """At 200 Mbit/s (batches of 8) the data sent in 0.3 s is what the bucket allows."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    rx = _rx()
    eng = Engine(1, bind=("127.0.0.1", 0), session=SESSION, rate_bps=200e6)
    try:
        assert eng.batch_max == 8
        eng.peers.addrs[2] = rx.getsockname()
        eng.begin_round(ROUND)
        s = OutTransfer(eng, PUSH, 0, 2, np.zeros(4000 * wire.CHUNK_ELEMS, np.float32), 0)
        eng.add_sender(s)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            eng._send_some(time.monotonic())
        elapsed = time.monotonic() - t0
        wire_bytes = s.chunks_sent * Engine.wire_size(wire.MAX_DATAGRAM)
        allowed = 200e6 / 8 * elapsed + eng.bucket.depth
        assert wire_bytes <= allowed * 1.001
        assert wire_bytes >= 0.25 * 200e6 / 8 * elapsed  # it does send (a loaded CI box is slow)
    finally:
        eng.close()
        rx.close()


# -- receiving --------------------------------------------------------------------------
def test_the_c_core_is_built_and_takes_runs():
    """The install builds it here; a silent fallback would leave the line-rate path untested."""
    assert batch.NATIVE is not None, "dblp._fastpath is not built: run ./setup.sh"
    assert batch.NATIVE.__file__.startswith(str(__import__("pathlib").Path(batch.__file__).parent))
    # ./setup.sh installs libssl-dev: keyed jobs must get the C path too
    assert batch.native_auth(), "dblp._fastpath was built without libcrypto (libssl-dev)"


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 65_536 + 3, 3 * 65_536 + 8, 1_000_003])
def test_sum_squares_is_the_same_bits_with_and_without_the_c_core(numel, monkeypatch):
    """Every replica computes the detector's norm and must decide its phase alike:
    a rank without the core takes the core's order in numpy, bit for bit."""
    rng = np.random.default_rng(numel)
    x = (rng.standard_normal(numel) * rng.uniform(0, 50, numel)).astype(np.float32)
    assert batch.NATIVE is not None, "dblp._fastpath is not built: run ./setup.sh"
    with_core = rounds.sum_squares(x)
    monkeypatch.setattr(batch, "NATIVE", None)
    without = rounds.sum_squares(x)
    assert with_core.hex() == without.hex()
    exact = float(np.dot(x.astype(np.float64), x.astype(np.float64)))
    assert abs(with_core - exact) <= 1e-12 * exact


def _datagrams(numel: int, key, kind=PUSH, src=2, round=ROUND, session=SESSION):
    """The DATA datagrams of one stream from rank ``src``, in index order."""
    sealer = wire.Sealer(key)
    data = (np.arange(numel, dtype=np.float32) * 0.25 + src).view(np.uint8)
    count = -(-data.nbytes // wire.CHUNK_BYTES)
    out = []
    for c in range(count):
        payload = data[c * wire.CHUNK_BYTES:(c + 1) * wire.CHUNK_BYTES].tobytes()
        out.append(sealer.seal(wire.pack_body(
            MsgType.DATA, payload, src=src, part=0, session=session, round=round, index=c,
            count=count, bound=0, aux=1 + c % 3, flags=wire.Flag.PULL if kind == PULL else 0,
            copies=1 + c % 2), 1))
    return out


def _mix(numel: int, key, seed: int):
    """A hostile, lossy, reordered arrival sequence for one stream (and its neighbours)."""
    rng = np.random.default_rng(seed)
    good = _datagrams(numel, key)
    seq = [good[i] for i in rng.permutation(len(good)) if rng.random() > 0.1]
    seq += [good[i] for i in rng.integers(0, len(good), 12)]  # duplicates
    extra = [
        _datagrams(numel, key, round=ROUND + 1)[0],  # next round: kept for later
        _datagrams(numel, key, round=ROUND - 1)[1],  # stale
        _datagrams(numel, key, session=SESSION + 1)[2],  # another job
        _datagrams(numel, key, src=7)[3],  # unknown sender
        _datagrams(numel, wire.ZERO_TAG * 2)[4],  # forged tag (wrong key)
        wire.Sealer(key).seal(_datagrams(numel, key)[9][:-wire.TAG_SIZE], 0),  # for rank 0
        wire.pack(MsgType.PROBE, key=key, dst=1, src=2, part=0, session=SESSION, round=ROUND, index=1,
                  count=len(good), copies=2),
        b"\x00" * 30,  # truncated
        good[5][:-4],  # declared length != payload
        good[6] + b"\x00" * 70000,  # oversized
        good[8] + b"\x00" * 3000,  # longer than any datagram the job takes, shorter than 64 KB
    ]
    bad_count = bytearray(good[7][:-wire.TAG_SIZE])
    struct.pack_into("!I", bad_count, wire.FIELD_OFFSETS["count"][0], len(good) + 1)
    extra.append(wire.Sealer(key).seal(bytes(bad_count), 1))
    for d in extra:
        seq.insert(int(rng.integers(0, len(seq) + 1)), d)
    return seq[:]


def _receiver(key, kind, numel, peer_addr, bound_ppm=0):
    eng = Engine(1, bind=("127.0.0.1", 0), session=SESSION, key=key)
    if key is not None:
        eng.sealer.seq = FIRST_SEQ  # both paths' replies numbered alike, so comparable
    eng.peers.addrs[2] = peer_addr
    eng.begin_round(ROUND)
    out = np.ones(numel, np.float32) * 0.5
    add = kind == PUSH
    r = InTransfer(eng, kind, 0, 2, out, bound_ppm, add=add, freeze=add)
    eng.add_receiver(r)
    return eng, r, out


def _feed_one_by_one(eng, seq, addr, now):
    for d in seq:
        if len(d) <= 65536:
            eng.handle(memoryview(d), len(d), addr, None, now)


def _feed_batched(eng, seq, addr, now):
    ring = eng.ring
    # as the kernel fills a slot: a datagram longer than the slot arrives cut to its size
    seq = [d[:ring.slot] for d in seq if len(d) <= 65536]
    name = struct.pack("=H", socket.AF_INET) + struct.pack("!H", addr[1]) + \
        socket.inet_aton(addr[0]) + bytes(8)
    for start in range(0, len(seq), ring.slots):
        part = seq[start:start + ring.slots]
        for i, d in enumerate(part):
            ring.data[i, :len(d)] = np.frombuffer(d, np.uint8)
            ring.lens[i] = len(d)
            ring.names[i] = np.frombuffer(name, np.uint8)
        batch.deliver(eng, ring, len(part), now)


@pytest.mark.parametrize("key", [None, KEY], ids=["open", "keyed"])
@pytest.mark.parametrize("kind", [PUSH, PULL], ids=["push-accumulate-freeze", "pull-copy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bound_ppm", [0, 300_000], ids=["reliable", "stop-mid-run"])
def test_batched_receive_leaves_what_one_by_one_leaves(key, kind, seed, bound_ppm, core):
    numel = 150 * wire.CHUNK_ELEMS + 33  # a short last chunk
    seq = _mix(numel, key, seed)
    if kind == PULL:  # the same datagrams as a pull stream
        seq = [_as_pull(d, key) for d in seq]
    _same_outcome(key, kind, numel, seq, bound_ppm, core)


def _same_outcome(key, kind, numel, seq, bound_ppm, core) -> None:
    """``seq`` fed one by one and through ``batch.deliver`` leaves the same receiver behind."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    rx = _rx()
    peer = rx.getsockname()
    try:
        results = []
        for feed in (_feed_one_by_one, _feed_batched):
            eng, r, out = _receiver(key, kind, numel, peer, bound_ppm)
            try:
                feed(eng, seq, peer, 100.0)
                replies = []
                rx.settimeout(0.2)
                try:
                    while True:
                        replies.append(rx.recv(65536))
                except TimeoutError:
                    pass
                results.append((out.tobytes(), r.have.copy(), r.n_have, r.stopped, r.max_pass,
                                r.t_first, eng.counters.snapshot(), len(eng.early), replies))
            finally:
                eng.close()
        if core is not None and (key is None or batch.native_auth()):
            assert core.rows > 0  # the C core took runs of this sequence
            # ...and checked the tags of the rows it left to Python (in one call per sender)
            assert (core.checked > 0) == (key is not None)
        a, b = results
        names = ["out", "have", "n_have", "stopped", "max_pass", "t_first", "counters", "early",
                 "replies"]
        for name, x, y in zip(names, a, b, strict=True):
            if isinstance(x, np.ndarray):
                assert np.array_equal(x, y), name
            else:
                assert x == y, name
    finally:
        rx.close()


def _fuzzed(numel: int, key, seed: int) -> list[bytes]:
    """A stream's datagrams with random damage: flipped bytes (header, payload or tag), cut
    ends, fields set to edge values; a third of the damaged ones sealed again with the key
    (a member with the key gone wrong), so the checks after the tag are reached too."""
    rng = np.random.default_rng(seed)
    good = _datagrams(numel, key)
    seq = [good[i] for i in rng.permutation(len(good))]
    out = []
    for i, d in enumerate(seq):
        if i < 8 or rng.random() < 0.7:  # a clean start: the C core takes the leading run
            out.append(d)
            continue
        body = bytearray(d)
        what = rng.integers(0, 4)
        if what == 0:  # flip bytes anywhere
            for _ in range(int(rng.integers(1, 4))):
                body[int(rng.integers(0, len(body)))] ^= int(rng.integers(1, 256))
        elif what == 1:  # a header field at an edge value
            name = wire.FIELD_NAMES[int(rng.integers(0, len(wire.FIELD_NAMES)))]
            off, size = wire.FIELD_OFFSETS[name]
            top = (1 << 8 * size) - 1
            edge = [0, 1, top, int.from_bytes(rng.bytes(size), "big")]
            body[off:off + size] = edge[int(rng.integers(0, 4))].to_bytes(size, "big")
        elif what == 2:  # cut short, or lengthened (within one datagram: a longer one
            # reaches a ring slot cut, as the kernel cuts it, which the MAC then refuses)
            room = wire.MAX_DATAGRAM - len(body)
            body = body[:int(rng.integers(0, len(body)))] if rng.random() < 0.5 or room < 1 \
                else body + bytes(int(rng.integers(1, min(64, room) + 1)))
        else:  # the tag alone
            body[-1] ^= 0x80
        if key is not None and rng.random() < 0.33 and len(body) > wire.TAG_SIZE:
            body = bytearray(wire.Sealer(key).seal(bytes(body[:-wire.TAG_SIZE]), 1))
        out.append(bytes(body))
    return out


@pytest.mark.parametrize("key", [None, KEY], ids=["open", "keyed"])
@pytest.mark.parametrize("kind", [PUSH, PULL], ids=["push", "pull"])
@pytest.mark.parametrize("seed", range(6))
def test_take_run_fuzzed_against_the_per_datagram_path(key, kind, seed, core):
    """The batched path (the C core's ``take_run`` first) and ``Engine.handle`` one by one,
    on randomly damaged datagrams, with and without a secret: the same outcome."""
    numel = 120 * wire.CHUNK_ELEMS + 5
    seq = _fuzzed(numel, key, 1000 + seed)
    if kind == PULL:
        seq = [_as_pull(d, key) for d in seq]
    _same_outcome(key, kind, numel, seq, 0 if seed % 2 else 200_000, core)


@pytest.mark.parametrize("pair", [(0, 0, 0), (SESSION, 2, 1), (2**64 - 1, 65535, 65534)])
@pytest.mark.parametrize("length", [wire.HEADER_SIZE, 100, wire.MAX_DATAGRAM - wire.TAG_SIZE])
def test_the_c_cores_tags_are_pythons(pair, length):
    """The core's GMAC under a pair key is Python's (``cryptography``) for the message whose
    header names that pair; another destination, or another message number, another tag."""
    if not batch.native_auth():
        pytest.skip("the C core was built without libcrypto")
    session, src, dst = pair
    body = bytearray(np.random.default_rng(length).integers(0, 256, length, np.uint8).tobytes())
    struct.pack_into("!Q", body, wire.FIELD_OFFSETS["session"][0], session)
    struct.pack_into("!H", body, wire.FIELD_OFFSETS["src"][0], src)
    for key in (KEY, bytes(range(16)), bytes(range(64))):
        sealer = wire.Sealer(key)
        mac = batch.NATIVE.mac_new(sealer.pair_key(session, src, dst))
        assert batch.NATIVE.mac_tag(mac, bytes(body)) == sealer.tag(dst, body)
        assert batch.NATIVE.mac_tag(mac, bytes(body)) != sealer.tag(dst ^ 1, body)
        renumbered = bytearray(body)
        renumbered[wire.SEQ_OFFSET + 7] ^= 1
        assert batch.NATIVE.mac_tag(mac, bytes(renumbered)) != sealer.tag(dst, body)
        assert batch.NATIVE.mac_tag(mac, bytes(renumbered)) == sealer.tag(dst, renumbered)


def test_the_c_cores_ring_check_is_sealer_verify_row_by_row():
    """``mac_check`` over rows of a ring says what ``Sealer.verify`` says of each: the
    sender's own datagrams pass; a flipped byte of header, payload or tag, another
    destination's, another key's, a cut one and a too-short one fail. A row outside the
    ring is an error, not a read."""
    if not batch.native_auth():
        pytest.skip("the C core was built without libcrypto")
    good = _datagrams(8 * wire.CHUNK_ELEMS + 3, KEY)
    rows = list(good)
    for off in (0, wire.HEADER_SIZE + 5, -1):  # header, payload, tag
        b = bytearray(good[1])
        b[off] ^= 0x40
        rows.append(bytes(b))
    rows.append(wire.Sealer(KEY).seal(good[2][:-wire.TAG_SIZE], 0))  # for rank 0
    rows.append(_datagrams(wire.CHUNK_ELEMS, bytes(range(16)))[0])  # another job's key
    rows += [good[3][:-1], good[4][:wire.HEADER_SIZE + 3]]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ring = batch.RecvRing(sock, len(rows), wire.MAX_DATAGRAM, gro=False)
    finally:
        sock.close()
    for i, d in enumerate(rows):
        ring.data[i, :len(d)] = np.frombuffer(d, np.uint8)
        ring.lens[i] = len(d)
    sealer = wire.Sealer(KEY)
    want = [sealer.verify(d, len(d), 1) for d in rows]
    assert want[:len(good)] == [True] * len(good) and not any(want[len(good):])
    mac = batch.NATIVE.mac_new(sealer.pair_key(SESSION, 2, 1))
    ok = np.zeros(len(rows), np.uint8)
    batch.NATIVE.mac_check(mac, ring.data, ring.stride, ring.lens, np.arange(len(rows)), ok)
    assert ok.astype(bool).tolist() == want
    with pytest.raises(ValueError, match="outside the ring"):
        batch.NATIVE.mac_check(mac, ring.data, ring.stride, ring.lens,
                               np.array([0, len(rows)], np.int64), ok)


def test_every_message_a_sealer_makes_has_a_number_of_its_own():
    """GMAC's nonce never repeats under a key: Python's seals, the rows Python fills and the
    rows the core sends take numbers from one counter, which starts at random."""
    sealer = wire.Sealer(KEY)
    assert wire.Sealer(KEY).seq != sealer.seq  # a restarted rank does not start where it did
    body = wire.pack_body(MsgType.PROBE, src=2, session=SESSION, round=ROUND)
    first = [wire.unpack_header(sealer.seal(body, 1)).seq for _ in range(3)]
    sb = batch.SendBatch(8, wire.CHUNK_BYTES)
    rows = np.zeros((4, wire.CHUNK_BYTES), np.uint8)
    tmpl = wire.pack_header(MsgType.DATA, src=2, session=SESSION, round=ROUND, count=4,
                            length=wire.CHUNK_BYTES)
    filled = np.frombuffer(sb.fill(tmpl, np.arange(4), rows, sealer, 1), np.uint8)
    rowseq = [wire.unpack_header(filled[i * sb.datagram:(i + 1) * sb.datagram].tobytes()).seq
              for i in range(4)]
    after = wire.unpack_header(sealer.seal(body, 1)).seq
    numbers = first + rowseq + [after]
    assert numbers == list(range(first[0], first[0] + 8))
    assert wire.Sealer(None).seal(body, 1)[wire.SEQ_OFFSET:wire.SEQ_OFFSET + 8] == bytes(8)


def _as_pull(d: bytes, key) -> bytes:
    """``d`` with the PULL flag set (re-sealed), if it is a DBLP datagram of ours."""
    if len(d) < wire.HEADER_SIZE + wire.TAG_SIZE or d[:2] != b"\xdb\x1b" or \
            len(d) > wire.MAX_DATAGRAM:
        return d
    body = bytearray(d[:-wire.TAG_SIZE])
    body[wire.FIELD_OFFSETS["flags"][0]] |= int(wire.Flag.PULL)
    forged = d[-wire.TAG_SIZE:] != wire.Sealer(key).tag(1, d[:-wire.TAG_SIZE])
    return bytes(body) + (d[-wire.TAG_SIZE:] if forged else wire.Sealer(key).tag(1, bytes(body)))


def test_stop_comes_at_the_same_chunk_when_a_run_crosses_the_bound(core):
    """A frozen push stream with a loose bound: the STOP in the middle of a run."""
    if not batch.batching_supported():
        pytest.skip("no recvmmsg here")
    numel = 100 * wire.CHUNK_ELEMS
    seq = _datagrams(numel, None)
    rx = _rx()
    peer = rx.getsockname()
    try:
        got = []
        for feed in (_feed_one_by_one, _feed_batched):
            eng = Engine(1, bind=("127.0.0.1", 0), session=SESSION)
            eng.peers.addrs[2] = peer
            eng.begin_round(ROUND)
            out = np.zeros(numel, np.float32)
            r = InTransfer(eng, PUSH, 0, 2, out, 300_000, add=True, freeze=True)  # may miss 30
            eng.add_receiver(r)
            feed(eng, seq, peer, 5.0)
            stop = rx.recv(65536)
            got.append((out.tobytes(), r.n_have, eng.counters.snapshot(), stop))
            eng.close()
        assert got[0] == got[1]
        assert got[0][1] == 70 and got[0][2]["late"] == 30
        if core is not None:
            assert core.rows == 69  # the C core took the run up to the chunk that STOPs it
    finally:
        rx.close()


def _trickle(eng: Engine, seconds: float, gap: float) -> tuple[int, int]:
    """Datagrams sent at ``eng`` one at a time every ``gap`` s, and ring reads that took them."""
    import threading

    reads = []
    real = batch.deliver

    def counting(e, ring, m, now):
        reads.append(m)
        real(e, ring, m, now)

    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = [0]

    def send():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tx.sendto(b"not a datagram of ours", eng.address)
            sent[0] += 1
            time.sleep(gap)

    t = threading.Thread(target=send)
    batch.deliver = counting
    try:
        t.start()
        with pytest.raises(Exception, match="quiet"):
            eng.run_until(lambda: False, time.monotonic() + seconds + 0.2, lambda: "quiet")
    finally:
        t.join()
        batch.deliver = real
        tx.close()
    return sent[0], len(reads)


def test_a_trickle_is_read_in_batches_not_a_datagram_per_wake():
    """Receive coalescing: after a short read the engine lets a batch gather.

    Without it every datagram of a trickle (here one per ~0.1 ms, a slow
    sender's pace) wakes the loop and costs a ring read of its own; with it a
    read takes what ``COALESCE_SECONDS`` (0.5 ms) brought, several at once.
    """
    eng = Engine(0, bind=("127.0.0.1", 0), session=SESSION, batched_io=True)
    try:
        sent, reads = _trickle(eng, 0.4, 0.0001)
        assert eng.counters.malformed == sent  # every datagram was read, and refused
        assert sent / reads >= 2.0, (sent, reads)  # 1.0 without coalescing
    finally:
        eng.close()


# -- receive offload: a coalesced run cut back into the datagrams it was ---------------------
def _gro_pair(slots: int, gro: bool):
    """A receiving socket with a ring (offload on or off) and a sender, on loopback.

    On loopback a GSO send reaches a socket that asked for offload as ONE
    message with its segment size, and one that did not as the datagrams.
    """
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    ring = batch.RecvRing(rx, slots=slots, largest=wire.MAX_DATAGRAM, gro=gro)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return rx, ring, tx


def _gso(tx, dest, payload: bytes, seg: int) -> None:
    tx.sendmsg([payload], [(socket.IPPROTO_UDP, batch.UDP_SEGMENT, struct.pack("=H", seg))], 0,
               dest)


def _sends(tx, dest) -> None:
    """Runs the kernel coalesces, and datagrams it cannot: odd sizes, one too long, one empty."""
    rng = np.random.default_rng(5)
    blob = rng.integers(0, 256, 44 * wire.MAX_DATAGRAM, np.uint8).tobytes()
    _gso(tx, dest, blob, wire.MAX_DATAGRAM)  # a full run of MTU datagrams
    _gso(tx, dest, blob[:7 * 1000 + 321], 1000)  # a short last one
    tx.sendto(b"one datagram alone", dest)
    tx.sendto(blob[:3000], dest)  # longer than a slot: cut as recvmmsg cuts it
    tx.sendto(b"", dest)
    _gso(tx, dest, blob[:5 * 600], 600)


def _drain(ring) -> list[tuple[bytes, bytes]]:
    got, deadline = [], time.monotonic() + 2
    while time.monotonic() < deadline:
        m = ring.receive()
        got += [(ring.data[i, :ring.lens[i]].tobytes(), ring.names[i].tobytes())
                for i in range(m)]
        if m == 0 and len(got) >= 44 + 8 + 3 + 5 and not ring.held():
            break
    return got


@pytest.mark.parametrize("slots", [128, 5], ids=["ring", "ring-fuller-than-its-slots"])
def test_a_coalesced_run_reaches_the_ring_as_the_datagrams_it_was(slots):
    if batch.NATIVE is None:
        pytest.fail("dblp._fastpath is not built: run ./setup.sh")
    rings = []
    for gro in (False, True):
        rx, ring, tx = _gro_pair(slots, gro)
        try:
            assert ring.gro == gro, "the kernel refused UDP_GRO"
            _sends(tx, rx.getsockname())
            time.sleep(0.05)
            got = _drain(ring)
            if gro:  # the kernel did coalesce: the offload path was taken
                assert ring.bsegs.max() == wire.MAX_DATAGRAM or ring.blens.max() > 1472
            names = {n for _, n in got}
            assert len(names) == 1  # every slot names the one sender
            rings.append([d for d, _ in got])
        finally:
            rx.close()
            tx.close()
    plain, offload = rings
    assert len(plain) == 44 + 8 + 3 + 5
    assert offload == plain
    assert plain[45 + 7] == b"one datagram alone" and len(plain[45 + 8]) == wire.MAX_DATAGRAM + 1
    assert plain[45 + 9] == b""


def test_a_blocked_sources_coalesced_runs_are_dropped_unread():
    """A source of bad tags (``BadSources``): the core drops its coalesced messages whole and
    counts their datagrams; another sender's, interleaved with them, arrive as they were."""
    if batch.NATIVE is None:
        pytest.fail("dblp._fastpath is not built: run ./setup.sh")
    rx, ring, flood = _gro_pair(128, True)
    honest = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert ring.gro, "the kernel refused UDP_GRO"
        blob = bytes(range(256)) * (44 * wire.MAX_DATAGRAM // 256 + 1)
        dest = rx.getsockname()
        flood.bind(("127.0.0.1", 0))
        for i in range(3):
            _gso(flood, dest, blob[:44 * wire.MAX_DATAGRAM], wire.MAX_DATAGRAM)
            honest.sendto(b"honest %d" % i, dest)
        time.sleep(0.05)
        key = batch.port_and_ip(flood.getsockname())
        got, dropped = [], 0
        for _ in range(10):
            m = ring.receive(key)
            dropped += ring.take_dropped()
            got += [ring.data[i, :ring.lens[i]].tobytes() for i in range(m)]
            if m == 0 and not ring.held():
                break
        assert got == [b"honest 0", b"honest 1", b"honest 2"]
        assert dropped == 3 * 44
    finally:
        rx.close()
        flood.close()
        honest.close()


def test_an_engine_reads_what_its_ring_holds_though_the_socket_is_idle():
    """More coalesced datagrams than one poll reads: the rest wait in the ring, not in the socket.

    The socket signals nothing more, so a poll that only waited on it would
    leave them until the next arrival (the last chunks of a round, a STOP).
    """
    eng = Engine(0, bind=("127.0.0.1", 0), session=SESSION, batched_io=True)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert eng.ring is not None and eng.ring.gro
        junk = b"\x00" * 100 * 44  # not DBLP: each datagram is counted as malformed
        for _ in range(batch.GRO_MESSAGES):
            _gso(tx, eng.address, junk, 100)
        time.sleep(0.05)
        total = batch.GRO_MESSAGES * 44
        eng.poll(0.5)
        assert 0 < eng.counters.malformed < total and eng.ring.held()  # one poll's limit
        t0 = time.monotonic()
        while eng.counters.malformed < total and time.monotonic() - t0 < 1:
            eng.poll(0.5)
        assert eng.counters.malformed == total
        assert time.monotonic() - t0 < 0.25  # no poll waited out its timeout
    finally:
        tx.close()
        eng.close()


def test_receive_coalescing_waits_one_batch_of_the_pacing_rate_within_bounds():
    wire_bytes = Engine.wire_size(wire.MAX_DATAGRAM)
    # a sharded rank at 19 Mbit/s: four datagrams of 1514 wire bytes, 2.55 ms, capped at 2.5
    assert batch.coalesce_seconds(19e6, 4, wire_bytes) == batch.COALESCE_MAX_SECONDS
    # a parameter-server worker's 4.75 Mbit/s would be 10 ms: the cap keeps its pull's end close
    assert batch.coalesce_seconds(4.75e6, 4, wire_bytes) == batch.COALESCE_MAX_SECONDS
    # fast links and unpaced engines keep the half millisecond
    assert batch.coalesce_seconds(1e9, 41, wire_bytes) == batch.COALESCE_SECONDS
    assert batch.coalesce_seconds(None, 44, wire_bytes) == batch.COALESCE_SECONDS
    assert batch.coalesce_seconds(50e6, 4, wire_bytes) == pytest.approx(4 * wire_bytes * 8 / 50e6)
