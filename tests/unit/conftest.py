"""Fixtures several unit-test files share."""
import socket

import pytest


@pytest.fixture
def sink():
    """A UDP socket on loopback that swallows whatever an engine under test sends."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    yield s
    s.close()
