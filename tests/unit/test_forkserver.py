"""Workers and servers forked from a warm process (workloads.forkserver, testbed.run.forkservers).

A real fork server on this machine (no namespace: ``subprocess.Popen`` starts
it, as a host's ``popen`` does on the fabric) forks a real parameter server
and real workers that train on loopback; what the supervision reads of them
(PIDs, exit statuses, logs) must be what it reads of started processes.
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from dblp.testing import free_port
from testbed.run.forkservers import ForkServer, ForkServerError
from testbed.run.processes import ProcessGroup
from workloads.forkserver import enter_namespaces
from workloads.training import TRAINING_FILE, TrainingSettings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("forkserver") / "forkserver.out"
    fs = ForkServer("here", subprocess.Popen, log, dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        fs.wait_ready(time.monotonic() + 120)
        yield fs
    finally:
        fs.close()


def _events(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_forked_server_and_workers_train_on_loopback_and_end_as_started_ones(fork_server,
                                                                                 tmp_path):
    port, rounds = free_port(), 3
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    # As the built-in launcher hands them: the unit's training settings as one file.
    settings = tmp_path / TRAINING_FILE
    TrainingSettings(model="digits_cnn", rounds=rounds, seed=1).write(settings)
    common = ["--arm", "reliable", "--training-config", str(settings)]
    group = ProcessGroup()
    group.start("server", [sys.executable, "-m", "workloads.server", *common,
                           "--host", "127.0.0.1", "--log", str(tmp_path / "server.jsonl")],
                tmp_path / "server.out", popen=fork_server.popen, env=env)
    for rank in range(2):
        group.start(f"worker{rank}", [sys.executable, "-m", "workloads.worker", *common,
                                      "--log", str(tmp_path / f"worker{rank}.jsonl")],
                    tmp_path / f"worker{rank}.out", popen=fork_server.popen,
                    env=dict(env, RANK=str(rank)))
    assert group.wait(["server", "worker0", "worker1"], timeout=120), \
        {m.name: m.tail() for m in group.members}
    assert [m.poll() for m in group.members] == [0, 0, 0], {m.name: m.tail() for m in group.members}
    for m in group.members:
        events = _events(tmp_path / f"{m.name}.jsonl")
        assert [e["event"] for e in events].count("round") == rounds
        assert events[-1]["event"] == "end" and events[-1]["status"] == "ok"
        # The log names the process the supervision stops by PID: the forked child.
        assert events[0]["event"] == "start" and events[0]["pid"] == m.pid
        assert m.pid != fork_server.proc.pid
    assert "done in" in (tmp_path / "worker0.out").read_text()


def test_the_child_has_only_the_environment_it_was_given(fork_server, tmp_path, monkeypatch):
    # WORLD_SIZE is set here, in the harness, but not in what the server is given.
    monkeypatch.setenv("WORLD_SIZE", "2")
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    with open(tmp_path / "server.out", "ab") as log:
        p = fork_server.popen([sys.executable, "-m", "workloads.server", "--arm", "reliable"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    assert p.wait(30) == 1
    assert "--world-size/WORLD_SIZE must be" in (tmp_path / "server.out").read_text()


def test_a_killed_child_reports_its_signal_and_a_running_one_times_out(fork_server, tmp_path):
    env = dict(os.environ, WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with open(tmp_path / "server.out", "ab") as log:
        # A server whose one worker never comes: it waits (join_timeout) until killed.
        p = fork_server.popen([sys.executable, "-m", "workloads.server", "--arm", "reliable",
                               "--host", "127.0.0.1"], stdout=log, env=env)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.5)
    assert p.poll() is None
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL
    assert p.poll() == -signal.SIGKILL


def test_a_module_it_does_not_serve_is_refused_by_name(fork_server, tmp_path):
    with open(tmp_path / "x.out", "ab") as log, pytest.raises(ForkServerError, match="'os'"):
        fork_server.popen([sys.executable, "-m", "os"], stdout=log)
    with open(tmp_path / "x.out", "ab") as log, pytest.raises(ValueError, match="python -m"):
        fork_server.popen([sys.executable, "script.py"], stdout=log)


def test_closing_a_fork_server_ends_it(tmp_path):
    fs = ForkServer("here", subprocess.Popen, tmp_path / "fs.out", dict(os.environ))
    fs.wait_ready(time.monotonic() + 120)
    fs.close()
    assert fs.proc.returncode == 0
    with open(tmp_path / "x.out", "ab") as log, pytest.raises(ForkServerError, match="gone"):
        fs.popen([sys.executable, "-m", "workloads.worker"], stdout=log)


def test_a_fork_server_closed_while_it_imports_is_killed_at_once(tmp_path):
    # An interrupted run's start: the server reads its socket only once ready.
    fs = ForkServer("here", subprocess.Popen, tmp_path / "fs.out", dict(os.environ))
    t0 = time.monotonic()
    fs.close()
    assert time.monotonic() - t0 < 2.0
    assert fs.proc.returncode == -signal.SIGKILL


@pytest.mark.skipif(os.geteuid() != 0, reason="joining another network namespace needs root")
def test_a_child_joins_the_network_namespace_of_the_host_it_is_forked_for():
    """What the fork server's children do first (as ``mnexec -a``): the host's network
    namespace, its own loopback only; the server stays in this machine's."""
    host = subprocess.Popen(["unshare", "--net", "sleep", "30"])
    try:
        want = os.stat(f"/proc/{host.pid}/ns/net").st_ino
        deadline = time.monotonic() + 5
        while want == os.stat("/proc/self/ns/net").st_ino and time.monotonic() < deadline:
            time.sleep(0.05)  # unshare has not made its namespace yet
            want = os.stat(f"/proc/{host.pid}/ns/net").st_ino
        assert want != os.stat("/proc/self/ns/net").st_ino
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                enter_namespaces(host.pid)
                links = [name for _, name in socket.if_nameindex()]
                os.write(w, f"{os.stat('/proc/self/ns/net').st_ino} {','.join(links)}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        ino, links = os.read(r, 4096).decode().split()
        os.close(r)
        assert os.waitpid(pid, 0)[1] == 0
        assert int(ino) == want and links.split(",") == ["lo"]
        assert os.stat("/proc/self/ns/net").st_ino != want
    finally:
        host.kill()
        host.wait()
