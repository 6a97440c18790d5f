"""Controller pieces without a switch: burst schedules, targets, nft scripts."""
import pytest

from controllers.bursts import (
    SCHEDULE_VERSION,
    BurstError,
    BurstEvery,
    BurstRecord,
    BurstSchedule,
    BurstSpec,
)
from controllers.mechanisms import loss_hooks, loss_script, parse_loss_counters
from controllers.targets import TargetError, resolve_target
from topologies import FatTreeTopo, StarTopo

pytestmark = pytest.mark.unit


def test_schedule_round_and_time_triggers():
    s = BurstSchedule.from_list([
        {"kind": "loss", "target": "server-downlink", "params": {"p": 0.8}, "at_round": 5, "rounds": 2},
        {"kind": "police", "target": "core-uplinks", "params": {"rate_mbps": 1}, "at_s": 1.5,
         "duration_ms": 200},
    ])
    assert [b.id for b in s.starting_at_round(5)] == ["b000"]
    assert s.starting_at_round(6) == []
    assert [b.id for b in s.ending_after_round(6)] == ["b000"]
    assert [b.at_s for b in s.timed()] == [1.5]


@pytest.mark.parametrize("bad,msg", [
    ({"kind": "flood", "target": "x", "duration_ms": 1}, "kind"),
    ({"kind": "loss", "target": "x", "duration_ms": 1, "params": {"p": 1.5}}, "params.p"),
    ({"kind": "loss", "target": "x", "params": {"p": 0.5}}, "duration_ms and rounds"),
    ({"kind": "loss", "target": "x", "at_s": 1, "rounds": 1, "params": {"p": 0.5}}, "rounds: only"),
    ({"kind": "loss", "target": "", "duration_ms": 1, "params": {"p": 0.5}}, "target"),
])
def test_bad_bursts_name_the_knob(bad, msg):
    with pytest.raises(BurstError, match=msg):
        BurstSpec.from_dict(bad)


def test_generator_is_seeded_and_does_not_overlap():
    every = BurstEvery(every=100, start_round=50)
    assert [b.at_round for b in every.bursts(400, seed=1)] == [50, 150, 250, 350]
    random3 = BurstEvery(fraction=0.003, start_round=10, rounds=2)
    a, b = random3.bursts(1000, seed=7), random3.bursts(1000, seed=7)
    assert [x.at_round for x in a] == [x.at_round for x in b] and len(a) == 3
    assert [x.at_round for x in random3.bursts(1000, seed=8)] != [x.at_round for x in a]
    rounds = sorted(x.at_round for x in a)
    assert all(r2 - r1 >= 2 for r1, r2 in zip(rounds, rounds[1:], strict=False))
    assert BurstEvery(enabled=False).bursts(1000, seed=1) == []


def test_generator_gives_p_to_loss_bursts_only():
    (police,) = BurstEvery(kind="police", every=10, start_round=5).bursts(10, seed=1)
    assert police.params == {}
    (loss,) = BurstEvery(p=0.6, every=10, start_round=5).bursts(10, seed=1)
    assert loss.params == {"p": 0.6}


def test_burst_log_line_has_contract_fields():
    spec = BurstSpec.from_dict({"kind": "loss", "target": "server-downlink", "params": {"p": 0.6},
                                "at_round": 3, "rounds": 1})
    rec = BurstRecord(spec, "dblp", requested_start_ns=1, round=3, actual_start_ns=2,
                      actual_end_ns=5, requested_end_ns=4, dropped_packets=9)
    line = rec.log_line()
    assert line["event"] == "burst" and line["trigger"] == "round" and line["round"] == 3
    assert line["dropped_packets"] == 9 and line["arm"] == "dblp"


def test_targets_resolve_from_roles():
    t = FatTreeTopo(4)
    (p,) = resolve_target(t, "server-downlink")
    assert (p.switch, p.port, p.direction) == ("dte00", 1, "egress")
    (w,) = resolve_target(t, "worker1-downlink", {"workers": ["h100", "h200"]})
    assert w.switch == "dte20"
    core = resolve_target(t, "core-uplinks")
    assert len(core) == 16 and all(t.switch_info[c.switch].tier == 1 for c in core)
    (x,) = resolve_target(t, "dta00:dtc00")
    assert x.intf == "dta00-eth3"
    assert resolve_target(t, "server-uplink")[0].direction == "ingress"
    for bad in ("nowhere", "dta00:h000", "worker9-downlink", "dte00-eth9"):
        with pytest.raises(TargetError):
            resolve_target(t, bad)
    with pytest.raises(TargetError, match="single switch tier"):
        resolve_target(StarTopo(), "core-uplinks")


def test_loss_script_hooks_egress_and_steals_to_sink():
    t = FatTreeTopo(4)
    hooks = loss_hooks(t, resolve_target(t, "server-downlink"))
    assert hooks == [("dte00-eth1", "")]
    up = loss_hooks(t, resolve_target(t, "server-uplink"))
    assert [h for h, _ in up] == ["dte00-eth2", "dte00-eth3", "dte00-eth4"]
    assert all("ip saddr 10.0.0.2" in m for _, m in up)
    text = loss_script("dtburst_x", hooks, 0.8, "dtz0-eth0")
    assert 'hook egress device "dte00-eth1"' in text
    assert "numgen random mod 10000 < 8000" in text and 'fwd to "dtz0-eth0"' in text
    listing = ("counter packets 100 bytes 1\n"
               "numgen random mod 10000 < 8000 counter packets 79 bytes 1 fwd to \"dtz0-eth0\"\n")
    assert parse_loss_counters(listing) == (100, 79)


def test_schedule_document_round_trips_and_refuses_other_versions():
    sched = BurstSchedule([BurstSpec(at_round=3, rounds=2, id="b000"),
                           BurstSpec("police", "core-uplinks", {"rate_mbps": 2}, at_s=1.5,
                                     duration_ms=200, id="b001"),
                           BurstSpec("congest", duration_ms=5, id="m001")])
    doc = sched.to_dict()
    assert doc["v"] == SCHEDULE_VERSION
    assert BurstSchedule.from_dict(doc).specs == sched.specs
    assert [s.trigger for s in sched] == ["round", "time", "manual"]
    assert sched.specs[2].params == {"pkt_bytes": 1400}   # a kind's default, filled in once
    with pytest.raises(BurstError, match="unknown schedule version 2"):
        BurstSchedule.from_dict(dict(doc, v=2))
    with pytest.raises(BurstError, match="unknown schedule version"):
        BurstSchedule.from_dict(doc["bursts"])          # the old bare list
    with pytest.raises(BurstError, match="used twice"):
        BurstSchedule([BurstSpec(duration_ms=1, id="x"), BurstSpec(duration_ms=2, id="x")])


@pytest.mark.parametrize("kind,params,field", [
    ("loss", {"rate_mbps": 2}, "burst.params.rate_mbps"),      # a police knob on a loss burst
    ("police", {"p": 0.5}, "burst.params.p"),                 # what the old spec default did
    ("congest", {"burst_kb": 10}, "burst.params.burst_kb"),
    ("congest", {"pkt_bytes": 1500.5}, "burst.params.pkt_bytes"),
    ("congest", {"pkt_bytes": 32}, "burst.params.pkt_bytes"),
    ("police", {"rate_mbps": 0}, "burst.params.rate_mbps"),
    ("loss", {"p": True}, "burst.params.p"),
    ("loss", {"p": float("nan")}, "burst.params.p"),
])
def test_params_are_checked_per_kind(kind, params, field):
    with pytest.raises(BurstError) as err:
        BurstSpec.from_dict({"kind": kind, "params": params, "duration_ms": 10})
    assert err.value.field == field


@pytest.mark.parametrize("bad,field", [
    ({"duration_ms": 600_001}, "burst.duration_ms"),
    ({"duration_ms": 0}, "burst.duration_ms"),
    ({"at_round": 1, "rounds": 1001}, "burst.rounds"),
    ({"at_round": -1, "rounds": 1}, "burst.at_round"),
    ({"at_round": 1, "rounds": 1, "max_ms": 0.5}, "burst.max_ms"),
    ({"at_s": 86_401, "duration_ms": 1}, "burst.at_s"),
    ({"duration_ms": 1, "max_ms": 5}, "burst.max_ms"),
    ({"duration_ms": 1, "id": "../x"}, "burst.id"),
    ({"duration_ms": 1, "target": "a b"}, "burst.target"),
    ({"at_round": 1, "rounds": 1, "trigger": "time"}, "burst.trigger"),
    ({"duration_ms": 1, "when": 3}, "burst.when"),
])
def test_one_set_of_ranges(bad, field):
    with pytest.raises(BurstError) as err:
        BurstSpec.from_dict(bad)
    assert err.value.field == field


def test_the_controller_bursts_every_unit_of_an_arm_afresh(tmp_path):
    """An arm repeated over seeds meets the whole schedule once per seed; each record
    goes to its unit's directory (raw/<arm>/seed-<seed>/), a manual one to raw/<arm>/."""
    pytest.importorskip("os_ken")
    import json
    import threading

    from controllers.bursts_app import FabricBursts
    from controllers.protocol import RoundRequest

    app = object.__new__(FabricBursts)   # the burst lifecycle only: no switch, no mechanism
    app.schedule = BurstSchedule.from_list([{"kind": "loss", "target": "server-downlink",
                                             "params": {"p": 0.8}, "at_round": 1, "rounds": 1}])
    app.active, app.done, app.arm_t0 = {}, [], {}
    app.lock, app.raw = threading.RLock(), str(tmp_path)

    def start(key, rec, end_at_ns):
        rec.actual_start_ns = rec.requested_start_ns
        app.active[key] = (rec, None)

    def end(key, t_ns):
        rec, _ = app.active.pop(key)
        rec.requested_end_ns = rec.actual_end_ns = t_ns
        app.done.append(rec)
        app._log_burst(rec)

    app._start, app._end = start, end
    t = 1000
    for i, seed in enumerate((1, 2, 1, None)):   # seed 1 again: its burst is done, not repeated
        for rnd in range(3):
            for event in ("start", "end"):
                t += 1
                reply = app.round_request(RoundRequest(event=event, arm="dblp", round=rnd,
                                                       t_ns=t, seed=seed))
                hit = rnd == 1 and event == "start" and i != 2
                assert reply.active_bursts == (["b000"] if hit else [])
    lines = {d: [json.loads(x) for x in (tmp_path / "dblp" / d / "bursts.jsonl").read_text()
                 .splitlines()] for d in ("seed-1", "seed-2", ".")}
    assert [(b["seed"], b["round"]) for b in lines["seed-1"]] == [(1, 1)]
    assert [(b["seed"], b["round"]) for b in lines["seed-2"]] == [(2, 1)]
    assert [b["round"] for b in lines["."]] == [1] and "seed" not in lines["."][0]
    assert list(app.arm_t0) == [("dblp", 1), ("dblp", 2), ("dblp", None)]


def test_a_loss_of_one_steals_every_packet_without_a_draw():
    """nft refuses "numgen random mod 10000 < 10000": p = 1 (in the knob's range) must
    still make a script the kernel takes, and its counters still read as drops."""
    text = loss_script("dtburst_x", [("dte00-eth1", "")], 1.0, "dtz0-eth0")
    assert "numgen" not in text and 'counter fwd to "dtz0-eth0"' in text
    listing = "counter packets 10 bytes 1\ncounter packets 10 bytes 1 fwd to \"dtz0-eth0\"\n"
    assert parse_loss_counters(listing) == (10, 10)
