"""The socket filter drops exactly the blocked sources' datagrams, in the kernel."""
from __future__ import annotations

import socket

import pytest

from dblp import batch, sockfilter

pytestmark = pytest.mark.unit


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def _drain(sock: socket.socket) -> list[bytes]:
    sock.settimeout(0.2)
    got = []
    try:
        while True:
            got.append(sock.recv(64))
    except TimeoutError:
        return got


def test_a_blocked_source_never_reaches_the_socket_and_others_do():
    rx, bad, good, bad2 = _udp(), _udp(), _udp(), _udp()
    keys = b"".join(batch.port_and_ip(s.getsockname()) or b"" for s in (bad, bad2))
    sockfilter.drop_sources(rx, keys)
    before = sockfilter.socket_drops(rx)
    for _ in range(20):
        bad.sendto(b"bad", rx.getsockname())
        good.sendto(b"good", rx.getsockname())
        bad2.sendto(b"bad2", rx.getsockname())
    assert _drain(rx) == [b"good"] * 20
    assert before is not None and sockfilter.socket_drops(rx) == before + 40
    # Unblocked again (the block expired): the filter goes, the source is heard.
    sockfilter.drop_sources(rx, b"")
    bad.sendto(b"bad", rx.getsockname())
    assert _drain(rx) == [b"bad"]


def test_the_program_lists_each_source_once_and_stays_within_the_kernels_limit():
    one = batch.port_and_ip(("10.0.0.1", 4242))
    assert one is not None
    prog = sockfilter.program(one)
    assert len(prog) == 6 and prog[1][3] == 0x0A000001 and prog[3][3] == 4242
    assert prog[-1] == (0x06, 0, 0, 0xFFFFFFFF)  # everything else accepted
    many = one * (sockfilter.MAX_SOURCES + 100)
    assert len(sockfilter.program(many)) == 5 * sockfilter.MAX_SOURCES + 1 <= 4096


def test_a_keyed_jobs_filter_lets_through_joins_and_its_members_only():
    """With ``allow`` (the job's session, its members' addresses): a join message from
    anyone, anything else only with the session from a member; another session, a
    stranger, and a datagram shorter than a header are dropped in the kernel."""
    from dblp import wire
    from dblp.wire import MsgType

    rx, member, stranger = _udp(), _udp(), _udp()
    session = 0x1234_5678_9ABC_DEF1

    def msg(t, sess):
        return wire.pack_header(t, src=1, session=sess) + wire.ZERO_TAG
    sockfilter.drop_sources(rx, b"", (session, batch.port_and_ip(member.getsockname()) or b""))
    before = sockfilter.socket_drops(rx)
    sends = [(member, msg(MsgType.DATA, session), True),
             (member, msg(MsgType.DATA, session ^ 1), False),        # another session
             (member, msg(MsgType.PROBE, session ^ (1 << 40)), False),
             (stranger, msg(MsgType.DATA, session), False),          # not a member
             (stranger, msg(MsgType.HELLO, 0), True),                # a join: anyone's
             (stranger, msg(MsgType.CHALLENGE, 7), True),
             (member, b"\x00" * 20, False)]                          # shorter than a header
    for s, data, _ in sends:
        s.sendto(data, rx.getsockname())
    rx.settimeout(0.2)
    got = []
    try:
        while True:
            got.append(rx.recv(4096))
    except TimeoutError:
        pass
    assert got == [data for _, data, ok in sends if ok]
    assert before is not None and sockfilter.socket_drops(rx) == before + 4
