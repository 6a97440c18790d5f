"""The transport bench's physics: ideal passes, bound_s, medians with timeouts, the table."""
import math

import pytest

import testbed.bench.transport as tr
from testbed.bench.transport_doc import Config, bench_row, format_table, reliable_target
from testbed.physics import passes

pytestmark = pytest.mark.unit


def test_ideal_passes_is_ceil_ln_p_over_ln_loss():
    assert passes(0.008, 0.0) == 1
    assert passes(0.008, 0.5) == math.ceil(math.log(0.008) / math.log(0.5)) == 7
    assert passes(0.008, 0.8) == 22
    assert passes(0.408, 0.1) == 1  # one pass already loses less than P
    # a reliable round stops with under half a chunk missing: its row's ideal is finite
    assert passes(reliable_target(2929), 0.5) == math.ceil(math.log(0.5 / 2929) / math.log(0.5))


def test_a_row_takes_its_ideal_passes_from_the_one_formula():
    for bound, loss in ((0.008, 0.5), (0.408, 0.8), (0.0, 0.1), (0.0, 0.0)):
        row = bench_row(Config("dblp", "static" if bound else "reliable", bound, "udp"), loss,
                        [_stats(1.0)], [], 0, 0.3, 2929, 1, 30)
        assert row["ideal_passes"] == passes(bound or reliable_target(2929), loss)
        assert isinstance(row["ideal_passes"], int)


def _stats(lat, passes=3):
    return {"latency_s": lat, "passes_push": passes, "passes_pull": passes - 1,
            "probe_rounds": 2, "missing_at_stop": 0.0, "pull_missing": 0.0, "rtt_s": 0.001}


def test_row_bound_and_median_with_timeouts():
    cfg = Config("dblp", "static", 0.408, "udp")
    row = bench_row(cfg, 0.5, [_stats(1.0), _stats(3.0)], ["PeerTimeout"], 1, 0.3, 2929, 3, 30)
    assert row["bound_s"] == pytest.approx(0.3 * 2 * 0.592 / 0.5)
    assert row["round_trip_s"] == 3.0  # median of [1, 3, inf]
    assert row["passes"] == 3 and row["timeouts"] == 1
    row = bench_row(cfg, 0.5, [_stats(1.0)], ["x", "y"], 2, 0.3, 2929, 3, 30)
    assert row["round_trip_s"] is None and row["ratio"] is None
    gloo = bench_row(Config("gloo", "reliable", 0.0, "tcp"), 0.1, [{"latency_s": 0.5}], [], 0,
                0.3, 2929, 1, 30)
    assert gloo["bound_s"] == pytest.approx(0.3 / 0.9) and gloo["passes"] is None


def test_table_reports_speedups():
    a = bench_row(Config("dblp", "static", 0.008, "udp"), 0.8, [_stats(3.4)], [], 0, 0.3, 2929, 1, 30)
    b = bench_row(Config("dblp", "static", 0.408, "udp"), 0.8, [_stats(2.0)], [], 0, 0.3, 2929, 1, 30)
    doc = {"floor_s": 0.3, "bytes": 1, "rate_bps": 1e8, "reps": 1, "losses": [0.8], "rows": [a, b]}
    text = format_table(doc)
    assert "udp loss  80%: 1.70x" in text and "round_trip_s" in text


def test_row_reports_cpu_seconds_per_gb_moved_by_side():
    cfg = Config("dblp", "reliable", 0.0, "udp")
    cpu = {"worker": [0.5, 0.3, 0.4], "server": [0.2]}
    row = bench_row(cfg, 0.0, [_stats(1.0)], [], 0, 0.3, 2929, 3, 30, cpu=cpu, moved_bytes=2 * 10**8)
    assert row["cpu_s_per_gb_worker"] == pytest.approx(0.4 / 0.2)  # median over reps, per GB
    assert row["cpu_s_per_gb_server"] == pytest.approx(0.2 / 0.2)
    bare = bench_row(cfg, 0.0, [_stats(1.0)], [], 0, 0.3, 2929, 3, 30)
    assert bare["cpu_s_per_gb_worker"] is None and bare["cpu_s_per_gb_server"] is None
    doc = {"floor_s": 0.3, "bytes": 1, "rate_bps": 1e8, "reps": 1, "losses": [0.0], "rows": [row]}
    text = format_table(doc)
    assert "cpu_s/GB w" in text and "2.00" in text and "1.00" in text


@pytest.mark.parametrize("kept", [None, "tx-udp-segmentation", "generic-segmentation-offload"])
@pytest.mark.parametrize("tx_took", [True, False])
def test_a_veth_that_keeps_a_segmentation_offload_gets_software_checksums(kept, tx_took, capsys):
    """Checksum offload is on only where every segmentation offload stayed off; otherwise
    GSO messages would cross the veth whole, past the shaper and the loss hook. The pair
    (and so the bench document) says checksum offload only where ethtool shows it on."""
    import types

    from testbed.emulation.netns import NetnsPair
    pair = NetnsPair(100e6, tag="t")
    calls = []

    def exec(side, *cmd, check=True, input=None):
        calls.append(cmd)
        shown = "\n".join(f"{f}: {'on' if f == kept else 'off'}" for f in (
            "tcp-segmentation-offload", "generic-segmentation-offload", "tx-udp-segmentation"))
        return types.SimpleNamespace(stdout=f"tx-checksumming: {'on' if tx_took else 'off'}\n"
                                            + shown)

    pair.exec = exec
    pair._set_offloads(0)
    assert calls[0][:3] == ("ethtool", "-K", pair.dev[0]) and calls[0][-2:] == ("tx", "on")
    assert calls[1][:2] == ("ethtool", "-k")
    if kept is None:
        assert pair.checksum_offload == tx_took and len(calls) == 2
    else:
        assert not pair.checksum_offload and calls[-1][3:] == NetnsPair.SOFTWARE_CHECKSUMS
        assert "checksums in software" in capsys.readouterr().err


def test_the_bench_interleaves_its_rows_round_trips_and_lists_rows_by_config(monkeypatch,
                                                                             fake_veth_pair):
    """Repetition k of every config before k+1 of any: compared transports meet the same
    machine. A config that misses two deadlines is given up at that loss, and restarted
    once, after its first miss."""
    import types

    pair = fake_veth_pair
    pair.tcp_step = 1  # a row's counters grow by one per read it spans
    calls, starts = [], []
    monkeypatch.setattr(tr, "_start", lambda p, cfg, *a: starts.append(cfg.impl) or
                        [types.SimpleNamespace(stop=lambda: None)])

    def rounds(agents, n, timeout, cfg, before_go=None):
        before_go()
        calls.append((cfg.impl, pair.loss))
        if cfg.impl == "gloo" and pair.loss > 0:
            return [], "RuntimeError: Timed out", {}
        return [_stats(1.0)], None, {"worker": 0.1, "server": 0.1}

    monkeypatch.setattr(tr, "_rounds", rounds)
    cfgs = [Config("dblp", "reliable", 0.0, "udp", "sharded"), Config("gloo", "reliable", 0.0, "tcp")]
    earlier = {"impl": "a row the caller already had"}
    doc = tr.run_bench(losses=(0.0, 0.1), reps=3, numel=354 * 10, rate_bps=1e8, configs=cfgs,
                       log=lambda line: None, rows=[earlier])
    assert doc["rows"].pop(0) is earlier  # kept first: only this bench's rows are reordered
    assert calls == [("dblp", 0.0), ("gloo", 0.0)] * 3 + \
        [("dblp", 0.1), ("gloo", 0.1), ("dblp", 0.1), ("gloo", 0.1), ("dblp", 0.1)]
    assert starts == ["dblp", "gloo", "gloo"]
    assert [(r["impl"], r["loss"]) for r in doc["rows"]] == \
        [("dblp", 0.0), ("dblp", 0.1), ("gloo", 0.0), ("gloo", 0.1)]
    assert [r["timeouts"] for r in doc["rows"]] == [0, 0, 0, 2]
    assert all(0.0 <= r["cpu_steal_frac"] <= 1.0 for r in doc["rows"])
    assert "tcp" not in doc["rows"][0] and set(doc["rows"][2]["tcp"].values()) == {3}
