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


@pytest.fixture
def loopback_engine(sink):
    """A rank-1 engine on loopback in round 2 of session 0xBEEF; its one peer, rank 2, is ``sink``."""
    from dblp.engine import Engine

    eng = Engine(1, bind=("127.0.0.1", 0), session=0xBEEF)
    eng.peers[2] = sink.getsockname()
    eng.begin_round(2)
    yield eng
    eng.close()


class ReachedTheFabric(Exception):
    """A unit test got as far as building an emulated fabric."""


@pytest.fixture(autouse=True)
def no_fabric_in_unit_tests(monkeypatch):
    """Unit tests never build a fabric: one that would (a "bad" spec that became valid) fails.

    Without this guard such a test silently runs a whole experiment on the
    machine's one Mininet slot, for as long as the experiment takes.
    """
    from testbed.emulation import fabric

    def refuse(self, *args, **kwargs):
        raise ReachedTheFabric("a unit test tried to start an emulated fabric")

    monkeypatch.setattr(fabric.Fabric, "start", refuse)
