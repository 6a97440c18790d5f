"""Clean-up is scoped: recorded PIDs only, live runs left alone, names per fabric.

No root tool runs here: ``ovs-vsctl``, ``ip`` and ``nft`` are replaced by a
fake machine, the state directory is the test's own, and every process that
could be signalled is one this test started (the real machine may be running
a fabric of its own while the unit tests run).
"""
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from testbed.emulation import cleanup


class FakeMachine:
    """What `cleanup._run` would see and do: bridges, links and nft tables, in memory."""

    def __init__(self, bridges=(), links=(), tables=()):
        self.bridges, self.links, self.tables = list(bridges), list(links), list(tables)
        self.namespaces: list[str] = []  # `ip netns list`; their files: cleanup.NETNS_DIR
        self.calls = []

    def __call__(self, argv, timeout=20):
        self.calls.append(list(argv))
        out = ""
        if argv[:3] == ["ovs-vsctl", "--timeout=10", "list-br"]:
            out = "\n".join(self.bridges)
        elif argv[:4] == ["ovs-vsctl", "--timeout=10", "--if-exists", "del-br"]:
            self.bridges = [b for b in self.bridges if b != argv[4]]
        elif argv[:4] == ["ip", "-o", "link", "show"]:
            out = "\n".join(f"{i}: {n}@peer: <UP> mtu 1500" for i, n in enumerate(self.links))
        elif argv[:3] == ["ip", "link", "del"]:  # a veth goes with its peer
            peers = {argv[3]} | ({argv[3][:-1] + "0", argv[3][:-1] + "1"}
                                 if argv[3].startswith("dtz") else set())
            self.links = [n for n in self.links if n not in peers]
        elif argv[:3] == ["nft", "list", "tables"]:
            out = "\n".join(f"table netdev {t}" for t in self.tables)
        elif argv[:3] == ["nft", "delete", "table"]:
            self.tables = [t for t in self.tables if t != argv[4]]
        elif argv[:3] == ["ip", "netns", "list"]:
            out = "\n".join(f"{n} (id: {i})" for i, n in enumerate(self.namespaces))
        elif argv[:3] == ["ip", "netns", "del"]:
            self.namespaces = [n for n in self.namespaces if n != argv[3]]
        return subprocess.CompletedProcess(argv, 0, out, "")


@pytest.fixture
def machine(tmp_path, monkeypatch):
    monkeypatch.setattr(cleanup, "STATE_DIR", str(tmp_path / "state"))
    fake = FakeMachine()
    monkeypatch.setattr(cleanup, "_run", fake)
    return fake


@pytest.fixture
def spawn():
    """Start throw-away processes of this test; all are gone afterwards."""
    procs = []

    def start(*argv):
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
        procs.append(p)
        deadline = time.monotonic() + 5
        while not cleanup.cmdline(p.pid).endswith(argv[-1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _sleeper(spawn, tag="x"):
    return spawn(sys.executable, "-c", "import time; time.sleep(60)", tag)


def _state(fabric_id, owner_pid, processes, **extra):
    state = {"id": fabric_id, "pid": owner_pid, "owner": cleanup.record(owner_pid, ""),
             "bridges": [], "hosts": [], "processes": processes, "files": []}
    state.update(extra)
    cleanup.write_state(fabric_id, state)
    return state


def _dead_owner(spawn):
    p = _sleeper(spawn, "owner")
    rec = cleanup.record(p.pid, "")
    p.kill()
    p.wait()
    return rec


@pytest.mark.unit
def test_clean_leaves_a_live_run_alone_and_finishes_a_dead_one(machine, spawn):
    live_owner = _sleeper(spawn, "live-owner")
    live_child = _sleeper(spawn, "live-child")
    dead_child = _sleeper(spawn, "dead-child")
    _state("fabric-live-aaaaaa", live_owner.pid, [cleanup.record(live_child.pid, "live-child")])
    dead = _state("fabric-dead-bbbbbb", 0, [cleanup.record(dead_child.pid, "dead-child")])
    dead["owner"] = _dead_owner(spawn)
    cleanup.write_state(dead["id"], dead)
    machine.bridges = ["dte00"]  # whose? a live fabric may own it
    rep = cleanup.clean()
    assert dead_child.wait(timeout=10) is not None
    assert live_child.poll() is None and live_owner.poll() is None
    assert len(rep["live"]) == 1 and "fabric-live-aaaaaa" in rep["live"][0]
    assert machine.bridges == ["dte00"]
    assert sorted(os.listdir(cleanup.STATE_DIR)) == ["fabric-live-aaaaaa.json"]


def _bench_pair(netns_dir, pid: int, made: float | None = None) -> list[str]:
    """A bench's two namespaces as `NetnsPair` names them for owner ``pid``, their files made
    at ``made`` (now if None)."""
    from testbed.emulation.netns import owner_tag
    tag = owner_tag(pid)
    names = [f"dbt-{tag}-a", f"dbt-{tag}-b"]
    for n in names:
        (netns_dir / n).touch()
        if made is not None:
            os.utime(netns_dir / n, (made, made))
    return names


@pytest.mark.unit
def test_clean_removes_the_namespaces_of_a_dead_bench_only(machine, spawn, tmp_path, monkeypatch):
    """A bench SIGKILLed before its exit leaves its pair; the owner's PID is in the name.

    A live owner's pair stays. A pair whose PID now belongs to a process
    started after the pair was made goes: that PID was recycled, its owner is
    dead (a test cannot recycle a PID, so the pair's files are dated an hour
    before the process).
    """
    netns = tmp_path / "netns"
    netns.mkdir()
    monkeypatch.setattr(cleanup, "NETNS_DIR", str(netns))
    dead = _dead_owner(spawn)["pid"]
    live = _sleeper(spawn, "bench").pid
    recycled = _sleeper(spawn, "not-the-owner").pid
    dead_pair = _bench_pair(netns, dead)
    live_pair = _bench_pair(netns, live)
    recycled_pair = _bench_pair(netns, recycled, made=time.time() - 3600)
    machine.namespaces = dead_pair + live_pair + recycled_pair + ["dbt-elsewhere-a", "other"]
    assert sorted(cleanup.leftovers()["namespaces"]) == sorted(dead_pair + recycled_pair)
    rep = cleanup.clean()
    assert sorted(rep["namespaces"]) == sorted(dead_pair + recycled_pair)
    assert machine.namespaces == live_pair + ["dbt-elsewhere-a", "other"]
    # The owner's PID fits any Linux PID (2**22 at most), and the veths' names the kernel's 15.
    from testbed.emulation.netns import NetnsPair, owner_tag
    pair = NetnsPair(None, tag=owner_tag(2 ** 22))
    assert cleanup.NETNS_RE.match(pair.ns[0]) and all(len(d) <= 15 for d in pair.dev)


@pytest.mark.unit
def test_clean_force_tears_a_live_run_down(machine, spawn):
    owner = _sleeper(spawn, "live-owner")
    child = _sleeper(spawn, "live-child")
    _state("fabric-live-cccccc", owner.pid, [cleanup.record(child.pid, "live-child")])
    machine.bridges = ["dte00"]
    rep = cleanup.clean(force=True)
    assert child.wait(timeout=10) is not None
    assert owner.poll() is None  # the harness itself is never a recorded process
    assert rep["live"] == [] and machine.bridges == []


@pytest.mark.unit
def test_clean_never_stops_an_unrecorded_host_shell(machine, spawn, monkeypatch):
    """A Mininet-looking shell nobody recorded (another user's Mininet) stays."""
    stopped = []
    monkeypatch.setattr(cleanup, "kill_many", lambda recs, grace=2.0: stopped.extend(
        r["pid"] for r in recs) or [r["pid"] for r in recs])
    shell = spawn("bash", "-c", "sleep 60; true", "mininet:h000")
    assert cleanup.cmdline(shell.pid).endswith("mininet:h000")
    cleanup.clean()
    _state("fabric-dead-dddddd", 0, [], hosts=["h000"])
    cleanup.clean()
    assert shell.pid not in stopped and shell.poll() is None


@pytest.mark.unit
def test_a_recycled_pid_is_never_signalled(machine, spawn):
    p = _sleeper(spawn, "same-command")
    rec = cleanup.record(p.pid, "same-command")
    rec["start"] -= 1  # what a different process with the same PID looks like
    assert cleanup.kill_many([rec], grace=0.1) == []
    assert p.poll() is None


@pytest.mark.unit
def test_each_fabric_names_its_loss_sink_and_nft_tables(tmp_path):
    from testbed.emulation.fabric import Fabric
    from topologies import make_topology

    topo = make_topology("star")
    a, b = Fabric(topo, run_dir=str(tmp_path / "a")), Fabric(topo, run_dir=str(tmp_path / "b"))
    assert a.loss_sink != b.loss_sink and a.nft_prefix != b.nft_prefix
    for fab in (a, b):
        assert fab.nft_prefix.startswith(cleanup.NFT_PREFIX) and fab.tag in fab.nft_prefix
        assert fab.tag in fab.loss_sink and len(fab.loss_sink.encode()) <= 15
        assert cleanup.SINK_RE.match(fab.loss_sink)
        assert not cleanup.INTF_RE.match(fab.loss_sink)  # not mistaken for a switch port


@pytest.mark.unit
def test_a_fabric_removes_only_its_own_tables_and_sink(machine):
    mine, other = cleanup.nft_prefix("aaaaaa"), cleanup.nft_prefix("bbbbbb")
    machine.tables = [mine + "dblp_1", other + "dblp_1", "dtburst_dblp_2", "foreign"]
    machine.links = [*cleanup.sink_pair("aaaaaa"), *cleanup.sink_pair("bbbbbb"), "dte00-eth1"]
    state = {"id": "fabric-1-aaaaaa", "bridges": [], "processes": [], "files": [],
             "nft_prefix": mine, "links": [cleanup.sink_pair("aaaaaa")[0]]}
    cleanup.clean(only_state=state)
    assert machine.tables == [other + "dblp_1", "foreign"]
    assert machine.links == [*cleanup.sink_pair("bbbbbb"), "dte00-eth1"]


@pytest.mark.unit
def test_a_second_fabric_is_refused_naming_the_live_run(machine, tmp_path):
    """The lock is held by another process (the live run); the refusal names it."""
    state_dir = cleanup.STATE_DIR
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.path[:0] = {sys.path!r}
from testbed.emulation import cleanup
cleanup.STATE_DIR = {state_dir!r}
cleanup.claim_machine({{"id": "fabric-9-eeeeee", "owner": cleanup.owner_record(),
                        "run_dir": "/results/first-run"}})
print("held", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        from testbed.errors import MachineError
        with pytest.raises(MachineError) as info:
            cleanup.claim_machine({"id": "fabric-1-ffffff", "owner": cleanup.owner_record()})
        msg = str(info.value)
        assert "fabric-9-eeeeee" in msg and "/results/first-run" in msg and "\n" not in msg
        assert cleanup.live_fabric()["id"] == "fabric-9-eeeeee"
    finally:
        holder.kill()
        holder.wait()
    fd = cleanup.claim_machine({"id": "fabric-1-ffffff", "owner": cleanup.owner_record()})
    cleanup.release_machine(fd)


@pytest.mark.unit
def test_run_refuses_while_another_run_is_live_and_creates_nothing(machine, spawn, tmp_path,
                                                                   monkeypatch):
    from testbed.cli import main
    from testbed.emulation import capabilities

    def trap():
        raise AssertionError("the live run must be noticed before anything else")

    monkeypatch.setattr(capabilities, "check", trap)

    owner = _sleeper(spawn, "first-run")
    _state("fabric-7-abcdef", owner.pid, [], run_dir="/results/first")
    out = tmp_path / "second"
    res = CliRunner().invoke(main, ["run", "--preset", "smoke", "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "fabric-7-abcdef" in lines[0] and "/results/first" in lines[0]
    assert not out.exists()


@pytest.mark.unit
def test_clean_command_reports_the_live_run_it_left_alone(machine, spawn):
    from testbed.cli import main

    owner = _sleeper(spawn, "first-run")
    _state("fabric-7-abcdef", owner.pid, [])
    res = CliRunner().invoke(main, ["clean"])
    assert res.exit_code == 0, res.output
    assert "left alone: live fabric fabric-7-abcdef" in res.output
    assert owner.poll() is None
    os.kill(owner.pid, signal.SIGTERM)
