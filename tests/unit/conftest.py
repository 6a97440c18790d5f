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
    eng.peers.addrs[2] = sink.getsockname()
    eng.begin_round(2)
    yield eng
    eng.close()


class FakeVethPair:
    """``bench transport``'s NetnsPair without namespaces: the loss, GRO and TCP counters it sets.

    GRO under a loss is refused, as the real pair's loss hook sits behind it.
    Every TCP counter grows by ``tcp_step`` per read, so a test can see whose
    reads a row's counters span.
    """

    def __init__(self, tcp_step: int = 0):
        from testbed.emulation.netns import NetnsPair

        self.loss, self.gro, self.checksum_offload = 0.0, False, True
        self.tcp_step, self.tcp_reads = tcp_step, 0
        self.counters = NetnsPair.TCP_COUNTERS

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_loss(self, p, protocols="udp, tcp", traffic="all"):
        self.loss, self.traffic = p, traffic
        self.gro = self.gro and p <= 0

    def set_gro(self, on):
        assert not (on and self.loss > 0), "GRO under a loss"
        self.gro = on

    def tcp_counters(self):
        self.tcp_reads += 1
        return dict.fromkeys(self.counters, self.tcp_step * self.tcp_reads)


@pytest.fixture
def fake_veth_pair(monkeypatch):
    """A FakeVethPair that ``bench transport`` gets for its NetnsPair (TCP counters still)."""
    from testbed.bench import transport

    pair = FakeVethPair()
    monkeypatch.setattr(transport, "NetnsPair", lambda rate_bps: pair)
    return pair


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
