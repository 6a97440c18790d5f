"""`dblp-testbed bench transport --quick`: the bench runs end to end and its numbers are sane."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.emu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_transport_quick(tmp_path):
    out = tmp_path / "bench.json"
    cli = os.path.join(os.path.dirname(sys.executable), "dblp-testbed")
    p = subprocess.run([cli, "bench", "transport", "--quick",
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=170)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["floor_s"] == pytest.approx((1 << 20) * 8 / 100e6)
    rows = {(r["policy"], r["bound"], r["loss"]): r for r in doc["rows"]}
    assert set(rows) == {(pol, b, loss) for pol, b in (("reliable", 0.0), ("static", 0.408))
                         for loss in (0.0, 0.5)}
    for r in doc["rows"]:
        assert r["impl"] == "dblp" and r["control"] == "udp"
        assert r["round_trip_s"] is not None, r
        # physics: never faster than the data the bound requires at line rate
        assert r["round_trip_s"] >= 0.95 * r["bound_s"]
        assert r["bound_s"] == pytest.approx(
            doc["floor_s"] * 2 * (1 - r["bound"]) / (1 - r["loss"]))
        assert r["passes"] >= 1 and r["ideal_passes"] >= 1
        # the machine's CPU over the row: the bench's own agents kept it busy
        assert 0 < r["cpu_busy_frac"] <= 1 and 0 <= r["cpu_steal_frac"] < r["cpu_busy_frac"]
        # receive offload wherever the loss hook allows it
        assert r["gro"] is (r["loss"] == 0)
    # loss costs passes; a loose bound costs fewer
    assert rows[("reliable", 0.0, 0.5)]["passes"] > rows[("reliable", 0.0, 0.0)]["passes"]
    assert rows[("static", 0.408, 0.5)]["passes"] < rows[("reliable", 0.0, 0.5)]["passes"]
    assert rows[("static", 0.408, 0.5)]["round_trip_s"] < rows[("reliable", 0.0, 0.5)]["round_trip_s"]
    assert "round_trip_s" in p.stdout and "floor_s" in p.stdout


def test_receive_offload_is_never_on_under_a_loss():
    """GRO on a veth coalesces a run before the nftables loss hook sees it: one drop would
    take the whole run. The pair turns it off for a loss and refuses it under one."""
    from testbed.emulation.netns import NetnsPair

    def gro(pair, side):
        out = pair.exec(side, "ethtool", "-k", pair.dev[side]).stdout
        return "generic-receive-offload: on" in out

    with NetnsPair(100e6) as pair:
        assert not pair.gro and not gro(pair, 0) and not gro(pair, 1)
        for side in (0, 1):  # no GSO packet crosses the veth whole: shaper and loss see MTUs
            out = pair.exec(side, "ethtool", "-k", pair.dev[side]).stdout
            assert "tcp-segmentation-offload: off" in out
            assert "generic-segmentation-offload: off" in out
            assert "tx-udp-segmentation: off" in out
            assert "tx-checksumming: on" in out  # as on a NIC; the veth keeps the rest off
        pair.set_gro(True)
        assert pair.gro and gro(pair, 0) and gro(pair, 1)
        pair.set_loss(0.1)
        assert not pair.gro and not gro(pair, 0) and not gro(pair, 1)
        with pytest.raises(ValueError, match="loss"):
            pair.set_gro(True)
        pair.set_loss(0.0)
        pair.set_gro(True)
        assert gro(pair, 1)


def test_a_failing_agent_is_an_experiment_error_not_a_broken_pipe():
    """An agent that dies (here: a bound its config refuses) is reported with its own
    error as one `ExperimentFailed` line, and writing to it again raises nothing: the
    bench used to exit 1 in silence through click's BrokenPipeError handling."""
    from testbed.bench.agents import Agent
    from testbed.bench.transport import Config, _start
    from testbed.emulation.netns import NetnsPair
    from testbed.errors import ExperimentFailed
    with NetnsPair(100e6) as pair:
        with pytest.raises(ExperimentFailed, match=r"failed to start: .*\bp\b") as exc:
            _start(pair, Config("dblp", "static", 1.5, "udp"), 1000, 100e6, 5.0, 47555)
        assert "\n" not in str(exc.value)
        dead = Agent(pair, 0, {"kind": "dblp"})  # no role: it exits at once
        first = dead.read(30)
        assert first["ok"] is False and "KeyError" in first["error"]
        dead.send({"cmd": "go"})
        assert dead.read(5)["ok"] is False
        dead.stop()


def test_a_bench_that_fails_part_way_keeps_its_rows(tmp_path, monkeypatch):
    """The rows measured before a failure are written with the error: a failed bench
    loses nothing it measured (it used to write no JSON at all)."""
    from click.testing import CliRunner

    from testbed.bench import transport
    from testbed.errors import ExperimentFailed
    good, bad = transport.Config("dblp", "reliable", 0.0, "udp"), \
        transport.Config("dblp", "static", 1.5, "udp")  # a bound the agent refuses
    monkeypatch.setattr(transport, "default_configs", lambda *a, **k: [good, bad])
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(transport.transport_cmd,
                             ["--losses", "0", "--mbytes", "0.25", "--reps", "1", "--json-file", str(out)])
    assert isinstance(res.exception, ExperimentFailed), res.output
    doc = json.loads(out.read_text())
    assert [(r["policy"], r["loss"]) for r in doc["rows"]] == [("reliable", 0.0)]
    assert doc["rows"][0]["round_trip_s"] > 0
    assert "static P=150.0% udp ps" in doc["failed"] and "failed to start" in doc["failed"]


def test_clean_removes_the_namespaces_of_a_bench_killed_before_its_exit(leftovers):
    """A bench SIGKILLed keeps no exit to remove its pair: `dblp-testbed clean` removes it,
    knowing it for a dead process's by the PID in its name, and no other pair."""
    code = ("import sys, time\nfrom testbed.emulation.netns import NetnsPair\n"
            "p = NetnsPair(None)\np.create()\nprint(*p.ns, flush=True)\ntime.sleep(120)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        names = owner.stdout.readline().split()
        live = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert live.returncode == 0 and "removed namespaces: 0" in live.stdout, live.stdout
    finally:
        owner.kill()
        owner.wait()
    assert len(names) == 2 and all(f"{owner.pid:06x}" in n for n in names), names
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n in listed for n in names), listed
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "removed namespaces: 2" in res.stdout, res.stdout
    assert not leftovers()["namespaces"]
