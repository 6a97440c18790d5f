"""The loopback port a job is given before its processes bind it."""
import socket

import pytest

from dblp.testing import _ephemeral_low, free_port

pytestmark = pytest.mark.unit


def test_a_free_port_is_below_the_ephemeral_range_and_free_for_tcp_and_udp():
    # Below the range no socket's automatic port can take it in the time between the
    # choice and the job's bind (the flood bench's aggregator once lost its port so).
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            t.bind(("127.0.0.1", port))
            u.bind(("127.0.0.1", port))


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_where_it_cannot_be(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert _ephemeral_low(str(f)) == 40000
    assert _ephemeral_low(str(tmp_path / "absent")) == 32768
    f.write_text("")
    assert _ephemeral_low(str(f)) == 32768
