"""testbed.run.commandlog: a Python command's log lines, read back by the contract's own adapter.

Whatever the writer writes must pass `testbed.run.command.CommandLog`, the
parser the harness runs on every command arm's log, and become the project's
raw-log events; a line the contract does not allow fails at the call that
wrote it.
"""
import json

import pytest

from testbed.run import command
from testbed.run.command import LINES, CommandLog, log_paths
from testbed.run.commandlog import CONTRACT_VERSION, CommandLogWriter, ContractMisuse
from workloads.runlog import RunLog, check_event

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000_000_000


class Clocks:
    """A wall clock that moves 10 ms and a CPU clock that moves 2 ms each time they are read."""

    def __init__(self):
        self.ns, self.cpu_s = T0, 0.0

    def clock(self):
        self.ns += 10_000_000
        return self.ns

    def cpu(self):
        self.cpu_s += 0.002
        return self.cpu_s


def adapt(own, adapted, rounds):
    log = CommandLog(own, RunLog(str(adapted), "mine", "worker", 0), name=own.name,
                     model="digits_cnn", world_size=2, seed=1, rounds=rounds, silence_s=60)
    announced = log.poll() + log.finish(0)
    return announced, [check_event(json.loads(x)) for x in adapted.read_text().splitlines()]


def test_the_writers_lines_pass_the_contracts_own_parser(tmp_path, monkeypatch):
    assert CONTRACT_VERSION == command.CONTRACT_VERSION
    own, adapted = log_paths(tmp_path, 0)
    monkeypatch.setenv("TESTBED_LOG", str(own))
    c = Clocks()
    with CommandLogWriter(clock=c.clock, cpu=c.cpu) as log:    # $TESTBED_LOG by default
        assert log.path == str(own)
        log.start(params=10, grad_bytes=40)
        log.round_start()                                        # round 0
        with log.exchange():
            pass
        timed = log.round_end(loss=1.5, stats={"bytes_sent": 40, "dropped": 0})
        log.eval(test_accuracy=0.5)                              # after round 0
        log.round_start(1)
        given = log.round_end(1, comm_s=0.001, loss=None, epoch=1, compute_cpu_s=0.25,
                              comm_cpu_s=0.0)
        log.round_start(2)
        with log.exchange():
            pass
        with log.exchange():    # two exchanges in a round add up
            pass
        two = log.round_end(loss=0.5)
        log.eval(2, test_accuracy=0.75, test_loss=0.4, epoch=1)
    lines = [json.loads(x) for x in own.read_text().splitlines()]
    assert [x["event"] for x in lines] == ["start", "round_start", "round_end", "eval",
                                           "round_start", "round_end", "round_start",
                                           "round_end", "eval"]
    # Only what the contract declares, optional fields only when given, stamps in order.
    for x in lines:
        assert set(x) <= {f.name for f in LINES[x["event"]]}
    assert "loss" not in given and "comm_cpu_s" in given and given["compute_cpu_s"] == 0.25
    assert [x["t_ns"] for x in lines] == sorted(x["t_ns"] for x in lines)
    # The exchange's CPU is comm_cpu_s, the rest of the round's compute_cpu_s.
    assert timed["comm_cpu_s"] == pytest.approx(0.002)
    assert timed["compute_cpu_s"] == pytest.approx(0.004)
    assert two["comm_cpu_s"] == pytest.approx(0.004) and two["comm_s"] >= 0
    announced, events = adapt(own, adapted, rounds=3)
    assert announced == [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2),
                         ("end", 2)]
    assert [e["event"] for e in events] == ["start", "round", "eval", "round", "round", "eval",
                                            "end"]
    rounds = [e for e in events if e["event"] == "round"]
    assert [r["comm_s"] for r in rounds] == [timed["comm_s"], 0.001, two["comm_s"]]
    assert rounds[0]["stats"] == {"bytes_sent": 40, "dropped": 0} and rounds[1]["epoch"] == 1
    assert rounds[0]["t_end_ns"] - rounds[0]["t_start_ns"] == 10_000_000
    assert events[0]["params"] == 10 and events[-1]["status"] == "ok"
    assert [e["test_accuracy"] for e in events if e["event"] == "eval"] == [0.5, 0.75]


@pytest.mark.parametrize("calls,says", [
    (lambda w: w.round_end(comm_s=0.1), "round_end, but no round is under way"),
    (lambda w: (w.round_start(), w.round_start()), "while round 0 has not ended"),
    (lambda w: w.round_start(1), "round_start of round 1, expected round 0"),
    (lambda w: (w.round_start(), w.round_end()), "give comm_s, or time the exchange"),
    (lambda w: (w.round_start(), w.round_end(comm_s="fast")), "could not convert"),
    (lambda w: (w.round_start(), w.round_end(comm_s=0.1, stats=[1])),
     "field 'stats' must be dict"),
    (lambda w: w.eval(0, test_accuracy=0.5), "eval after round 0, which has not ended"),
    (lambda w: w.exchange().__enter__(), "an exchange outside a round"),
    (lambda w: w.write("round", round=0), "event 'round' is not one of start, round_start"),
    (lambda w: w.write("round_start", round=0), "field 't_ns' missing"),
    (lambda w: w.start(params=1.5), "field 'params' must be int"),
])
def test_a_line_the_contract_refuses_fails_at_the_call(tmp_path, calls, says):
    path = tmp_path / "w.log"
    with CommandLogWriter(path) as w, pytest.raises((ContractMisuse, ValueError), match=says):
        calls(w)
    # Nothing the contract refuses reached the file.
    assert all(json.loads(x)["event"] == "round_start" for x in path.read_text().splitlines())


def test_without_testbed_log_the_writer_says_so(monkeypatch):
    monkeypatch.delenv("TESTBED_LOG", raising=False)
    with pytest.raises(ContractMisuse, match="TESTBED_LOG is not set"):
        CommandLogWriter()
