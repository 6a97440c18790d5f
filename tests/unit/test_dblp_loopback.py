"""Whole jobs on loopback: every policy x mode, exact aggregates, identical replicas, loss."""
import numpy as np
import pytest

import dblp
from dblp import rounds as rounds_mod
from dblp.testing import expected_aggregate, run_job

pytestmark = pytest.mark.unit


def _check(results, grads, n, mode, missing="zero", rounds=2):
    for r in range(rounds):
        exp = expected_aggregate(grads, results, r, n, mode, missing)
        first = results[0][r][0]
        for w in range(n):
            # identical replicas: bit for bit
            assert np.array_equal(results[w][r][0], first), (w, r)
        np.testing.assert_allclose(first, exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["ps", "sharded"])
@pytest.mark.parametrize("policy", ["reliable", "static", "dblp"])
def test_exact_result_without_loss(mode, policy):
    n = 3
    results, _, grads = run_job(n, mode, policy)
    _check(results, grads, n, mode)
    if policy == "reliable":
        mean = sum(g[0] for g in grads) / n
        np.testing.assert_allclose(results[0][0][0], mean, rtol=1e-5, atol=1e-6)
    st = results[1][1][1]
    assert st.bound == (0.0 if policy == "reliable" else 0.008)
    assert st.missing_at_stop <= st.bound + 1e-9 and st.pull_missing <= st.bound + 1e-9


@pytest.mark.parametrize("policy", ["reliable", "static", "dblp"])
def test_a_sharded_round_measures_the_norm_only_for_a_policy_that_reads_it(policy, monkeypatch):
    """The detector's pass over the whole model is on a sharded round's path: a
    policy that ignores the norm must not pay for it (``Policy.READS_NORM``)."""
    calls = []
    real = rounds_mod.detector_norm
    monkeypatch.setattr(rounds_mod, "detector_norm",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    results, _, _ = run_job(2, "sharded", policy)
    norms = [results[w][r][1].grad_norm for w in range(2) for r in range(2)]
    reads = dblp.policy.POLICIES[policy].READS_NORM
    assert reads == (policy == "dblp")
    assert len(calls) == (4 if reads else 0)
    assert all((x is not None and x > 0) if reads else x is None for x in norms), norms


def test_reliable_delivers_everything_at_50_percent_loss():
    n = 2
    results, srv_stats, grads = run_job(n, "ps", "reliable", fault=0.5, numel=30_000)
    mean = [sum(g[r] for g in grads) / n for r in range(2)]
    for w in range(n):
        for r in range(2):
            np.testing.assert_allclose(results[w][r][0], mean[r], rtol=1e-5, atol=1e-6)
    st = results[0][1][1]
    assert st.retransmitted > 0 and st.passes_push > 1  # the loss was real


@pytest.mark.parametrize("mode", ["ps", "sharded"])
def test_bounded_delivers_at_least_one_minus_p_under_loss(mode):
    n, p = 3, 0.25
    results, _, grads = run_job(n, mode, "static", fault=0.3, knobs={"p": p}, numel=40_000)
    _check(results, grads, n, mode)
    for w in range(n):
        for r in range(2):
            st = results[w][r][1]
            assert st.missing_at_stop <= p + 1e-9
            assert st.pull_missing <= p + 1e-9
            for s in results[w][r][2].push_senders:
                assert (~s.held).sum() <= int(p * s.count)


def test_multi_part_gradient_and_mean_mode(monkeypatch):
    monkeypatch.setattr(rounds_mod, "PART_CHUNKS", 16)  # many parts, many bitmaps
    n = 3
    results, _, grads = run_job(n, "ps", "static", knobs={"p": 0.2}, fault=0.2, missing="mean",
                                numel=30_000)
    assert len(results[0][0][2].push_senders) > 4
    _check(results, grads, n, "ps", missing="mean")


def test_tcp_control_round_trip():
    n = 2
    results, _, grads = run_job(n, "ps", "static", control="tcp", knobs={"p": 0.1}, fault=0.1)
    _check(results, grads, n, "ps")
    assert results[0][0][1].control == "tcp"


def test_error_feedback_carries_dropped_chunks():
    n = 2
    results, _, grads = run_job(n, "ps", "static", knobs={"p": 0.4}, missing="error_feedback",
                                rounds=2)
    # Round 0 drops ~40 % of each push; round 1's contribution must include those chunks.
    r0 = results[0][0][2]
    lost = sum(int((~s.held).sum()) for s in r0.push_senders)
    assert lost > 0
    s1 = results[0][1][2].push_senders[0]
    from dblp.wire import CHUNK_ELEMS
    held0 = np.repeat(r0.push_senders[0].held, CHUNK_ELEMS)[:grads[0][0].size]
    expect = grads[0][1] + np.where(held0, 0, grads[0][0])
    np.testing.assert_allclose(s1.data, expect, rtol=1e-6, atol=1e-6)


def test_phase_aware_decision_reaches_workers():
    n, rounds = 2, 5
    base = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    # constant gradients: the first check has no previous norm (stay critical), the
    # second sees no change -> relaxed (P_high); zero-filling then moves the norm.
    grads = [[base.copy() for r in range(rounds)] for _ in range(n)]
    results, srv_stats, _ = run_job(n, "ps", "dblp", rounds=rounds, numel=5000, grads=grads,
                                    knobs={"check_every": 1})
    bounds = [results[0][r][1].bound for r in range(rounds)]
    assert bounds[:3] == [0.008, 0.008, 0.408]
    # every participant used the aggregator's decision, round by round
    assert [s.bound for s in srv_stats] == bounds
    assert [results[1][r][1].bound for r in range(rounds)] == bounds
    # and the decisions are exactly the policy fed with the aggregate norms
    replay = dblp.make_policy("dblp", check_every=1)
    for r in range(rounds):
        assert round(replay.bound(r), 6) == bounds[r]
        replay.observe(r, srv_stats[r].grad_norm)
    assert results[1][2][1].phase == "relaxed" and results[1][0][1].phase == "critical"


def test_torch_allreduce_and_from_env():
    torch = pytest.importorskip("torch")
    import threading
    srv = dblp.ParameterServer("127.0.0.1", 0, 2, "reliable")
    th = threading.Thread(target=srv.serve, args=(1,))
    th.start()
    out = {}

    def work(rank):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(srv.port)}
        with dblp.TransportGroup.from_env(env) as g:
            t = torch.full((1000,), float(rank + 1), dtype=torch.float64)
            st = g.allreduce_(t)
            out[rank] = (t, st)
    ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(30) for t in ts]
    th.join(30)
    srv.close()
    for r in range(2):
        assert torch.allclose(out[r][0], torch.full((1000,), 1.5, dtype=torch.float64))
        d = out[r][1].as_dict()
        for key in ("latency_s", "bytes_sent", "chunks_sent", "retransmitted", "missing_at_stop",
                    "probe_rounds", "bound", "phase"):
            assert key in d


def test_from_env_names_missing_variable():
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        dblp.TransportGroup.from_env({"RANK": "0", "MASTER_ADDR": "127.0.0.1"})


@pytest.mark.parametrize("kwargs,knob", [
    ({"control": "quic"}, "control"), ({"missing": "guess"}, "missing"),
    ({"mode": "ring"}, "mode"), ({"rate_bps": -1}, "rate_bps"),
    ({"round_timeout": 0}, "round_timeout"), ({"rank": 5}, "rank"),
    ({"policy": "dblp", "p_low": 1.5}, "p_low"), ({"session_id": -3}, "session_id"),
])
def test_group_knobs_are_validated(kwargs, knob):
    args = dict(rank=0, world_size=2, master_addr="127.0.0.1", master_port=47474)
    args.update(kwargs)
    with pytest.raises(ValueError, match=knob):
        dblp.TransportGroup(**args)


def test_server_knobs_are_validated():
    with pytest.raises(ValueError, match="world_size"):
        dblp.ParameterServer("127.0.0.1", 0, 0)
    with pytest.raises(ValueError, match="missing"):
        dblp.ParameterServer("127.0.0.1", 0, 1, missing="nope")


def test_from_env_reads_optional_transport_knobs():
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "47999",
           "DBLP_MODE": "sharded", "DBLP_CONTROL": "udp", "DBLP_RATE_BPS": "1e8",
           "DBLP_SESSION_ID": "0x2a", "DBLP_POLICY": "static"}
    g = dblp.TransportGroup.from_env(env, missing="mean")
    try:
        assert (g.rank, g.world_size, g.master_port, g.mode) == (1, 3, 47999, "sharded")
        assert g.session_id == 42 and g.engine.bucket.rate == 1e8 / 8
        assert g.policy.name == "static" and g.missing == "mean"
    finally:
        g.close()
    with pytest.raises(ValueError, match="DBLP_RATE_BPS"):
        dblp.TransportGroup.from_env(dict(env, DBLP_RATE_BPS="fast"))


@pytest.mark.parametrize("mode,control", [("ps", "udp"), ("ps", "tcp"), ("sharded", "udp")])
def test_authenticated_job_under_loss(mode, control):
    """A job with a secret: every message carries a MAC, results as promised."""
    import secrets
    n = 3
    results, _, grads = run_job(n, mode, "static", fault=0.2, knobs={"p": 0.1}, numel=30_000,
                                control=control, secret=secrets.token_hex(32))
    _check(results, grads, n, mode)
    assert all(results[w][r][1].counters["unauthenticated"] == 0 for w in range(n)
               for r in range(2))
