"""A new burst kind, topology and loss policy: each one file plus its registration.

The three kinds live in ``ext_sham_burst.py``, ``ext_ring_topology.py`` and
``ext_ramp_policy.py`` beside this file, written as a researcher would
write them outside the project. Registered here (and removed after each
test), each goes through the experiment spec's validation; the burst kind
also through the controller's burst lifecycle, the topology through
routing, and the policy through the worker's and the server's argument
parsers, as the runner launches them.
"""
import json
import logging
import threading

import pytest
from ext_ramp_policy import RampBound
from ext_ring_topology import RingTopo
from ext_sham_burst import ShamKind

from controllers.bursts import KINDS, BurstSchedule, register_kind
from testbed.config.presets import PRESETS
from testbed.config.spec import SpecError, build_topology, load, transport_config
from topologies import TOPOLOGIES, StarTopo, compute_rules, register_topology, trace_path

pytestmark = pytest.mark.unit


@pytest.fixture
def sham():
    register_kind(ShamKind)
    yield ShamKind
    KINDS.pop("sham")


@pytest.fixture
def ring():
    register_topology(RingTopo, "ring")
    yield RingTopo
    TOPOLOGIES.pop("ring")


@pytest.fixture
def ramp(monkeypatch):
    import dblp
    from testbed.config import arms

    monkeypatch.setitem(dblp.POLICIES, "ramp", RampBound)
    added = arms.register_policy("ramp")
    yield [a.name for a in added]
    for a in added:
        arms.ARMS.pop(a.name)


def _spec(tmp_path, text: str, overrides=()):
    f = tmp_path / "spec.toml"
    f.write_text(text)
    return load(str(f), PRESETS["smoke"], list(overrides))


SHAM = '[[bursts]]\nkind = "sham"\nat_round = 1\nrounds = 1\n'


def test_a_new_burst_kind_is_checked_by_the_spec_with_its_own_knobs(sham, tmp_path):
    spec = _spec(tmp_path, SHAM + "params = {label = 7}\n",
                 ["burst_every.kind=sham", "burst_every.every=3"])
    assert spec.bursts[0]["kind"] == "sham" and spec.bursts[0]["params"] == {"label": 7}
    assert spec["burst_every"]["kind"] == "sham"
    for bad, field in (("params = {label = 1001}", "bursts[0].params.label"),
                       ("params = {p = 0.5}", "bursts[0].params.p")):
        with pytest.raises(SpecError) as err:
            _spec(tmp_path, SHAM + bad + "\n")
        assert err.value.field == field



def test_the_manual_trigger_takes_a_new_kind_and_its_knobs(sham, tmp_path):
    """`dblp-testbed burst --kind sham --param label=N`: checked by the kind before any socket."""
    from click.testing import CliRunner

    from testbed.cli import main

    sock = str(tmp_path / "none.sock")
    res = CliRunner().invoke(main, ["burst", "--socket", sock, "--kind", "sham", "--param", "label=1001"])
    assert res.exit_code == 2 and "params.label: 1001 is out of range [0, 1000]" in res.output
    res = CliRunner().invoke(main, ["burst", "--socket", sock, "--kind", "sham", "--param", "label=7"])
    assert res.exit_code == 2 and f"cannot reach the controller at {sock}" in res.output
    res = CliRunner().invoke(main, ["burst", "--socket", sock, "--kind", "nope"])
    assert res.exit_code == 2 and "'nope' is not one of 'loss', 'police', 'congest', 'sham'" \
        in res.output


def test_an_unregistered_burst_kind_is_refused_by_the_spec(tmp_path):
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, SHAM)
    assert err.value.field == "bursts[0].kind"


def test_the_controller_runs_a_new_burst_kind_through_its_interface(sham, tmp_path):
    """The bursts app's own lifecycle (round events in, record out), with no switch."""
    pytest.importorskip("os_ken")
    from controllers.bursts_app import FabricBursts
    from controllers.protocol import RoundRequest

    app = object.__new__(FabricBursts)
    app.topo = StarTopo(3)
    app.roles = dict(app.topo.roles)
    app.cfg, app.logger, app.raw = {}, logging.getLogger("test"), str(tmp_path)
    app.lock = threading.RLock()
    app.schedule = BurstSchedule.from_list([{"kind": "sham", "target": "server-downlink",
                                             "params": {"label": 3}, "at_round": 1, "rounds": 2}])
    app.active, app.done, app.arm_t0, app.kind_shared, app.seq = {}, [], {}, {}, 0
    actives = []
    for rnd in range(4):
        for event in ("start", "end"):
            reply = app.round_request(RoundRequest(event=event, arm="static", round=rnd, seed=1))
            actives.append(reply.active_bursts)
    assert actives == [[], [], ["b000"], ["b000"], ["b000"], [], [], []]
    (line,) = [json.loads(x) for x in (tmp_path / "static" / "seed-1" / "bursts.jsonl")
               .read_text().splitlines()]
    assert line["kind"] == "sham" and line["dropped_packets"] == 0 and "error" not in line
    assert line["detail"] == {"label": 3, "ports": ["dtr1-eth1"]}
    assert line["requested_start_ns"] <= line["actual_start_ns"] <= line["actual_end_ns"]


def test_a_new_topology_brings_its_spec_fields_host_count_and_routes(ring, tmp_path):
    spec = _spec(tmp_path, "[topology]\nkind = \"ring\"\nring_size = 5\n[placement]\nworkers = 4\n")
    assert spec["topology"]["ring_size"] == 5 and spec["topology"]["hosts_per_switch"] == 1
    graph = build_topology(spec["topology"], TOPOLOGIES, spec["placement"]["workers"])
    assert isinstance(graph, RingTopo) and len(graph.hosts()) == 5
    rules = compute_rules(graph)   # the controller's routes: every host reaches every other
    for src in graph.hosts():
        for dst in graph.hosts():
            if src != dst:
                assert trace_path(graph, rules, src, dst)[-1][0] == graph.host_switch(dst)[0]
    for text, field in (("ring_size = 13", "topology.ring_size"),
                        ("hosts_per_switch = 0", "topology.hosts_per_switch")):
        with pytest.raises(SpecError) as err:
            _spec(tmp_path, f"[topology]\nkind = \"ring\"\n{text}\n")
        assert err.value.field == field
    with pytest.raises(SpecError, match="need 6 hosts but the topology has 5") as err:
        _spec(tmp_path, "[topology]\nkind = \"ring\"\nring_size = 5\n[placement]\nworkers = 5\n")
    assert err.value.field == "placement.workers"


def test_topology_knobs_of_one_name_must_agree(ring):
    from topologies import Knob

    class Other(RingTopo):
        KNOBS = {"ring_size": Knob(6, 3, 20, "use 3..20")}

    with pytest.raises(ValueError, match="knob 'ring_size' differs"):
        register_topology(Other, "other")
    assert "other" not in TOPOLOGIES


def test_a_new_policy_is_an_arm_of_the_spec_and_of_the_workloads(ramp, tmp_path):
    from testbed.config.arms import ARMS
    from workloads import server, worker

    assert ramp == ["ramp", "ramp-tcp", "ramp-sharded"]
    spec = _spec(tmp_path, "", ["arms=ramp,ramp-sharded,static"])
    assert spec.arms == ["ramp", "ramp-sharded", "static"]
    cfg = transport_config(spec["transport"], ARMS["ramp"])
    pol = cfg.make_policy()
    assert isinstance(pol, RampBound)
    assert pol.bound(0) == spec["transport"]["p_low"]
    assert pol.bound(RampBound.RAMP_ROUNDS) == pytest.approx(spec["transport"]["p_high"])
    # The runner launches `workloads.worker --arm TRANSPORT` (and the server for a dblp arm).
    args = worker.resolve(worker.build_parser().parse_args(["--arm", "ramp", "--label", "ramp-tcp",
                                                            "--world-size", "3"]))
    assert args.transport.policy == "ramp" and args.master_port is not None
    assert server.build_parser().parse_args(["--arm", "ramp"]).arm == "ramp"


def test_an_unregistered_policy_is_no_arm_anywhere(tmp_path):
    from workloads import worker

    with pytest.raises(SpecError) as err:
        _spec(tmp_path, "", ["arms=ramp"])
    assert err.value.field == "arms"
    with pytest.raises(SystemExit):
        worker.build_parser().parse_args(["--arm", "ramp"])
