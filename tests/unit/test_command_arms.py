"""Command arms: the spec section, the contract's adapter, the analysis of an adapted arm, and
the example transport, run on this machine's loopback as the harness would run it."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from testbed.config import spec as specmod
from testbed.config.arms import ARMS, COMMAND, Arm, Command
from testbed.run.command import (
    ENV,
    LINES,
    ROOT,
    CommandLog,
    ContractError,
    command_argv,
    command_env,
    log_paths,
)
from testbed.testing import rundirs as ta
from workloads.runlog import RunLog, check_event

pytestmark = pytest.mark.unit

SECTION = '[commands.mine]\nworker = ["python", "examples/udp_average.py", "worker"]\n'


@pytest.fixture(autouse=True)
def _forget_command_arms():
    """A spec's command arms live in the process's registry: each test starts without them."""
    yield
    for name in [n for n, a in ARMS.items() if a.command is not None]:
        del ARMS[name]


def load(tmp_path, text: str, preset=None):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return specmod.load(str(path), preset)


# -- the spec section ---------------------------------------------------------------------

def test_a_command_section_registers_an_arm_the_spec_may_name(tmp_path):
    spec = load(tmp_path, 'arms = ["static", "mine"]\n' + SECTION
                + 'server = ["python", "examples/udp_average.py", "server"]\nsilence_s = 5\n')
    arm = ARMS["mine"]
    assert spec.arms == ["static", "mine"]
    assert arm.transport == COMMAND and arm.command == Command(
        ("python", "examples/udp_average.py", "worker"),
        ("python", "examples/udp_average.py", "server"), 5.0)
    assert not arm.serverless and not arm.uses_dblp and not arm.bounded
    # Written back as the run directory keeps it, and read again the same (the analysis does).
    again = load(tmp_path, spec.to_toml())
    assert again.commands == spec.commands and again.arms == spec.arms
    # Without a server, rank 0 takes the server's host as gloo's does.
    load(tmp_path, 'arms = ["mine"]\n' + SECTION)
    assert ARMS["mine"].serverless and ARMS["mine"].command.server is None


@pytest.mark.parametrize("text, field, says", [
    ('arms = ["mine"]\n[commands.mine]\nserver = ["x"]\n', "commands.mine.worker", "missing"),
    ('arms = ["mine"]\n[commands.mine]\nworker = []\n', "commands.mine.worker", "non-empty"),
    ('arms = ["mine"]\n[commands.mine]\nworker = ["a", 3]\n', "commands.mine.worker", "non-empty"),
    ('arms = ["mine"]\n[commands.mine]\nworker = "python x.py"\n', "commands.mine.worker",
     "expected list"),
    ('arms = ["mine"]\n' + SECTION + 'shell = true\n', "commands.mine.shell", "unknown field"),
    ('arms = ["mine"]\n' + SECTION + 'silence_s = 0\n', "commands.mine.silence_s", "not in"),
    ('arms = ["mine"]\ncommands = 3\n', "commands", "expected a table"),
    ('arms = ["static"]\n[commands.static]\nworker = ["x"]\n', "commands.static", "built-in"),
    ('arms = ["static"]\n[commands."a b"]\nworker = ["x"]\n', "commands.a b", "plain name"),
    ('arms = ["other"]\n' + SECTION, "arms", "unknown arm 'other'"),
])
def test_a_bad_command_section_is_one_line_naming_the_field(tmp_path, text, field, says):
    with pytest.raises(specmod.SpecError) as err:
        load(tmp_path, text)
    assert err.value.field == field
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_command_arm_has_nothing_of_a_dblp_arm():
    with pytest.raises(ValueError, match="no control path"):
        Arm("x", COMMAND, control="udp", command=Command(("a",)))
    with pytest.raises(ValueError, match="a command arm has transport"):
        Arm("x", "static", "udp", "ps", command=Command(("a",)))
    with pytest.raises(ValueError, match="a command arm has transport"):
        Arm("x", COMMAND)


def test_the_environment_and_argv_follow_the_contract():
    training = {"rounds": 12, "eval_every": 6, "model": "digits_cnn", "batch_size": 0, "lr": 0.0}
    base = {"PATH": "/bin", "RANK": "7", "PYTHONPATH": "/elsewhere"}
    kw = dict(world_size=3, master_addr="10.0.0.1", master_port=5555, secret="ab" * 32, seed=4,
              training=training, rate_bps=6.3e6)
    w = command_env(base, role="worker", rank=1, log=pathlib.Path("/r/w.log"), **kw)
    s = command_env(base, role="server", rank=None, log=None, **kw)
    assert set(w) - set(base) | {"RANK", "PYTHONPATH"} == set(ENV)
    assert w["RANK"] == "1" and w["TESTBED_LOG"] == "/r/w.log" and w["TESTBED_RATE_BPS"] == "6300000"
    assert w["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere"
    assert "RANK" not in s and "TESTBED_LOG" not in s and s["TESTBED_ROLE"] == "server"
    assert command_argv(["python", "x.py"]) == [sys.executable, "x.py"]
    assert command_argv(["./mine", "python"]) == ["./mine", "python"]


def test_docs_page_states_the_contract_declared_in_code():
    page = (ROOT / "docs" / "commands.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (.*) \|$", page, re.M))
    assert rows == ENV
    for event, fields in LINES.items():
        [row] = [line for line in page.splitlines() if line.startswith(f"| `{event}`")]
        for f in fields[1:]:
            assert f"`{f.name}`" + (" *" if not f.required else "") in row, (event, f.name)


# -- the adapter --------------------------------------------------------------------------

T = 1_700_000_000_000_000_000


def good_lines(rounds=3):
    out = [{"event": "start", "t_ns": T, "params": 10, "grad_bytes": 40}]
    for r in range(rounds):
        t0 = T + r * 10**9
        out += [{"event": "round_start", "round": r, "t_ns": t0},
                {"event": "round_end", "round": r, "t_ns": t0 + 500_000_000, "comm_s": 0.4,
                 "loss": 1.0 / (r + 1), "stats": {"bytes_sent": 4000}, "compute_cpu_s": 0.05,
                 "comm_cpu_s": 0.25}]
    out.append({"event": "eval", "round": rounds - 1, "test_accuracy": 0.9, "test_loss": 0.3})
    return out


def adapter(tmp_path, rounds=3, silence_s=60.0, clock=None):
    own, adapted = log_paths(tmp_path, 0)
    kw = {"clock": clock} if clock else {}
    return CommandLog(own, RunLog(str(adapted), "mine", "worker", 0), name="raw/mine/seed-1/"
                      + own.name, model="digits_cnn", world_size=3, seed=1, rounds=rounds,
                      silence_s=silence_s, **kw), own, adapted


def write(path, lines, raw=False):
    with open(path, "a") as fh:
        fh.write("".join((x if raw else json.dumps(x)) + "\n" for x in lines))


def test_good_lines_become_the_projects_events_and_rank_0_rounds_to_announce(tmp_path):
    log, own, adapted = adapter(tmp_path)
    lines = good_lines()
    write(own, lines[:3])
    with open(own, "a") as fh:
        fh.write('{"event": "round_start", ')          # half a line: not read yet
    assert log.poll() == [("start", 0), ("end", 0)]
    with open(own, "a") as fh:
        fh.write(f'"round": 1, "t_ns": {T + 10**9}}}\n')
    assert log.poll() == [("start", 1)]
    write(own, lines[4:])
    assert log.finish(0) == [("end", 1), ("start", 2), ("end", 2)]
    events = [check_event(json.loads(x)) for x in adapted.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "round", "round", "round", "eval", "end"]
    r0 = events[1]
    assert (r0["t_start_ns"], r0["t_end_ns"], r0["comm_s"]) == (T, T + 500_000_000, 0.4)
    assert r0["compute_s"] == pytest.approx(0.1) and r0["bound"] is None
    assert r0["stats"] == {"bytes_sent": 4000} and events[0]["grad_bytes"] == 40
    assert (r0["compute_cpu_s"], r0["comm_cpu_s"]) == (0.05, 0.25)
    assert events[-1]["status"] == "ok" and events[-1]["final_accuracy"] == 0.9
    assert events[-1]["train_time_s"] == pytest.approx(1.5)


BAD = [
    ("not json", "not a JSON object"),
    ('{"event": "round_begin", "round": 0}', "event 'round_begin' is not one of"),
    ('{"event": "round_start", "round": 0}', "field 't_ns' missing"),
    ('{"event": "round_start", "round": 0, "t_ns": 1, "x": 1}', "undeclared field(s) x"),
    ('{"event": "round_start", "round": "0", "t_ns": 1}', "field 'round' must be int"),
    ('{"event": "round_start", "round": 0, "t_ns": -5}', "'t_ns' is negative"),
    ('{"event": "round_start", "round": 1, "t_ns": 1}', "round_start of round 1, expected round 0"),
    ('{"event": "round_end", "round": 0, "t_ns": 1, "comm_s": 0}', "no round is under way"),
    ('{"event": "eval", "round": 0, "test_accuracy": 0.5}', "which has not ended"),
    ('{"event": "start"}\n{"event": "start"}', "a second start line"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 0, "t_ns": 2000000010, "comm_s": 3.5}', "comm_s 3.5 is not"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 1, "t_ns": 20, "comm_s": 0}', "round 0 is under way"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_start", "round": 1, "t_ns": 20}', "while round 0 has not ended"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 0, "t_ns": 5, "comm_s": 0}', "before its round_start"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 0, "t_ns": 20, "comm_s": 0, "stats": {"a": "b"}}',
     "stats 'a' are not numbers"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 0, "t_ns": 20, "comm_s": 0, "comm_cpu_s": -1}',
     "comm_cpu_s -1 is not a number of seconds"),
    ('{"event": "round_start", "round": 0, "t_ns": 10}\n'
     '{"event": "round_end", "round": 0, "t_ns": 20, "comm_s": 0}\n'
     '{"event": "eval", "round": 0, "test_accuracy": 87}', "not a fraction"),
]


@pytest.mark.parametrize("text, says", BAD)
def test_a_malformed_line_fails_with_one_line_naming_the_file_and_line(tmp_path, text, says):
    log, own, adapted = adapter(tmp_path)
    write(own, text.splitlines(), raw=True)
    with pytest.raises(ContractError) as err:
        log.poll()
    n = len(text.splitlines())
    msg = str(err.value)
    assert msg.startswith(f"raw/mine/seed-1/worker0.command.log:{n}: "), msg
    assert says in msg and "\n" not in msg
    log.fail(msg)   # what the runner does: the adapted log ends with the reason
    end = json.loads(adapted.read_text().splitlines()[-1])
    assert end["event"] == "end" and end["status"] == "error" and end["error"] == msg


def test_a_silent_worker_fails_naming_its_last_line(tmp_path):
    now = [100.0]
    log, own, _ = adapter(tmp_path, silence_s=30, clock=lambda: now[0])
    now[0] = 120.0
    assert log.poll() == []
    now[0] = 131.0
    with pytest.raises(ContractError, match=r"worker0.command.log: silent for 31 s .*wrote no line"):
        log.poll()
    write(own, good_lines()[:2])
    assert log.poll() == [("start", 0)]
    now[0] = 170.0
    with pytest.raises(ContractError) as err:
        log.poll()
    assert "its last line, 2, was '{\"event\": \"round_start\"" in str(err.value)


def test_an_exit_before_the_last_round_or_inside_one_is_an_error(tmp_path):
    log, own, adapted = adapter(tmp_path)
    write(own, good_lines()[:5])
    with pytest.raises(ContractError, match=r"exited 0 after 2 of 3 rounds"):
        log.finish(0)
    assert json.loads(adapted.read_text().splitlines()[-1])["status"] == "error"
    log, own, adapted = adapter(tmp_path / "b")
    write(own, good_lines()[:6])
    with pytest.raises(ContractError, match=r"worker0.command.log:6: the worker exited 0 with "
                                            r"round 2 not ended"):
        log.finish(0)
    log, own, adapted = adapter(tmp_path / "c")
    write(own, good_lines()[:3])
    assert log.finish(1) == [("start", 0), ("end", 0)]
    assert json.loads(adapted.read_text().splitlines()[-1])["error"] == "exit status 1"


# -- the analysis of an adapted arm ----------------------------------------------------------

def _command_lines(events: list[dict]) -> list[dict]:
    """What a command would have written for a worker's built-in events."""
    out = []
    for e in events:
        if e["event"] == "round":
            out += [{"event": "round_start", "round": e["round"], "t_ns": e["t_start_ns"]},
                    {"event": "round_end", "round": e["round"], "t_ns": e["t_end_ns"],
                     "comm_s": e["comm_s"], "loss": e["loss"], "stats": e["stats"]}]
        elif e["event"] == "eval":
            out.append({"event": "eval", "round": e["round"],
                        "test_accuracy": e["test_accuracy"], "t_ns": e["t_ns"]})
    return out


def test_an_adapted_command_arm_gets_every_table_and_verdict(tmp_path, monkeypatch):
    """The analysis of a command arm whose logs the adapter wrote: its rows, burst rounds,
    speedups and verdicts against the static arm, the figures those of the same rounds."""
    from testbed.analysis.pipeline import build_outputs
    for table, value in ((ta.T0, 10**18 + 900 * 10**9), (ta.NORMAL, 60.0), (ta.BURST, 150.0),
                         (ta.TRAIN, 2.0), (ta.ACC, 0.95)):
        monkeypatch.setitem(table, "mine", value)
    load(tmp_path, 'arms = ["mine"]\n' + SECTION)      # make_run's arms must be registered
    run = ta.make_run(tmp_path / "run", arms=("static", "mine"), seeds=(1, 2))
    with open(run / "spec.toml", "a") as fh:
        fh.write("\n" + SECTION)
    for seed in (1, 2):
        unit = ta.unit_raw(run, "mine", seed)
        for rank in range(ta.WORKERS):
            built_in = unit / f"worker{rank}.jsonl"
            events = [json.loads(x) for x in built_in.read_text().splitlines()]
            built_in.unlink()
            own, adapted = log_paths(unit, rank)
            write(own, _command_lines(events))
            log = CommandLog(own, RunLog(str(adapted), "mine", "worker", rank), name=own.name,
                             model="digits_cnn", world_size=ta.WORKERS, seed=seed,
                             rounds=ta.ROUNDS, silence_s=60)
            log.poll()
            log.finish(0)
    summary = build_outputs(run, figures=False)
    mine = summary["arms"]["mine"]
    assert mine["transport"] == COMMAND and mine["status"] == "ok"
    assert mine["rounds"] == 2 * ta.ROUNDS and mine["burst_rounds"] == 2 * len(ta.BURST_ROUNDS)
    # The static arm's burst rounds over mine's, pooled over the two seeds (1x and 1.5x).
    assert summary["speedups"]["mine_vs_static"]["burst_round"] == pytest.approx(
        ta.BURST["static"] / ta.BURST["mine"], rel=0.05)
    assert mine["final_accuracy"] == pytest.approx(0.95 - 0.005)
    rows = [v for v in summary["verdicts"] if v["arm"] == "mine"]
    assert {v["claim"] for v in rows} == {"burst_speedup", "train_time_cut", "accuracy",
                                          "tail_latency", "mean_latency"}
    assert all(v["baseline"] == "static" for v in rows)
    # Pooled rounds give intervals; a figure with one value per seed that this fixture makes
    # equal in both seeds (the accuracy difference, the tail and mean latency ratios) has none
    # and says it needs more seeds, as a built-in arm's would.
    assert all(v["interval"] for v in rows if v["claim"] in ("burst_speedup", "train_time_cut"))
    assert all(v["interval"] or v["too_few_seeds"] for v in rows)
    assert summary["intervals"]["mine_vs_static"]["comparison"] == "paper"
    assert not [p for p in summary["warnings"] if "mine" in p and "skipped" in p]


# -- the example, on loopback ----------------------------------------------------------------

def test_the_example_trains_over_udp_on_loopback_and_keeps_the_contract(tmp_path):
    """examples/udp_average.py, a server and two workers on 127.0.0.1 with the harness's
    environment, adapted line by line; a full run on the fabric: tests/e2e/test_command_arm.py."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    training = {"rounds": 4, "eval_every": 2, "model": "digits_cnn", "batch_size": 0, "lr": 0.0}
    kw = dict(world_size=2, master_addr="127.0.0.1", master_port=port, secret=os.urandom(32).hex(),
              seed=3, training=training)
    argv = ["python", "examples/udp_average.py"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(command_argv(argv + ["server"]), cwd=ROOT, stderr=subprocess.PIPE,
                              env=command_env(env, role="server", rank=None, log=None,
                                              rate_bps=200e6, **kw))]
    logs = []
    for rank in range(2):
        own, adapted = log_paths(tmp_path, rank)
        logs.append(CommandLog(own, RunLog(str(adapted), "mine", "worker", rank), name=own.name,
                               model="digits_cnn", world_size=2, seed=3, rounds=4, silence_s=120))
        procs.append(subprocess.Popen(
            command_argv(argv + ["worker"]), cwd=ROOT, stderr=subprocess.PIPE,
            env=command_env(env, role="worker", rank=rank, log=own, rate_bps=100e6, **kw)))
    try:
        for p in procs[1:]:
            assert p.wait(timeout=240) == 0, p.stderr.read().decode()[-2000:]
        procs[0].wait(timeout=30)
        assert procs[0].returncode == 0, procs[0].stderr.read().decode()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for log in logs:
        assert log.finish(0)[-1] == ("end", 3)
    for rank in range(2):
        events = [check_event(json.loads(x))
                  for x in log_paths(tmp_path, rank)[1].read_text().splitlines()]
        rounds = [e for e in events if e["event"] == "round"]
        assert [r["round"] for r in rounds] == [0, 1, 2, 3]
        # Loopback loses nothing: every chunk of every average came back.
        assert all(r["stats"]["dropped"] == 0 and r["stats"]["bytes_sent"] > 0 for r in rounds)
        assert all(r["compute_cpu_s"] > 0 and r["comm_cpu_s"] >= 0 for r in rounds)
        assert events[0]["grad_bytes"] > 0 and events[-1]["status"] == "ok"
    evals = [json.loads(x) for x in log_paths(tmp_path, 0)[1].read_text().splitlines()
             if '"eval"' in x]
    assert [e["round"] for e in evals] == [1, 3] and 0 < evals[-1]["test_accuracy"] <= 1


# -- the runner, on loopback --------------------------------------------------------------

class LoopbackHosts:
    """What `ArmRun` asks of a fabric, every host on this machine (no controller listens)."""

    controller = None

    def __init__(self, tmp):
        self.control_socket = str(tmp / "nobody.sock")

    def ip(self, host):
        return "127.0.0.1"

    def intf(self, host):
        return "lo"

    def popen(self, host, argv, **kw):
        return subprocess.Popen(argv, **kw)


def _script(*lines: str) -> list[str]:
    """A worker command: Python that writes ``lines`` (format fields: r, t) per round."""
    body = ["import json, os, sys, time", "log = open(os.environ['TESTBED_LOG'], 'a')",
            "for r in range(int(os.environ['TESTBED_ROUNDS'])):", "    t = time.time_ns()"]
    body += [f"    {x}" for x in lines]
    return ["python", "-c", "\n".join(body)]


LINE = "print(json.dumps({}), file=log, flush=True)"
GOOD = [LINE.format("{'event': 'round_start', 'round': r, 't_ns': t}"), "time.sleep(0.02)",
        LINE.format("{'event': 'round_end', 'round': r, 't_ns': time.time_ns(), 'comm_s': 0.01}")]


def arm_run(tmp_path, worker: list[str]):
    from testbed.run.runner import ArmRun
    spec = load(tmp_path, 'arms = ["mine"]\n[training]\nrounds = 2\n[commands.mine]\n'
                f'worker = {json.dumps(worker)}\nsilence_s = 1.5\n')
    return ArmRun(spec, "mine", LoopbackHosts(tmp_path), tmp_path / "run", "srv",
                  ["w1", "w2", "w3"], seed=1)


def supervise(run) -> None:
    from testbed.run.budget import UnitCpu
    try:
        run.launcher.start()
        run._supervise(UnitCpu(None))
    finally:
        run.unit.procs.stop()
        run.launcher.close()


def test_the_runner_adapts_every_worker_of_a_command_arm(tmp_path):
    from testbed.run.commandlauncher import CommandLauncher
    run = arm_run(tmp_path, _script(*GOOD))
    assert type(run.launcher) is CommandLauncher and run.launcher.poll_s == 0.01
    supervise(run)
    for rank in range(3):
        events = [check_event(json.loads(x))
                  for x in (run.unit.raw / f"worker{rank}.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events] == ["start", "round", "round", "end"]
        assert events[-1]["status"] == "ok" and events[0]["world_size"] == 3


def test_the_runner_fails_a_malformed_line_naming_it(tmp_path):
    from testbed.run.launch import ArmFailed
    run = arm_run(tmp_path, _script(LINE.format("{'event': 'round_start', 'round': r}"),
                                    "time.sleep(30)"))
    with pytest.raises(ArmFailed) as err:
        supervise(run)
    assert str(err.value).strip().startswith("raw/mine/seed-1/worker")
    assert ".command.log:1: round_start line: field 't_ns' missing" in str(err.value)
    assert json.loads((run.unit.raw / "worker0.jsonl").read_text().splitlines()[-1])["status"] == "error"


def test_the_runner_fails_a_silent_worker_naming_its_last_line_not_hanging(tmp_path):
    import time

    from testbed.run.launch import ArmFailed
    run = arm_run(tmp_path, _script(GOOD[0], "time.sleep(30)"))
    t0 = time.monotonic()
    with pytest.raises(ArmFailed, match=r"silent for \d+ s .*its last line, 1, was "
                                        r"'\{\"event\": \"round_start\", \"round\": 0"):
        supervise(run)
    assert time.monotonic() - t0 < 20
