"""One routed k=4 fat-tree for the emulation tests that only use a started fabric.

Starting and stopping a fabric costs seconds, and the fabric tests
(test_fabric.py) and the burst tests (test_fabric_bursts.py) asked for the
same one (k=4, 20 Mbit/s, 100-packet queues), each its own. ``fattree`` is
started by the first test that asks for it and stopped right after the last
test in a row that uses it (``pytest_runtest_teardown`` below), not at the
end of the session: the tests after it (clean-up, whole runs) need a machine
with no fabric of the project's on it. The two files sort next to each other,
so the default order starts it once.
"""
import pytest

from testbed.emulation.fabric import Fabric
from topologies import FatTreeTopo

FIXTURE = "fattree"


class SharedFabric:
    """The shared fat-tree: started on first ``get``, stopped by ``stop`` (again on the next ``get``)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.fabric: Fabric | None = None

    def get(self) -> Fabric:
        if self.fabric is None:
            fabric = Fabric(FatTreeTopo(4), run_dir=str(self.tmp_path_factory.mktemp("fattree")),
                            bw_mbps=20, queue_pkts=100)
            self.fabric = fabric.__enter__()
        return self.fabric

    def stop(self) -> None:
        fabric, self.fabric = self.fabric, None
        if fabric is not None:
            fabric.__exit__(None, None, None)


_shared: list[SharedFabric] = []


@pytest.fixture(scope="session")
def fattree(tmp_path_factory, emulator):
    """The shared k=4 fat-tree's holder: ``fattree.get()`` is the started fabric."""
    shared = SharedFabric(tmp_path_factory)
    _shared.append(shared)
    yield shared
    shared.stop()
    _shared.remove(shared)


def pytest_runtest_teardown(item, nextitem):
    """Stop the shared fabric after the last test of a row that uses it."""
    if FIXTURE in getattr(item, "fixturenames", ()) and \
            (nextitem is None or FIXTURE not in getattr(nextitem, "fixturenames", ())):
        for shared in _shared:
            shared.stop()
