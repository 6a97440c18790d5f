"""The round announcer against a real UNIX-socket listener, and its no-op modes."""
import json
import time

import pytest

from controllers.protocol import ErrorReply, RoundReply
from testbed.testing.workers import ControlListener
from workloads.control import ENV_VAR, RoundAnnouncer


@pytest.mark.unit
def test_announces_round_start_and_end_over_a_real_unix_socket(tmp_path):
    path = str(tmp_path / "ctl.sock")
    lis = ControlListener(path, lambda r: RoundReply(["b001"] if r.event == "start" else []))
    try:
        ann = RoundAnnouncer("dblp", path=path)
        t0 = time.time_ns()
        assert ann.round("start", 7) == RoundReply(active_bursts=["b001"])
        assert ann.round("end", 7).active_bursts == []
        ann.close()
    finally:
        lis.close()
    first = lis.got[0]
    assert first.op == "round" and first.event == "start" and first.arm == "dblp"
    assert first.round == 7 and t0 <= first.t_ns <= time.time_ns()
    assert [g.event for g in lis.got] == ["start", "end"]


@pytest.mark.unit
def test_noop_without_env_or_listener(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    ann = RoundAnnouncer("gloo")
    assert not ann.enabled and ann.round("start", 0) is None
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nobody.sock"))
    ann = RoundAnnouncer("gloo")
    t = time.perf_counter()
    for r in range(1000):
        assert ann.round("start", r) is None
    assert time.perf_counter() - t < 0.5       # retries are rate-limited: costs nothing
    with pytest.raises(ValueError, match="event"):
        ann.round("middle", 1)


@pytest.mark.unit
def test_late_controller_is_picked_up_and_a_hung_one_is_dropped(tmp_path):
    path = str(tmp_path / "late.sock")
    ann = RoundAnnouncer("static", path=path, timeout_s=0.3, retry_s=0.05)
    assert ann.round("start", 0) is None          # nothing listens yet
    lis = ControlListener(path, lambda r: None if r.round == 2 else RoundReply([]))
    try:
        time.sleep(0.06)
        assert ann.round("start", 1) == RoundReply(active_bursts=[])
        t = time.perf_counter()
        assert ann.round("start", 2) is None          # no reply within the timeout
        assert time.perf_counter() - t < 1.0
    finally:
        lis.close()
        ann.close()


@pytest.mark.unit
def test_a_refusal_is_returned_and_a_reply_of_another_version_drops_the_controller(tmp_path, capsys):
    path = str(tmp_path / "ctl.sock")
    answers = iter([ErrorReply("no such arm"), json.dumps({"v": 99, "ok": True}).encode() + b"\n"])
    lis = ControlListener(path, lambda r: next(answers))
    try:
        ann = RoundAnnouncer("dblp", path=path, retry_s=60)
        reply = ann.round("start", 0)
        assert not reply.ok and reply.error == "no such arm"
        assert ann.round("start", 1) is None             # refused: version 99 is not declared
        assert "protocol version 99" in capsys.readouterr().err
        assert ann.round("start", 2) is None             # dropped; no retry within retry_s
    finally:
        lis.close()
        ann.close()
