"""An unauthenticated flood: dropped before its tags are verified, by the kernel where it can.

One Python process sends forged DATA of the running round (the session and
round as a sniffer sees them, tags it cannot make) to the aggregator as fast
as it can, from an address that is no member's. The aggregator's socket
filter lets a keyed job hear only joins and its members' pinned addresses
(``dblp.sockfilter``), so the kernel drops the flood; where user space sees
such datagrams it drops them by header and address, and past the flood
budget it blocks the source (``dblp.engine_state.BadSources``): every round
still completes with the exact mean.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import dblp
from dblp import sockfilter
from testbed.bench import flood as fb

pytestmark = pytest.mark.unit

def test_a_flood_of_bad_tags_is_dropped_by_address_and_rounds_stay_exact():
    n, rounds, numel = 2, 6, 60_000
    secret = "ab" * 32
    srv = dblp.ParameterServer("127.0.0.1", 0, n, "reliable", secret=secret,
                               session_id=0x5EED, round_timeout=10)
    port = srv.port  # bound by the server itself: no window for another socket to take it
    # The bench's flooder (testbed.bench.flood): forged DATA of the job's session and
    # rounds, as fast as one process sends, from the moment it is told to go.
    proc, flood_port = fb.armed_flood(port, 0x5EED, rounds, dict(os.environ))
    fb.go(proc)
    blocked_seen: list[bool] = []
    filtered_seen: list[bool] = []  # the socket's kernel filter dropped the source
    results: dict = {}
    errors: list = []

    def serve():
        try:
            srv.serve(rounds, on_round_end=lambda r, st: (blocked_seen.append(
                ("127.0.0.1", flood_port) in srv.engine.bad.blocked),
                filtered_seen.append(bool(srv.engine.kernel_blocked)
                                     or srv.engine.kernel_allow is not None)))
        except Exception as exc:
            errors.append(exc)

    def work(w):
        try:
            with dblp.TransportGroup(w, n, "127.0.0.1", port, policy="reliable", secret=secret,
                                     session_id=0x5EED, round_timeout=10) as g:
                for r in range(rounds):
                    t = np.full(numel, float(w + 1), np.float32)
                    g.allreduce_(t)
                    results[(w, r)] = t
                    time.sleep(0.05)
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=serve)] + [threading.Thread(target=work, args=(w,))
                                                  for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    sent = fb.stop(proc)["sent"]
    dropped = sockfilter.socket_drops(srv.engine.sock)
    srv.close()
    assert not errors, errors
    for w in range(n):
        for r in range(rounds):
            assert np.all(results[(w, r)] == 1.5), (w, r)
    # Blocked in user space, or never seen there: the kernel's filter of the members.
    assert any(blocked_seen) or srv.engine.kernel_allow is not None, blocked_seen
    # Counted by the engine until the source is blocked, dropped by the socket's filter
    # after (dblp.sockfilter): the kernel counts those.
    c = srv.engine.counters
    assert dropped is not None and c.unauthenticated + c.foreign + dropped > 1000 and sent > 1000, \
        (c, dropped, sent)
    assert any(filtered_seen), "the flood's source was never in the socket's filter"


def test_the_flood_bench_tells_rounds_apart_by_time_and_keeps_every_aggregate_exact():
    """`bench flood`, small: quiet and flooded rounds by their stamps, the flood from one
    process counted at the aggregator, every aggregate the exact mean."""
    doc = fb.run_flood_bench(blocks=4, block_rounds=4, numel=1 << 16, log=lambda *_: None)
    assert doc["schema"] == fb.SCHEMA and doc["kind"] == "bench-flood"
    assert doc["all_exact"], doc["rounds"]
    kinds = [r["kind"] for r in doc["rounds"]]
    assert kinds[:4] == ["quiet"] * 4 and "flood" in kinds[4:], kinds
    # the fourth block floods the sink, not the job: its rounds are the control's
    assert "control" in kinds[kinds.index("flood"):] and doc["control_ratio"] is not None
    assert doc["control_datagrams_per_s"] > 1000
    assert [f["target"] for f in doc["floods"]] == ["job", "sink"]
    assert doc["quiet_rounds"] == kinds.count("quiet") and doc["flood_rounds"] == kinds.count("flood")
    assert doc["ratio"] == pytest.approx(doc["flood_s"] / doc["quiet_s"])
    agg = doc["aggregator"]  # dropped for its tags, before them, or by the socket's filter
    assert doc["flood_datagrams_per_s"] > 1000 \
        and agg["unauthenticated"] + agg["foreign"] + (agg["socket_drops"] or 0) > 0
    assert "flood / quiet:" in fb.format_doc(doc)


def test_a_round_is_a_flood_round_only_wholly_inside_a_flood():
    from testbed.bench.flood import classify

    floods = [{"t0": 10.0, "t1": 20.0}]
    rounds = [{"t0": 1.0, "t1": 2.0}, {"t0": 9.0, "t1": 11.0}, {"t0": 12.0, "t1": 13.0},
              {"t0": 19.5, "t1": 20.5}, {"t0": 21.0, "t1": 22.0}]
    assert classify(rounds, floods) == ["quiet", "switch", "flood", "switch", "quiet"]
    sink = [{**floods[0], "target": "sink"}]  # a control block: the same times, a sink flooded
    assert classify(rounds, sink) == ["quiet", "switch", "control", "switch", "quiet"]


def test_blocks_go_quiet_flood_quiet_control():
    assert fb.block_plan(6) == ["quiet", "flood", "quiet", "control", "quiet", "flood"]


@pytest.mark.parametrize("sources,sessions", [(4096, "job"), (64, "foreign")])
def test_the_flood_bench_rotates_sources_and_forges_sessions(sources, sessions):
    """Issue 60's floods: 4,096 rotating source addresses (one socket, IP_PKTINFO), and
    sessions the job never had; the aggregator acts on none, every aggregate is exact."""
    doc = fb.run_flood_bench(blocks=2, block_rounds=4, numel=1 << 16, log=lambda *_: None,
                             sources=sources, sessions=sessions)
    assert doc["all_exact"] and doc["sources"] == sources and doc["sessions"] == sessions
    assert doc["flood_rounds"] > 0 and doc["flood_datagrams_per_s"] > 1000
    assert f"{sources:,} source address(es), {sessions} sessions" in fb.format_doc(doc)


def test_cpu_per_forged_datagram_is_the_floods_cpu_beyond_the_quiet_rate():
    """The aggregator spends 0.1 CPU-s a second quiet and 0.5 while flooded; the flood sent
    100,000 datagrams in its 2 s: (0.5 - 0.1) x 2 s / 100,000 = 8 us a datagram."""
    cpu = [(0.0, 0.0), (2.0, 0.2), (4.0, 1.2), (6.0, 1.4)]   # quiet, flooded, quiet
    rounds = [{"t0": 0.0, "t1": 2.0}, {"t0": 2.0, "t1": 4.0}, {"t0": 4.0, "t1": 6.0}]
    kinds = ["quiet", "flood", "quiet"]
    floods = [{"t0": 2.0, "t1": 4.0, "sent": 100_000, "target": "job"},
              {"t0": 6.0, "t1": 7.0, "sent": 9, "target": "sink"}]   # the control: not counted
    assert fb.cpu_per_forged(rounds, kinds, floods, cpu) == pytest.approx(8.0)
    assert fb.cpu_per_forged(rounds, kinds, floods, None) is None
