"""The bottleneck monitor's rate arithmetic, on a real interface (loopback)."""
import socket
import time

import pytest

from testbed.run.fidelity import BottleneckMonitor


@pytest.mark.unit
def test_monitor_sees_traffic_on_loopback():
    mon = BottleneckMonitor("lo", shaped_mbps=1000.0, window_s=0.2)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 1400
    end = time.monotonic() + 0.6
    sent = 0
    while time.monotonic() < end:
        tx.sendto(payload, rx.getsockname())
        sent += 1
        if sent % 50 == 0:
            while True:
                rx.setblocking(False)
                try:
                    rx.recv(2048)
                except BlockingIOError:
                    break
    out = mon.summary()
    assert out["bottleneck"] == "lo"
    # at least a few Mbit/s went through lo in the busiest 200 ms window
    assert out["achieved_mbps"] > 5
    assert out["shaped_mbps"] == 1000.0
