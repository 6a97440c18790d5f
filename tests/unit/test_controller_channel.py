"""The controller's OpenFlow channel: no connection but the switch's own programs that switch.

A real os-ken controller (the port-monitor app over the routing app) runs as
a process on loopback; the switches are fake OpenFlow 1.3 clients speaking
the handshake over a socket (no Mininet, no OVS).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controllers.ofchannel import PeerPolicy, _proc_address, socket_owner
from controllers.protocol import ControlClient, StatusRequest
from topologies.star import StarTopo

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OFP_VERSION = 4
HELLO, ECHO_REQUEST, ECHO_REPLY, FEATURES_REQUEST, FEATURES_REPLY = 0, 2, 3, 5, 6
FLOW_MOD, MULTIPART_REQUEST, MULTIPART_REPLY, BARRIER_REQUEST, BARRIER_REPLY = 14, 18, 19, 20, 21
MP_PORT_STATS, MP_PORT_DESC = 4, 13
HONEST, FORGED = 1, 666  # rx_packets of the replies the controller asked for, and of forged ones


def _msg(kind: int, xid: int, body: bytes = b"") -> bytes:
    return struct.pack("!BBHI", OFP_VERSION, kind, 8 + len(body), xid) + body


def _port_stats(xid: int, rx_packets: int) -> bytes:
    entry = struct.pack("!I4x12QII", 1, rx_packets, *([0] * 11), 0, 0)
    return _msg(MULTIPART_REPLY, xid, struct.pack("!HH4x", MP_PORT_STATS, 0) + entry)


class FakeSwitch:
    """An OpenFlow 1.3 switch as far as the controller can tell: handshake, barriers, statistics."""

    def __init__(self, port: int, dpid: int):
        self.dpid = dpid
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.flow_mods = 0
        self.stats_requests = 0
        self.closed = threading.Event()   # the controller ended the connection
        self.features_sent = threading.Event()
        self.wlock = threading.Lock()
        self.send(_msg(HELLO, 1))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def send(self, data: bytes):
        with self.wlock:
            self.sock.sendall(data)

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _serve(self):
        try:
            while True:
                _v, kind, length, xid = struct.unpack("!BBHI", self._recv(8))
                body = self._recv(length - 8)
                if kind == ECHO_REQUEST:
                    self.send(_msg(ECHO_REPLY, xid, body))
                elif kind == FEATURES_REQUEST:
                    self.send(_msg(FEATURES_REPLY, xid, struct.pack("!QIBB2xII", self.dpid, 0, 254, 0, 0, 0)))
                    self.features_sent.set()
                elif kind == FLOW_MOD:
                    self.flow_mods += 1
                elif kind == BARRIER_REQUEST:
                    self.send(_msg(BARRIER_REPLY, xid))
                elif kind == MULTIPART_REQUEST:
                    (mp,) = struct.unpack("!H", body[:2])
                    if mp == MP_PORT_DESC:
                        self.send(_msg(MULTIPART_REPLY, xid, struct.pack("!HH4x", MP_PORT_DESC, 0)))
                    elif mp == MP_PORT_STATS:
                        self.stats_requests += 1
                        self.send(_port_stats(xid, HONEST))
        except (EOFError, OSError):
            pass
        finally:
            self.closed.set()

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def controller(tmp_path):
    pytest.importorskip("os_ken")
    topo = StarTopo(workers=1)
    port = _free_port()
    cfg = {"topology": topo.to_dict(), "run_dir": str(tmp_path), "control_socket": str(tmp_path / "c.sock"),
           "of_port": port, "of_host": "127.0.0.1", "monitor_s": 0.2, "of_peer_uids": [os.getuid()]}
    (tmp_path / "fabric.json").write_text(json.dumps(cfg))
    code = ("import sys; from os_ken import cfg; from os_ken.base.app_manager import AppManager; "
            "cfg.CONF(args=['--ofp-listen-host', '127.0.0.1', '--ofp-tcp-listen-port', sys.argv[1]], "
            "project='os_ken'); AppManager.run_apps(['controllers.monitor_app'])")
    env = dict(os.environ, DBLP_FABRIC_CONFIG=str(tmp_path / "fabric.json"), PYTHONPATH=str(ROOT))
    log = open(tmp_path / "controller.log", "wb")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], cwd=str(ROOT), env=env,
                            stdout=log, stderr=subprocess.STDOUT)

    def listening():
        assert proc.poll() is None, (tmp_path / "controller.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return os.path.exists(cfg["control_socket"])
    try:
        _wait(listening, 30, "the controller to listen")
        yield port, topo.dpid_of("dtr1"), tmp_path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _switch_status(tmp_path, dpid):
    with ControlClient(str(tmp_path / "c.sock"), timeout=5) as client:
        st = client.send(StatusRequest())
    return st.switches.get(str(dpid))


def _stats_lines(tmp_path):
    path = tmp_path / "raw" / "port_stats.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_second_connection_claiming_a_connected_dpid_is_refused_and_the_switch_kept(controller):
    port, dpid, tmp_path = controller
    real = FakeSwitch(port, dpid)
    try:
        _wait(lambda: (s := _switch_status(tmp_path, dpid)) is not None and s.routed, what="routing")
        routed_flows = real.flow_mods
        assert routed_flows > 0
        _wait(lambda: any(r["ports"]["1"]["rx_packets"] == HONEST for r in _stats_lines(tmp_path)),
              what="a solicited port-stats reply written")

        # the rogue: same DPID, a local socket of an allowed uid (the test's), speaks the handshake
        rogue = FakeSwitch(port, dpid)
        _wait(rogue.features_sent.is_set, what="the rogue's features reply")
        for xid in (1, 2, 3, 0x7fff0000):
            try:
                rogue.send(_port_stats(xid, FORGED))
            except OSError:
                break
        assert rogue.closed.wait(10), "the controller kept the rogue's connection"
        assert rogue.flow_mods == 0 and rogue.stats_requests == 0
        rogue.close()

        # the real switch's unsolicited replies (xids never asked on it) are dropped too
        for xid in (0xdead, 0xbeef):
            real.send(_port_stats(xid, FORGED))
        time.sleep(1.0)
        st = _switch_status(tmp_path, dpid)
        assert st.connected and st.routed and st.connects == 1
        assert real.flow_mods == routed_flows and not real.closed.is_set()
        rows = _stats_lines(tmp_path)
        assert rows and all(r["ports"]["1"]["rx_packets"] == HONEST for r in rows)
        assert all(r["dpid"] == dpid for r in rows)
    finally:
        real.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_a_local_user_who_is_not_the_switches_user_is_refused_before_any_flow(controller):
    port, dpid, tmp_path = controller
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            sw = FakeSwitch(port, dpid)
            refused = sw.closed.wait(10)
            os.write(write, json.dumps({"refused": refused, "flows": sw.flow_mods}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        got = json.loads(f.read() or "{}")
    os.waitpid(child, 0)
    assert got == {"refused": True, "flows": 0}
    assert _switch_status(tmp_path, dpid) is None  # never counted as the switch
    assert "not of the switches'" in (tmp_path / "controller.log").read_text()


def test_the_owner_of_a_local_peer_is_read_from_proc():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli = socket.create_connection(srv.getsockname())
        conn, peer = srv.accept()
        with cli, conn:
            assert socket_owner(peer, conn.getsockname()) == ("01", os.getuid())
            assert PeerPolicy(frozenset({os.getuid()})).check(conn) is None
            why = PeerPolicy(frozenset({os.getuid() + 1})).check(conn)
            assert why is not None and f"uid {os.getuid()}" in why
    assert socket_owner(("127.0.0.1", 9), ("127.0.0.1", 9)) is None


def test_a_remote_peer_passes_only_from_the_fabrics_servers():
    assert _proc_address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _proc_address("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)

    class Remote:
        def getpeername(self):
            return ("192.0.2.7", 40000)

        def getsockname(self):
            return ("192.0.2.1", 6653)
    assert PeerPolicy(frozenset({0}), frozenset({"192.0.2.7"})).check(Remote()) is None
    why = PeerPolicy(frozenset({0}), frozenset({"192.0.2.8"})).check(Remote())
    assert why is not None and "not one of the fabric's servers" in why
