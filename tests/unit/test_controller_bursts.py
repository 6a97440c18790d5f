"""Controller pieces without a switch: burst schedules, targets, nft scripts."""
import pytest

from controllers.bursts import (BurstError, BurstRecord, BurstSchedule, BurstSpec, every_n_rounds,
                                seeded_random)
from controllers.mechanisms import loss_hooks, loss_script, parse_loss_counters
from controllers.targets import TargetError, resolve_target
from topologies import FatTreeTopo, StarTopo

pytestmark = pytest.mark.unit


def test_schedule_round_and_time_triggers():
    s = BurstSchedule([
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
    ({"kind": "loss", "target": "x", "at_s": 1, "rounds": 1, "params": {"p": 0.5}}, "rounds only"),
    ({"kind": "loss", "target": "", "duration_ms": 1, "params": {"p": 0.5}}, "target"),
])
def test_bad_bursts_name_the_knob(bad, msg):
    with pytest.raises(BurstError, match=msg):
        BurstSpec.from_dict(bad)


def test_generators_are_seeded_and_do_not_overlap():
    e = every_n_rounds(100, start_round=50, total_rounds=400)
    assert [b.at_round for b in e] == [50, 150, 250, 350]
    a = seeded_random(3, seed=7, first_round=10, last_round=999, rounds=2)
    b = seeded_random(3, seed=7, first_round=10, last_round=999, rounds=2)
    assert [x.at_round for x in a] == [x.at_round for x in b]
    rounds = sorted(x.at_round for x in a)
    assert all(r2 - r1 >= 2 for r1, r2 in zip(rounds, rounds[1:]))


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
