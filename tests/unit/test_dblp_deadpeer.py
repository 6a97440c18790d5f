"""A peer killed mid-round gives a clear error within the round deadline, not a hang."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dblp

pytestmark = pytest.mark.unit

WORKER = r"""
import sys, numpy as np, dblp
g = dblp.TransportGroup(1, 2, "127.0.0.1", int(sys.argv[1]), policy="reliable",
                        rate_bps=4e6, round_timeout=30)
x = np.ones(150_000, np.float32)
for r in range(100):
    g.allreduce_(x)
    print("done", r, flush=True)
"""


def test_killed_worker_gives_clear_errors_within_the_deadline():
    deadline = 2.0
    srv = dblp.ParameterServer("127.0.0.1", 0, 2, "reliable", round_timeout=deadline,
                               idle_timeout=20)
    errors = {}

    def serve():
        try:
            srv.serve(10)
        except Exception as exc:
            errors["server"] = (exc, time.monotonic())
    th = threading.Thread(target=serve)
    th.start()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(srv.port)], stdout=subprocess.PIPE,
                            text=True, cwd=root)
    try:
        g = dblp.TransportGroup(0, 2, "127.0.0.1", srv.port, policy="reliable",
                                round_timeout=deadline)
        x = np.ones(150_000, np.float32)
        g.allreduce_(x)  # round 0 with both workers
        assert proc.stdout.readline().startswith("done 0")
        assert np.allclose(x, 1.0)
        # worker 1 is now pushing round 1 at 4 Mbit/s (~0.6 s): kill it mid-push
        t_kill = time.monotonic()
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(dblp.PeerTimeout) as info:
            g.allreduce_(x)
        t_err = time.monotonic()
        assert t_err - t_kill < deadline + 1.5
        assert "round 1" in str(info.value) and "rank 2" in str(info.value)  # the server
        g.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        th.join(10)
        srv.close()
    exc, t_srv = errors["server"]
    assert isinstance(exc, dblp.PeerTimeout)
    msg = str(exc)
    assert "round 1" in msg and "from rank 1" in msg  # names the dead worker
    assert t_srv - t_kill < deadline + 1.5


def test_server_that_never_answers_gives_a_join_error():
    from dblp.testing import free_port
    g = dblp.TransportGroup(0, 1, "127.0.0.1", free_port(), join_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(dblp.TransportError, match="no WELCOME"):
        g.allreduce_(np.ones(10, np.float32))
    assert time.monotonic() - t0 < 2
    g.close()
