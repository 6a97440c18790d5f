"""The spec's bursts resolve into one seeded schedule shared by every arm."""
import json

import pytest

from controllers.bursts import BurstSchedule
from testbed.config.presets import PRESETS
from testbed.config.spec import load
from testbed.rundir import resolve_bursts


@pytest.mark.unit
def test_random_fraction_generator_hits_its_share_of_rounds_reproducibly():
    spec = load(None, PRESETS["default"], ["training.rounds=200", "burst_every.every=0",
                                           "burst_every.fraction=0.03", "burst_every.start_round=10",
                                           "burst_every.duration_ms=0"])
    a, b = resolve_bursts(spec).to_dict(), resolve_bursts(spec).to_dict()
    assert a == b
    a = a["bursts"]
    rounds = spec["training"]["rounds"]
    assert len(a) == round(0.03 * rounds)
    assert all(x["trigger"] == "round" and x["rounds"] == 1 and x["params"]["p"] == 0.8
               and x["target"] == "server-downlink" and x["max_ms"] == 3000.0 for x in a)
    hit = [x["at_round"] for x in a]
    assert hit == sorted(set(hit)) and min(hit) >= 10 and max(hit) < rounds
    other = resolve_bursts(load(None, PRESETS["default"], ["seed=2", "training.rounds=200",
                                                           "burst_every.every=0",
                                                           "burst_every.fraction=0.03"]))
    assert [x.at_round for x in other] != hit
    assert [x["id"] for x in a] == [f"b{i:03d}" for i in range(len(a))]


@pytest.mark.unit
def test_default_preset_bursts_last_a_fixed_time_for_every_arm():
    # 1.8 s: the second of the 40 Mbit/s, four-worker preset scaled with its round
    sched = resolve_bursts(load(None, PRESETS["default"]))
    assert [(b.at_round, b.duration_ms, b.rounds, b.max_ms) for b in sched] == [
        (r, 1800.0, None, None) for r in (5, 15, 25, 35)]


@pytest.mark.unit
def test_paper_preset_has_five_bursts_at_each_loss_level_that_never_overlap():
    sched = list(resolve_bursts(load(None, PRESETS["paper"])))
    levels = [b.params["p"] for b in sched]
    assert {p: levels.count(p) for p in set(levels)} == {0.6: 5, 0.7: 5, 0.8: 5, 0.9: 5}
    starts = [b.at_round for b in sched]
    assert all(b - a >= 3 for a, b in zip(starts, starts[1:], strict=False))
    assert all(b.duration_ms == 1000.0 for b in sched)


@pytest.mark.unit
def test_periodic_generator_and_explicit_bursts_merge_in_round_order():
    spec = load(None, PRESETS["ci"], ["training.rounds=40"])
    assert [x.at_round for x in resolve_bursts(spec)] == [22, 26, 30, 34, 38]
    periodic = load(None, PRESETS["default"], ["training.rounds=40", "burst_every.every=10",
                                               "burst_every.start_round=5"])
    assert [x.at_round for x in resolve_bursts(periodic)] == [5, 15, 25, 35]
    paper = resolve_bursts(load(None, PRESETS["paper"]))
    assert [x.params["p"] for x in paper][:4] == [0.6, 0.7, 0.8, 0.9]


@pytest.mark.unit
def test_multi_round_bursts_never_overlap():
    spec = load(None, PRESETS["default"], ["burst_every.rounds=5", "burst_every.fraction=0.2"])
    hit = sorted((x.at_round, x.at_round + 5) for x in resolve_bursts(spec))
    assert all(e <= s2 for (_, e), (s2, _) in zip(hit, hit[1:], strict=False))


@pytest.mark.unit
def test_timed_and_round_bursts_interleave_and_every_kind_keeps_its_params(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[burst_every]\nenabled = false\n'
                 '[[bursts]]\nat_round = 30\nrounds = 2\n'
                 '[[bursts]]\nat_s = 2.5\nduration_ms = 100\nkind = "police"\n'
                 '[[bursts]]\nat_round = 4\nduration_ms = 50\nkind = "congest"\nparams = {rate_mbps = 5}\n')
    sched = resolve_bursts(load(str(f), PRESETS["default"]))
    assert [(b.id, b.trigger, b.kind) for b in sched] == [
        ("b000", "time", "police"), ("b001", "round", "congest"), ("b002", "round", "loss")]
    assert [b.params for b in sched] == [{}, {"rate_mbps": 5, "pkt_bytes": 1400}, {"p": 0.8}]
    assert BurstSchedule.from_dict(json.loads(json.dumps(sched.to_dict()))).specs == sched.specs
