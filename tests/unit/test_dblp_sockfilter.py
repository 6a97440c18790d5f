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
    keys = b"".join(batch._port_and_ip(s.getsockname()) or b"" for s in (bad, bad2))
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
    one = batch._port_and_ip(("10.0.0.1", 4242))
    assert one is not None
    prog = sockfilter.program(one)
    assert len(prog) == 6 and prog[1][3] == 0x0A000001 and prog[3][3] == 4242
    assert prog[-1] == (0x06, 0, 0, 0xFFFFFFFF)  # everything else accepted
    many = one * (sockfilter.MAX_SOURCES + 100)
    assert len(sockfilter.program(many)) == 5 * sockfilter.MAX_SOURCES + 1 <= 4096
