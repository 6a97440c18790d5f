"""The control-socket protocol: one declaration, one client, a server that refuses and survives."""
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from controllers.bursts import BurstSchedule, BurstSpec
from controllers.control_server import ControlServer
from controllers.protocol import (
    PROTOCOL_VERSION,
    REQUESTS,
    BurstReply,
    BurstRequest,
    ControlClient,
    ErrorReply,
    ProtocolError,
    RoundReply,
    RoundRequest,
    ScheduleReply,
    ScheduleRequest,
    StatusReply,
    StatusRequest,
    SwitchStatus,
    encode,
    parse_reply_line,
    parse_request,
    parse_request_line,
)
from workloads import runlog

pytestmark = pytest.mark.unit

REQUEST_EXAMPLES = [
    StatusRequest(),
    RoundRequest("start", "dblp", 7, t_ns=123),
    RoundRequest("end", "dblp-sharded", 0),
    BurstRequest("loss", "server-downlink", 200.0, {"p": 0.5}),
    BurstRequest("police", "core-uplinks", 50, {"rate_mbps": 2.0}, id="t-police", arm="bench"),
    BurstRequest("congest", "dte00:dta00", 10.0),
    ScheduleRequest(),
    ScheduleRequest.of(BurstSchedule([BurstSpec(at_round=3, rounds=1, id="rt"),
                                      BurstSpec("police", at_s=1.0, duration_ms=5, id="b1")])),
]
REPLY_EXAMPLES = [
    (StatusRequest, StatusReply("fattree-k4", {"1": SwitchStatus("dte00", True, True, 12, 1)}, 1, 20,
                                False, 4, 99, ["b000"], 2, 6, 5.0)),
    (StatusRequest, StatusReply("star", {}, 0, 1, False, 0, 1)),
    (RoundRequest, RoundReply(["b000", "b001"])),
    (BurstRequest, BurstReply("m001", 10, 9, 200)),
    (ScheduleRequest, ScheduleReply(3)),
    (BurstRequest, ErrorReply("TargetError: unknown target 'mars'", id="m002")),
    (StatusRequest, ErrorReply("request is not JSON")),
]


@pytest.mark.parametrize("msg", REQUEST_EXAMPLES, ids=lambda m: m.op)
def test_every_request_round_trips(msg):
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["v"] == PROTOCOL_VERSION
    assert parse_request_line(line) == msg


def test_the_examples_cover_every_declared_request():
    assert {m.op for m in REQUEST_EXAMPLES} == set(REQUESTS)
    assert {r.reply for r in REQUESTS.values()} <= {type(r) for _, r in REPLY_EXAMPLES}


@pytest.mark.parametrize("request_cls,reply", REPLY_EXAMPLES, ids=lambda x: getattr(x, "__name__", ""))
def test_every_reply_round_trips(request_cls, reply):
    back = parse_reply_line(request_cls, encode(reply))
    assert back == reply and back.ok == (not isinstance(reply, ErrorReply))


BAD_LINES = [
    (b'{"v": 1, "op": "status"}', "protocol version 1"),
    (b'{"op": "status"}', "protocol version None"),
    (b'{"v": "1", "op": "status"}', "protocol version '1'"),
    (b"not json", "not JSON"),
    (b"[" * 50_000, "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"v": 2}', "unknown op None"),
    (b'{"v": 2, "op": "reboot"}', "unknown op 'reboot'"),
    (b'{"v": 2, "op": "status", "verbose": true}', "unknown field 'verbose'"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a"}', "missing field 'round'"),
    (b'{"v": 2, "op": "round", "event": "middle", "arm": "a", "round": 1}', "event"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a", "round": 1e999}', "round.round"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a", "round": true}', "round.round"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a", "round": -1}', "round must be >= 0"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "../../etc", "round": 1}', "not a plain name"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a", "round": 1, "seed": -1}',
     "seed must be >= 0"),
    (b'{"v": 2, "op": "round", "event": "start", "arm": "a", "round": 1, "seed": "2"}', "round.seed"),
    (b'{"v": 2, "op": "burst", "kind": "loss", "target": "x", "duration_ms": 5, "params": {"q": 1}}',
     "burst.params.q"),
    (b'{"v": 2, "op": "burst", "kind": "police", "target": "x", "duration_ms": 5, "params": {"p": 1}}',
     "burst.params.p"),
    (b'{"v": 2, "op": "burst", "kind": "loss", "target": "x", "duration_ms": -5}', "burst.duration_ms"),
    (b'{"v": 2, "op": "burst", "kind": "flood", "target": "x", "duration_ms": 5}', "burst.kind"),
    (b'{"v": 2, "op": "schedule", "bursts": [{"kind": "loss", "rounds": 1}]}', "schedule.bursts[0].rounds"),
    (b'{"v": 2, "op": "schedule", "bursts": {"a": 1}}', "schedule.bursts"),
]


@pytest.mark.parametrize("line,why", BAD_LINES, ids=[w for _, w in BAD_LINES])
def test_malformed_requests_are_refused_with_one_line(line, why):
    with pytest.raises(ProtocolError) as err:
        parse_request_line(line)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_reply_of_another_version_or_shape_is_refused():
    with pytest.raises(ProtocolError, match="protocol version 1"):
        parse_reply_line(StatusRequest, b'{"v": 1, "ok": true}\n')
    with pytest.raises(ProtocolError, match="missing field 'topology'"):
        parse_reply_line(StatusRequest, b'{"v": 2, "ok": true}\n')
    with pytest.raises(ProtocolError, match="no ok field"):
        parse_reply_line(StatusRequest, b'{"v": 2}\n')


def test_client_request_dict_form_goes_through_the_declaration():
    # what tests and the burst bench write; the version is the client's to add
    assert parse_request({"v": PROTOCOL_VERSION, "op": "status"}) == StatusRequest()
    with pytest.raises(ProtocolError):
        ControlClient("/nonexistent").request({"op": "burst", "kind": "loss"})  # refused before sending


class _Stub:
    """Handlers standing in for the controller's apps."""

    def __init__(self):
        self.rounds = []

    def status(self, req):
        return StatusReply("stub", {}, 0, 0, True, 0, os.getpid())

    def round(self, req):
        self.rounds.append(req)
        if req.round == 13:
            raise RuntimeError("boom")           # an unexpected failure inside a handler
        if req.round == 14:
            raise KeyError("no such arm")        # an expected one
        return RoundReply([])


@pytest.fixture
def server(tmp_path):
    stub = _Stub()
    path = str(tmp_path / "control.sock")
    srv = ControlServer(path, {StatusRequest: stub.status, RoundRequest: stub.round}, threading.RLock())
    srv.bind()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, stub
    srv.close()


def test_server_answers_on_a_real_socket_and_survives_garbage(server):
    srv, stub = server
    assert stat.S_IMODE(os.stat(srv.path).st_mode) == 0o600
    with ControlClient(srv.path, timeout=5) as client:
        assert client.send(StatusRequest()).ready is True
        assert client.send(RoundRequest("start", "dblp", 1)) == RoundReply([])
        refused = client.send(RoundRequest("start", "dblp", 13))
        assert isinstance(refused, ErrorReply) and "internal error: RuntimeError: boom" in refused.error
        assert "KeyError" in client.send(RoundRequest("start", "dblp", 14)).error
        refused = client.send(ScheduleRequest())        # declared, but not served here
        assert not refused.ok and "not served" in refused.error
        assert client.request({"op": "status"})["ok"] is True
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(5)
    raw.connect(srv.path)
    replies = raw.makefile("rb")
    for line, why in BAD_LINES:
        raw.sendall(line + b"\n")
        reply = parse_reply_line(StatusRequest, replies.readline())
        assert isinstance(reply, ErrorReply) and why in reply.error
    raw.sendall(encode(StatusRequest()))                 # the same connection still works
    assert parse_reply_line(StatusRequest, replies.readline()).ok
    raw.close()
    with ControlClient(srv.path, timeout=5) as client:  # and so does the server
        assert client.send(StatusRequest()).ok
    assert [r.round for r in stub.rounds] == [1, 13, 14]


def test_server_cuts_an_endless_line(server):
    srv, _ = server
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(5)
    raw.connect(srv.path)
    try:
        raw.sendall(b"x" * (2 << 20))
    except OSError:
        pass                                             # the server may hang up first
    reply = raw.makefile("rb").readline()
    assert "longer than" in parse_reply_line(StatusRequest, reply).error
    raw.close()


def test_controller_process_starts_alone_and_answers_status(tmp_path):
    """The composed os-ken app, without switches: it imports, starts, serves its socket, stops."""
    pytest.importorskip("os_ken")
    from topologies import FatTreeTopo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        of_port = s.getsockname()[1]
    sched = BurstSchedule([BurstSpec(at_round=3, rounds=1, max_ms=3000.0, id="b000")])
    cfg = {"topology": FatTreeTopo(4).to_dict(), "run_dir": str(tmp_path),
           "control_socket": str(tmp_path / "control.sock"), "of_port": of_port, "bw_mbps": 20,
           "queue_pkts": 100, "host_pids": {}, "bursts": sched.to_dict(), "roles": {}, "monitor_s": 0,
           "python": sys.executable}
    (tmp_path / "fabric.json").write_text(json.dumps(cfg))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    argv = [sys.executable, "-m", "controllers.run", "--config", str(tmp_path / "fabric.json")]
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, status = time.monotonic() + 30, None
        while time.monotonic() < deadline and status is None:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with ControlClient(cfg["control_socket"], timeout=5) as client:
                    status = client.send(StatusRequest())
            except OSError:
                time.sleep(0.1)
        assert isinstance(status, StatusReply), status
        assert status.expected == 20 and status.routed == 0 and not status.ready
        assert status.scheduled == 1 and status.active_bursts == [] and status.pid == proc.pid
        with ControlClient(cfg["control_socket"], timeout=5) as client:
            assert client.send(RoundRequest("start", "dblp", 0)) == RoundReply([])
            refused = client.send(BurstRequest("loss", "mars", 50.0))
            assert not refused.ok and "unknown target 'mars'" in refused.error
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not os.path.exists(cfg["control_socket"])      # SIGTERM closes the apps
    record = json.loads((tmp_path / "raw" / "manual" / "bursts.jsonl").read_text().splitlines()[-1])
    assert runlog.check_event(record) and record["target"] == "mars" and "unknown target" in record["error"]
