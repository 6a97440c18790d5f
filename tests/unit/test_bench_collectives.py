"""`bench collectives`: nccl-tests' size sweep and bandwidths, the rows, their columns, and the
driver's order of calls on a faked pair (the real pair and agents: tests/emu/test_bench_collectives.py)."""
import json
import math

import pytest
from click.testing import CliRunner

from testbed.bench import collectives as cb
from testbed.bench import collectives_doc as cd
from testbed.errors import ExperimentFailed

pytestmark = pytest.mark.unit

MiB = 1 << 20


@pytest.mark.parametrize("text, size", [("8", 8), ("256K", 256 << 10), ("1M", MiB), ("1MiB", MiB),
                                        ("64m", 64 * MiB), ("2G", 2 << 30), (" 3 KB ", 3 << 10)])
def test_sizes_read_as_nccl_tests_reads_them(text, size):
    assert cd.parse_size(text) == size


@pytest.mark.parametrize("text", ["1.5M", "M", "-1", "1T", "", "1 M B"])
def test_a_size_that_is_not_one_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="is not a size"):
        cd.parse_size(text)


def test_the_sweep_multiplies_from_begin_while_at_most_end():
    assert cd.sweep(MiB, 64 * MiB, 2) == [MiB << k for k in range(7)]
    assert cd.sweep(256 << 10, MiB, 4) == [256 << 10, MiB]
    assert cd.sweep(MiB, 48 * MiB, 2)[-1] == 32 * MiB  # end not reached exactly: not included
    assert cd.sweep(8, 8, 2) == [8]
    assert cd.sweep(8, 1000, 10) == [8, 80, 800]


@pytest.mark.parametrize("args, match", [((12, 64, 2), "multiple of 8 B"), ((4, 64, 2), "multiple"),
                                         ((64, 32, 2), "below the first"), ((8, 64, 1), "at least 2")])
def test_a_sweep_that_cannot_split_or_grow_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        cd.sweep(*args)


def test_algbw_is_bytes_over_time_and_busbw_applies_nccl_tests_factor():
    assert cd.algbw(10**9, 1.0) == 1.0
    assert cd.algbw(MiB, 0.01) == pytest.approx(0.1048576)
    # two ranks: 2(n-1)/n = 1 for all_reduce, (n-1)/n = 1/2 for the others
    assert cd.busbw("all_reduce", 10**9, 1.0) == 1.0
    assert cd.busbw("all_gather", 10**9, 1.0) == 0.5
    assert cd.busbw("reduce_scatter", 10**9, 1.0) == 0.5
    # eight ranks, as nccl-tests' PERFORMANCE.md gives them
    assert cd.busbw("all_reduce", 10**9, 1.0, world=8) == pytest.approx(1.75)
    assert cd.busbw("all_gather", 10**9, 1.0, world=8) == pytest.approx(0.875)
    assert cd.count(MiB) == MiB // 4


@pytest.mark.parametrize("collective", list(cd.COLLECTIVES))
@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_ring_at_line_rate_has_the_links_busbw_whatever_the_ranks(collective, world):
    """busbw's point: the best algorithm sends ``ideal_sent`` bytes from each rank, so at line
    rate its busbw is the link's rate for every collective and every number of ranks."""
    link_bytes_per_s = 125e6  # 1 Gbit/s
    size = 64 * MiB
    t = cd.ideal_sent(collective, size, world) / link_bytes_per_s
    assert cd.busbw(collective, size, t, world) == pytest.approx(link_bytes_per_s / 1e9)


def _stats(latency, wrong=0, sent=None, passes=1):
    s = {"latency_s": latency, "wrong": wrong}
    if sent is not None:
        s.update(bytes_sent=sent, passes=passes)
    return s


DBLP, LOOSE, GLOO = cd.Transport("dblp"), cd.Transport("dblp", 0.408), cd.Transport("gloo")


def test_a_rows_time_is_the_median_over_reps_of_the_mean_over_ranks():
    reps = [[_stats(0.010), _stats(0.012)], [_stats(0.020), _stats(0.022)], [_stats(0.030), _stats(0.040)]]
    r = cd.bench_row(GLOO, "all_reduce", MiB, 0.0, reps, 0, [], 60.0)
    assert r["time_us"] == pytest.approx(21000)  # means 11, 21, 35 ms
    assert r["algbw_GBps"] == pytest.approx(MiB / 0.021 / 1e9)
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 ranks, all_reduce: factor 1
    assert r["spread_us"] == pytest.approx([11000, 35000])
    assert (r["size"], r["count"], r["type"], r["redop"]) == (MiB, MiB // 4, "float", "sum")
    assert r["transport"] == "gloo" and r["policy"] is None and r["bound"] is None
    assert "sent_bytes" not in r and r["exact"] is False and r["wrong"] == 0


def test_failed_reps_count_as_infinitely_slow_and_a_row_of_failures_has_no_time():
    one = cd.bench_row(GLOO, "all_gather", MiB, 0.1, [[_stats(0.01), _stats(0.01)]], 2,
                       ["RuntimeError: Timed out"], 30.0)
    assert one["time_us"] is None and one["algbw_GBps"] is None and one["busbw_GBps"] is None
    assert one["spread_us"] == pytest.approx([10000, None])
    assert one["errors"] == ["RuntimeError: Timed out"] and one["timeouts"] == 2 and one["reps"] == 1
    two = cd.bench_row(GLOO, "all_gather", MiB, 0.1, [[_stats(0.01)] * 2, [_stats(0.03)] * 2], 1, [], 30.0)
    assert two["time_us"] == pytest.approx(30000)  # median of 10, 30 and inf ms
    none = cd.bench_row(GLOO, "all_gather", MiB, 0.1, [], 2, ["x"], 30.0)
    assert none["time_us"] is None and none["spread_us"] is None and none["wrong"] is None


def test_a_dblp_row_keeps_its_wrong_elements_bytes_and_passes():
    reps = [[_stats(0.01, 100, 2.2 * MiB, 1), _stats(0.01, 80, 2.0 * MiB, 2)],
            [_stats(0.01, 0, 2.0 * MiB, 3), _stats(0.01, 0, 2.0 * MiB, 1)],
            [_stats(0.01, 10, 2.0 * MiB, 1), _stats(0.01, 20, 2.0 * MiB, 1)]]
    r = cd.bench_row(LOOSE, "all_gather", MiB, 0.1, reps, 0, [], 60.0)
    assert r["wrong"] == 30  # per rep summed over the ranks (180, 0, 30), then the median
    assert r["outputs"] == 2 * MiB // 4 and r["wrong_frac"] == 30 / (2 * MiB // 4)  # both ranks'
    assert r["sent_bytes"] == pytest.approx(2.0 * MiB)  # per rep the ranks' mean, then the median
    assert r["wire_factor"] == pytest.approx(4.0)  # a ring sends (n-1)/n x 1 MiB from each rank
    assert r["passes"] == 2  # per rep the slowest rank's, then the median
    assert r["exact"] is True and r["policy"] == "static" and r["bound"] == 0.408
    assert r["transport"] == "dblp P=40.8%" and r["redop"] == "none"
    rs = cd.bench_row(DBLP, "reduce_scatter", MiB, 0.0, reps, 0, [], 60.0)
    assert rs["exact"] is False and rs["transport"] == "dblp reliable" and rs["policy"] == "reliable"
    assert rs["outputs"] == MiB // 4  # each rank keeps its half: one array over the ranks
    assert rs["wire_factor"] == pytest.approx(4.0)


def test_transports_are_every_bound_then_gloo():
    assert [t.label for t in cd.transports((0.0, 0.408))] == ["dblp reliable", "dblp P=40.8%", "gloo"]
    assert [t.label for t in cd.transports((0.008,), gloo=False, auth=True)] == ["dblp P=0.8% auth"]


def _right_edges(line: str) -> list[int]:
    """Where each whitespace-separated field of ``line`` ends."""
    edges, inside = [], False
    for i, ch in enumerate(line + " "):
        if ch != " " and not inside:
            inside = True
        elif ch == " " and inside:
            inside = False
            edges.append(i)
    return edges


def _row(**kw):
    reps = [[_stats(0.0084, 0, 1.05 * MiB), _stats(0.0086, 0, 1.05 * MiB)]]
    r = cd.bench_row(DBLP, "all_reduce", MiB, 0.0, reps, 0, [], 60.0)
    return {**r, **kw}


def test_a_row_prints_in_nccl_tests_columns_under_their_header():
    r = _row()
    line = cd.columns(r)
    assert line.split() == ["1048576", "262144", "float", "sum", "8500.0", "0.1234", "0.1234", "0"]
    assert _right_edges(line) == _right_edges(cd.COLUMNS[0])  # each figure under its name
    assert _right_edges(cd.COLUMNS[1])[2:] == _right_edges(line)[4:7]  # (us) (GB/s) (GB/s)
    streamed = cd.format_row(r)
    assert streamed.split()[:3] == ["all_reduce", "dblp", "reliable"]
    head = cd.HEADER.splitlines()
    # the loss and nccl-tests' columns under the header's names (a transport's label has spaces)
    assert _right_edges(head[0])[-9:] == _right_edges(streamed)[-9:]
    lossy = cd.format_row(_row(loss=0.1))
    assert lossy.split()[3] == "10%"


def test_a_row_past_its_deadline_shows_the_deadline_and_no_bandwidth():
    r = _row(time_us=None, algbw_GBps=None, busbw_GBps=None, wrong=None, reps=0, timeouts=2,
             round_timeout_s=60.0)
    line = cd.columns(r)
    assert "> 60 s" in line and line.split()[-3:] == ["-", "-", "-"]
    assert _right_edges(line)[-3:] == _right_edges(cd.COLUMNS[0])[-3:]
    assert cd.format_row(r).endswith("(2 of 2 failed or missed the 60 s deadline)")


def test_the_table_is_one_nccl_tests_block_per_collective_transport_and_loss():
    rows = [_row(size=2 * MiB, count=MiB // 2), _row(), _row(loss=0.1), _row(collective="all_gather")]
    doc = cd.bench_doc([MiB, 2 * MiB], 2, ["all_reduce", "all_gather"], [DBLP], [0.0, 0.1], 5, 1,
                       1e9, rows, "every packet", "offloads")
    assert doc["link_GBps"] == 0.125 and doc["schema"] == cd.SCHEMA and doc["world_size"] == 2
    text = cd.format_table(doc)
    blocks = [line for line in text.splitlines() if line.startswith("# all_") or line.startswith("# reduce")]
    assert blocks == ["# all_reduce over dblp reliable, loss 0 %",
                      "# all_reduce over dblp reliable, loss 10 %",
                      "# all_gather over dblp reliable, loss 0 %"]
    first = text.split("loss 0 %\n", 1)[1].splitlines()
    assert [line.split()[0] for line in first[2:4]] == ["1048576", "2097152"]  # sizes ascending
    assert "busbw's ceiling 0.1250 GB/s" in text


class _FakeAgent:
    def __init__(self, transport):
        self.transport, self.stopped = transport, False

    def stop(self):
        self.stopped = True


@pytest.fixture
def fake_bench(monkeypatch, fake_veth_pair):
    """``run_bench`` on the faked pair; agents that answer with times from the link's rate.

    Records every call as (transport label, loss on the link at "go", the point's fields).
    """
    pair = fake_veth_pair
    monkeypatch.setattr(cb, "NetnsPair", lambda rate_bps: pair)
    calls, starts = [], []
    failing: set[str] = set()

    def start(p, t, rate_bps, round_timeout, port):
        starts.append(t.label)
        return [_FakeAgent(t), _FakeAgent(t)]

    def exchange(agents, fields, prepare_timeout, round_timeout, before_go=None):
        assert pair.loss == 0  # the point's buffers and warm-up meet a clean link
        if before_go is not None:
            before_go()
        t = agents[0].transport
        calls.append((t.label, pair.loss, dict(fields)))
        if t.label in failing:
            return None, "RuntimeError: Timed out waiting 30000ms"
        secs = cd.ideal_sent(fields["collective"], fields["size"]) * 8 / 1e9 * (1 + pair.loss)
        extra = {"bytes_sent": 1.05 * cd.ideal_sent(fields["collective"], fields["size"]),
                 "passes": 1} if t.impl == "dblp" else {}
        # a bounded round's missing share, zero-filled (DBLP's all_gather is exact)
        c = cd.COLLECTIVES[fields["collective"]]
        lost = 0 if c.name == "all_gather" else int(t.bound * c.outputs(fields["size"], 2) / 2)
        return [{"latency_s": secs, "wrong": lost, **extra}] * 2, None

    monkeypatch.setattr(cb, "_start", start)
    monkeypatch.setattr(cb, "_exchange", exchange)
    return pair, calls, starts, failing


def test_the_bench_interleaves_transports_and_lists_rows_as_nccl_tests_blocks(fake_bench):
    pair, calls, starts, _ = fake_bench
    ts = cd.transports((0.0, 0.408))
    logged = []
    doc = cb.run_bench([MiB, 4 * MiB], ("all_reduce", "reduce_scatter"), ts, (0.0, 0.1), reps=2,
                       warmup=1, rate_bps=1e9, factor=4, log=logged.append)
    assert starts == ["dblp reliable", "dblp P=40.8%", "gloo"]  # once each, for the whole bench
    # at each loss, size and collective: repetition k of every transport before k+1 of any
    first = [(label, loss) for label, loss, f in calls[:6]]
    assert first == [(t.label, 0.0) for t in ts] * 2
    assert all(f == {"collective": "all_reduce", "size": MiB, "warmup": 1} for _, _, f in calls[:6])
    assert [loss for _, loss, _ in calls] == [0.0] * 24 + [0.1] * 24  # the loss only at "go"
    assert pair.loss == 0
    rows = doc["rows"]
    assert len(rows) == len(logged) == 2 * 2 * 2 * 3
    assert [(r["collective"], r["transport"], r["loss"], r["size"]) for r in rows[:5]] == [
        ("all_reduce", "dblp reliable", 0.0, MiB), ("all_reduce", "dblp reliable", 0.0, 4 * MiB),
        ("all_reduce", "dblp reliable", 0.1, MiB), ("all_reduce", "dblp reliable", 0.1, 4 * MiB),
        ("all_reduce", "dblp P=40.8%", 0.0, MiB)]
    for r in rows:
        assert r["gro"] is (r["loss"] == 0) and r["reps"] == 2
        assert 0 <= r["cpu_steal_frac"] <= r["cpu_busy_frac"] <= 1
        # the fake ran at line rate, slowed by the loss: busbw is the link's, over 1 + p
        assert r["busbw_GBps"] == pytest.approx(doc["link_GBps"] / (1 + r["loss"]))
    assert doc["sizes"] == [MiB, 4 * MiB] and doc["factor"] == 4
    assert doc["transports"] == ["dblp reliable", "dblp P=40.8%", "gloo"]


def test_a_failing_transport_is_restarted_then_given_up_and_the_others_go_on(fake_bench):
    _, calls, starts, failing = fake_bench
    failing.add("gloo")
    doc = cb.run_bench([MiB], ("all_gather",), cd.transports(), (0.0,), reps=5, warmup=0,
                       rate_bps=1e9, log=lambda line: None)
    assert starts == ["dblp reliable", "gloo", "gloo"]  # restarted once, then given up
    assert [label for label, _, _ in calls].count("gloo") == 2
    dblp, gloo = doc["rows"]
    assert dblp["reps"] == 5 and dblp["time_us"] > 0
    assert gloo["time_us"] is None and gloo["timeouts"] == 2
    assert gloo["errors"] == ["RuntimeError: Timed out waiting 30000ms"]


def test_the_command_writes_the_document_and_prints_nccl_tests_blocks(fake_bench, monkeypatch, tmp_path):
    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb.signal, "signal", lambda *a: None)
    out = tmp_path / "c.json"
    res = CliRunner().invoke(cb.collectives_cmd, ["-b", "1M", "-e", "2M", "-f", "2", "-n", "1",
                                                  "--collectives", "all_gather", "--bounds", "0,0.408",
                                                  "--losses", "0,0.1", "--json-file", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["sizes"] == [MiB, 2 * MiB] and doc["losses"] == [0.0, 0.1] and doc["reps"] == 1
    assert len(doc["rows"]) == 2 * 2 * 3 and doc["rate_bps"] == 1e9
    assert "# all_gather over gloo, loss 10 %" in res.output
    assert all(math.isfinite(r["busbw_GBps"]) for r in doc["rows"])


def test_quick_is_a_tiny_sweep_of_every_collective_over_both_transports(fake_bench, monkeypatch, tmp_path):
    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb.signal, "signal", lambda *a: None)
    res = CliRunner().invoke(cb.collectives_cmd, ["--quick", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output.splitlines()[-1])
    assert doc["sizes"] == [256 << 10, MiB] and doc["losses"] == [0.0, 0.1] and doc["reps"] == 2
    assert doc["transports"] == ["dblp reliable", "dblp P=40.8%", "gloo"]
    assert doc["collectives"] == list(cd.COLLECTIVES)


@pytest.mark.parametrize("args, hint", [(["-b", "12"], "-b/-e/-f"), (["-b", "1X"], "-b/-e/-f"),
                                        (["-e", "512K"], "-b/-e/-f"), (["--losses", "1"], "--losses"),
                                        (["--bounds", "a"], "--bounds"), (["--collectives", "all_to_all"],
                                                                          "--collectives"),
                                        (["-n", "0"], "--reps")])
def test_bad_input_is_refused_before_anything_is_built(args, hint, monkeypatch):
    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb, "NetnsPair", None)  # nothing may get this far
    res = CliRunner().invoke(cb.collectives_cmd, args)
    assert res.exit_code == 2 and hint in res.output, res.output


def test_a_bench_that_fails_part_way_keeps_its_rows(fake_bench, monkeypatch, tmp_path):
    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb.signal, "signal", lambda *a: None)
    real = cb._start

    def start(p, t, *a):
        if t.impl == "gloo":
            raise ExperimentFailed("bench collectives: gloo: an agent failed to start: boom")
        return real(p, t, *a)

    monkeypatch.setattr(cb, "_start", start)
    out = tmp_path / "c.json"
    res = CliRunner().invoke(cb.collectives_cmd, ["-b", "1M", "-e", "1M", "-n", "1", "--collectives",
                                                  "all_reduce", "--json-file", str(out)])
    assert isinstance(res.exception, ExperimentFailed)
    doc = json.loads(out.read_text())
    assert [r["transport"] for r in doc["rows"]] == ["dblp reliable"] and "boom" in doc["failed"]


def test_the_results_page_renders_busbw_per_collective_size_transport_and_loss(fake_bench, monkeypatch,
                                                                              tmp_path):
    """The reference's page, from the file the real command writes (on the faked pair)."""
    from testbed.analysis.pages import TABLES
    from testbed.analysis.pages.collectives import FILE, collectives_table

    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb.signal, "signal", lambda *a: None)
    _, _, _, failing = fake_bench
    failing.add("gloo")
    ref = tmp_path / "collectives"
    ref.mkdir()
    res = CliRunner().invoke(cb.collectives_cmd, ["-b", "1M", "-e", "2M", "-n", "3", "--bounds", "0,0.408",
                                                  "--losses", "0,0.1", "--json-file", str(ref / FILE)])
    assert res.exit_code == 0, res.output
    assert TABLES["collectives"].render is collectives_table
    text = collectives_table(ref)
    lines = text.splitlines()
    assert lines[0] == ("| collective | size | dblp reliable, 0 % | dblp P=40.8%, 0 % | gloo, 0 % | "
                        "dblp reliable, 10 % | dblp P=40.8%, 10 % | gloo, 10 % |")
    assert len([x for x in lines if x.startswith("| all_gather |")]) == 2
    first = lines[2].split(" | ")
    assert first[:2] == ["| all_reduce", "1M"]
    assert first[2] == f"0.125 ({cd.ideal_sent('all_reduce', MiB) * 8 / 1e9 * 1e3:.1f} ms)"
    assert first[4] == "> 60 s"  # gloo missed its deadline
    assert "the link's 0.125 GB/s" in text and "arrays of 1M to 2M (x2)" in text
    assert "all_reduce at 10 % loss: dblp reliable 90.9 %, dblp P=40.8% 90.9 %" in text
    assert "all_reduce 1.05x, all_gather 1.05x, reduce_scatter 1.05x" in text  # the fake's bytes
    assert ("dblp P=40.8% all_reduce 40.8 % of the output elements (4 rows); dblp P=40.8% "
            "reduce_scatter 40.8 % of the output elements (4 rows); the other 16 rows were exact"
            ) in text
    assert "Missed the 60 s deadline: gloo all_reduce 1M at 0 %" in text


def test_the_page_says_when_every_row_was_exact_and_on_time(fake_bench, monkeypatch, tmp_path):
    from testbed.analysis.pages.collectives import FILE, collectives_table

    monkeypatch.setattr(cb.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cb.signal, "signal", lambda *a: None)
    res = CliRunner().invoke(cb.collectives_cmd, ["-b", "8", "-e", "8K", "-f", "32", "-n", "1",
                                                  "--json-file", str(tmp_path / FILE)])
    assert res.exit_code == 0, res.output
    text = collectives_table(tmp_path)
    assert [x.split(" | ")[1] for x in text.splitlines()[2:5]] == ["8", "256", "8K"]
    assert "Every row's output was exact in every repetition (#wrong 0)." in text
    assert "No row missed its 60 s deadline." in text


def test_the_page_refuses_a_document_of_another_version(tmp_path):
    from testbed.analysis.pages.collectives import FILE, collectives_table
    from testbed.errors import InputError

    (tmp_path / FILE).write_text(json.dumps({"schema": 99, "rows": []}))
    with pytest.raises(InputError, match="schema 99"):
        collectives_table(tmp_path)
