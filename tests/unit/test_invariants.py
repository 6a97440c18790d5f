"""The emulator's invariants: the kernel queue trace's reading, the pacing audit, the limits."""
import json

import pytest

from dblp.pacing import PaceAudit, TokenBucket
from testbed import invariants
from testbed.run import budget
from testbed.run.queuetrace import Departure, QueueTrace, link_invariants, queue_samples

PORT = "dte00-eth1"


def _line(t: float, event: str, rest: str) -> str:
    return f"     ovs-vswitchd-812     [001] b..1.  {t:.6f}: {event}: {rest}"


def _trace(events) -> list[str]:
    """Trace text as tracefs prints it: (time, kind[, len]) -> one line each."""
    out = []
    for t, kind, *ln in events:
        if kind == "q":
            out.append(_line(t, "net_dev_queue", f"dev={PORT} skbaddr=0000 len={ln[0]}"))
        elif kind == "e":
            out.append(_line(t, "qdisc_enqueue", "enqueue ifindex=9 qdisc handle=0x10000 "
                                                 "parent=0xFFFFFFFF skbaddr=0000"))
        else:
            out.append(_line(t, "net_dev_start_xmit", f"dev={PORT} queue_mapping=0 skbaddr=0000 "
                                                      f"vlan_tagged=0 protocol=0x0800 len={ln[0]} "
                                                      "data_len=0"))
    return out


@pytest.mark.unit
def test_the_trace_gives_backlog_behind_each_departure_and_the_tail_drops():
    # three packets arrive at once, one of them is tail-dropped, two leave 1.2 ms apart
    lines = _trace([(1.0, "q", 1514), (1.0, "e"), (1.0, "q", 1514), (1.0, "e"),
                    (1.0, "q", 1514),                       # no enqueue: dropped
                    (1.0001, "x", 1514), (1.0013, "x", 1514)])
    tr = QueueTrace(PORT, "t")
    deps = tr._parse(lines)
    assert [(d.length, d.behind, d.dropped) for d in deps] == [(1514, 1, 1), (1514, 0, 1)]
    assert tr.drops == 1 and tr.enqueued == 2
    assert deps[1].t - deps[0].t == pytest.approx(0.0012)


@pytest.mark.unit
def test_a_trace_that_lost_events_is_read_only_as_far_as_it_is_whole():
    """A long unit fills a CPU's trace buffer: from then on that CPU's enqueues are lost
    while the other CPU's departures go on, so counting on would see a backlog that was
    never there (the link idle, judged busy and slow). The parse stops where the full
    CPU's buffer did and says how long a span it judged."""
    from testbed.run import queuetrace

    def on(cpu, lines):
        return [ln.replace("[001]", f"[{cpu:03d}]") for ln in lines]
    # CPU 0 (buffer full after its event at 2.0): enqueues; CPU 1: the departures.
    cpu0 = on(0, _trace([(1.0, "q", 1514), (1.0, "e"), (2.0, "q", 1514), (2.0, "e")]))
    cpu1 = on(1, _trace([(1.0001, "x", 1514), (2.0001, "x", 1514), (3.0, "x", 1514),
                         (4.0, "x", 1514)]))
    lines = sorted(cpu0 + cpu1, key=lambda ln: float(ln.split()[3].rstrip(":")))
    cut = queuetrace._complete_until(lines, {0})
    assert cut == pytest.approx(2.0)
    tr = QueueTrace(PORT, "t")
    deps = tr._parse(lines, cut)
    assert [round(d.t, 4) for d in deps] == [1.0001]   # not the ones whose enqueue was lost
    assert tr.complete_s == pytest.approx(1.0)
    whole = QueueTrace(PORT, "t")
    whole._parse(lines)
    assert whole.complete_s == pytest.approx(3.0)


def _departures(gaps_s, length=1514, behind=5):
    t, out = 0.0, []
    for g in gaps_s:
        t += g
        out.append(Departure(t, length, behind))
    return out


@pytest.mark.unit
def test_a_link_at_its_rate_keeps_both_link_invariants():
    rate = 20e6
    tx = 1514 * 8 / rate                                     # 0.6056 ms per packet
    inv = link_invariants(_departures([tx] * 400), rate)
    assert inv["link_busy_gaps"] == 399
    assert inv["link_busy_rate_frac"] == pytest.approx(1.0, abs=1e-3)
    assert inv["link_spacing_ok_frac"] == 1.0
    assert invariants.broken(inv) == []


@pytest.mark.unit
def test_a_stalling_link_breaks_spacing_and_rate():
    rate = 20e6
    tx = 1514 * 8 / rate
    # every fifth departure waits three packet times: the shaper was not served in time
    gaps = [tx * 3 if i % 5 == 0 else tx for i in range(500)]
    inv = link_invariants(_departures(gaps), rate)
    assert inv["link_spacing_ok_frac"] == pytest.approx(0.8, abs=0.01)
    assert inv["link_busy_rate_frac"] == pytest.approx(1 / 1.4, abs=0.01)
    reasons = invariants.broken(inv)
    assert len(reasons) == 2 and reasons[0].startswith("link rate while busy 71.")


@pytest.mark.unit
def test_an_idle_link_judges_nothing():
    # paced senders below line rate: the queue never holds a packet behind one leaving
    inv = link_invariants([Departure(i * 0.01, 1514, 0) for i in range(1000)], 20e6)
    assert inv == {"link_busy_gaps": 0, "link_busy_rate_frac": None,
                   "link_spacing_ok_frac": None}
    assert invariants.broken(inv) == []


@pytest.mark.unit
def test_queue_samples_are_periodic_with_exact_backlog_bytes():
    step = 1 / 128                                          # exact in binary: no rounding at the period
    deps = [Departure(i * step, 100 + i, 2, dropped=i // 10) for i in range(30)]
    samples = list(queue_samples(deps, mono_to_ns=1_000, period_s=5 * step))
    assert [s[0] for s in samples] == [1_000 + int(i * step * 1e9) for i in (0, 5, 10, 15, 20, 25)]
    # behind departure 5: departures 6 and 7, of 106 and 107 bytes
    assert samples[1][1:] == (2, 213, 0) and samples[2][3] == 1
    assert list(queue_samples([], 0)) == []


@pytest.mark.unit
def test_the_pace_audit_charges_only_lateness_beyond_the_buckets_depth():
    clock = [0.0]
    bucket = TokenBucket(12e6, clock=lambda: clock[0])      # depth 12112 B: 8.07 ms
    audit = PaceAudit(bucket)
    assert audit.slack_s == pytest.approx(12112 / 1.5e6)
    audit.planned(0.0, 0.001)
    audit.woke(0.005)                                       # 4 ms late: the tokens waited
    assert audit.late_s == 0.0 and audit.busy_s == pytest.approx(0.005)
    audit.planned(0.005, 0.006)
    audit.woke(0.020)                                       # 14 ms late: 5.9 ms of tokens lost
    assert audit.late_s == pytest.approx(0.014 - audit.slack_s)
    audit.planned(0.020, float("inf"))                      # nothing left to send
    audit.woke(1.0)
    assert audit.busy_s == pytest.approx(0.020)
    audit.reset()
    assert (audit.late_s, audit.busy_s, audit.due) == (0.0, 0.0, None)
    assert PaceAudit(TokenBucket(None)).slack_s is None     # unpaced: nothing to audit


def _round(rank, t0, t1, late, busy, compute_cpu=0.05, comm_cpu=0.1):
    return {"event": "round", "arm": "a", "role": "worker", "rank": rank, "round": 0,
            "t_start_ns": t0, "t_end_ns": t1, "compute_cpu_s": compute_cpu, "comm_cpu_s": comm_cpu,
            "stats": {"pace_late_s": late, "pace_busy_s": busy}}


@pytest.mark.unit
def test_the_worst_ranks_pacing_error_and_the_rounds_window(tmp_path):
    for rank, late in ((0, 0.01), (1, 0.2)):
        rows = [_round(rank, 100 + i, 200 + i, late, 1.0) for i in range(3)]
        (tmp_path / f"worker{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert budget.pacing_late_frac(tmp_path) == 0.2
    assert budget.rounds_window(tmp_path) == (100, 202)
    cpu = budget.workload_cpu_s(tmp_path, (100, 201))       # the last round ends outside
    assert cpu["workers: training"] == pytest.approx(4 * 0.05)
    assert cpu["workers: exchange"] == pytest.approx(4 * 0.1)
    assert budget.pacing_late_frac(tmp_path / "none") is None


@pytest.mark.unit
def test_unit_cpu_judges_the_window_not_the_start_up():
    reads = iter([[0] * 8, [100, 0, 0, 0, 0, 0, 0, 0], [150, 0, 0, 50, 0, 0, 0, 0],
                  [200, 0, 0, 100, 0, 0, 0, 0]])
    cpu = budget.UnitCpu(read=lambda: next(reads))
    stamps = []
    for _ in range(3):
        cpu.sample()
        stamps.append(cpu.samples[-1][0])
    # the whole unit: 200 of 300 ticks busy; the rounds (the last two samples): 50 of 100
    assert cpu.fractions()["cpu_busy_frac"] == 0.667
    assert cpu.fractions((stamps[1], stamps[2]))["cpu_busy_frac"] == 0.5


@pytest.mark.unit
def test_every_invariant_names_a_declared_fidelity_field():
    from testbed.rundir import FIDELITY_FIELDS
    declared = {f.name for f in FIDELITY_FIELDS}
    assert {inv.field for inv in invariants.INVARIANTS.values()} <= declared
    assert invariants.broken({"cpu_busy_frac": 0.9, "cpu_steal_frac": 0.01}) == [
        "cpu busy 90.0 % above 85.0 %"]
    assert invariants.broken(None) == [] and invariants.broken({"cpu_busy_frac": None}) == []


@pytest.mark.unit
def test_link_figures_read_from_a_trace_with_holes_decide_nothing():
    """A record whose trace lost events before the parse stopped at the first loss (no
    trace_complete_s) is not judged on the link; one read as far as it was whole is."""
    slow = {"link_busy_rate_frac": 0.24, "link_spacing_ok_frac": 0.82, "cpu_busy_frac": 0.3}
    assert invariants.broken({**slow, "trace_lost_events": 970_000}) == []
    judged = invariants.broken({**slow, "trace_lost_events": 970_000, "trace_complete_s": 120.0})
    assert len(judged) == 2 and judged[0].startswith("link rate while busy 2") \
        and judged[1].startswith("packet spacing 8")
    assert len(invariants.broken(slow)) == 2
