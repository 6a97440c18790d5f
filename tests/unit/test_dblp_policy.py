"""Policies, pacing and RTT estimation: knobs validated, decisions as specified."""
import pytest

import dblp
from dblp.pacing import RttEstimator, TokenBucket

pytestmark = pytest.mark.unit


def test_registry_and_defaults():
    assert set(dblp.POLICIES) == {"reliable", "static", "dblp"}
    assert dblp.make_policy("reliable").bound(0) == 0.0
    assert dblp.make_policy("static").bound(5) == 0.008
    p = dblp.make_policy("dblp")
    assert (p.p_low, p.p_high, p.threshold, p.interval) == (0.008, 0.408, 0.5, 10)
    assert p.bound(0) == 0.008 and p.phase == "critical"


@pytest.mark.parametrize("name,knobs,knob", [
    ("static", {"p": 1.0}, "p"), ("static", {"p": -0.1}, "p"), ("static", {"p": "x"}, "p"),
    ("dblp", {"p_low": 1.2}, "p_low"), ("dblp", {"p_low": 0.3, "p_high": 0.1}, "p_high"),
    ("dblp", {"threshold": 0}, "threshold"), ("dblp", {"check_every": 0}, "check_every"),
    ("dblp", {"check_every": "epoch"}, "rounds_per_epoch"), ("static", {"q": 1}, "q"),
    ("nonsense", {}, "policy"),
])
def test_bad_knobs_raise_naming_the_knob(name, knobs, knob):
    with pytest.raises(ValueError, match=knob):
        dblp.make_policy(name, **knobs)


def test_phase_aware_checks_every_n_rounds():
    p = dblp.make_policy("dblp", check_every=2, norm="last")
    norms = {1: 10.0, 3: 4.0, 5: 3.5, 7: 3.4}  # checks after rounds 1, 3, 5, 7
    seen = []
    for r in range(9):
        seen.append(p.bound(r))
        p.observe(r, norms.get(r, 999.0))  # off-check norms are ignored
    # r0-3: start critical (first check has no previous norm); after r3 change 0.6 ->
    # critical; after r5 change 0.125 -> relaxed; after r7 change 0.03 -> relaxed.
    assert seen == [0.008] * 6 + [0.408] * 3


def test_phase_aware_window_mean_ignores_one_noisy_round():
    """A single outlier round does not flip the phase when windows are averaged."""
    mean = dblp.make_policy("dblp", check_every=5)
    last = dblp.make_policy("dblp", check_every=5, norm="last")
    norms = [1.0] * 10 + [1.0, 1.0, 1.0, 1.0, 3.0]  # round 14 (a check) is an outlier
    for r, n in enumerate(norms):
        mean.observe(r, n)
        last.observe(r, n)
    assert last.phase == "critical"   # |1 - 3| / 1 = 2 >= 0.5
    assert mean.phase == "relaxed"    # window means 1.0 -> 1.4: change 0.4 < 0.5
    with pytest.raises(ValueError, match="norm"):
        dblp.make_policy("dblp", norm="median")


def test_phase_aware_per_epoch():
    p = dblp.make_policy("dblp", check_every="epoch", rounds_per_epoch=3, p_low=0.024, norm="last")
    assert p.p_high == pytest.approx(0.424)
    for r, n in enumerate([1, 1, 5.0, 1, 1, 5.0]):
        p.observe(r, n)
    assert p.bound(6) == pytest.approx(0.424)


def test_token_bucket_meters_whole_datagrams():
    t = [0.0]
    b = TokenBucket(8e6, depth_bytes=3000, clock=lambda: t[0])  # 1 MB/s
    b.consume(1472)  # 1514 wire bytes
    assert b.wait_time(1472) > 0  # 1486 tokens left < 1514: the datagram waits whole
    t[0] += b.wait_time(1472)
    assert b.wait_time(1472) == 0
    b.consume(1472)
    t[0] = 0.0  # a clock going back never adds tokens
    assert b.wait_time(1472) > 0
    with pytest.raises(ValueError, match="rate_bps"):
        TokenBucket(0)
    with pytest.raises(ValueError, match="depth_bytes"):
        TokenBucket(1e6, depth_bytes=100)


def test_rtt_estimator_adapts_and_clamps():
    e = RttEstimator(initial_rto=0.05, min_rto=0.002, max_rto=1.0)
    assert e.rto == 0.05
    for _ in range(20):
        e.sample(0.0001)
    assert e.rto == 0.002
    for _ in range(20):
        e.sample(0.1)
    assert 0.1 <= e.rto <= 0.2
    e.sample(50)
    assert e.rto == 1.0
