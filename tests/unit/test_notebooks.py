"""Run data for notebooks: declared tables as Parquet and CSV, load_run, print figures, the bottleneck.

The run directory is the analysis tests' (`make_run`, with the captures of
test_analysis_packets) plus a placement in the manifest and port statistics
of the bottleneck whose rates are known: 10 Mbit/s in every 1 s interval,
one malformed line, one counter reset, and samples of other ports and
switches that must be left out. Each arm also has queue samples every 10 ms
(`_queue_samples`): 100 packets queued and 2 more drops per sample inside a
burst window, 3 packets outside, one drop-counter reset in the dblp arm.
"""
import json
import pathlib
import re
import shutil

import pandas as pd
import pytest
from PIL import Image

from testbed.analysis import datasets, formats, load_run
from testbed.analysis.pipeline import build_outputs
from testbed.errors import InputError
from testbed.rundir import MANIFEST_SCHEMA
from testbed.testing.captures import gloo_capture, rounds_packets, write_captures
from testbed.testing.rundirs import PERIOD, ROUNDS, T0, make_run, round_start, unit_raw
from workloads.runlog import MalformedEvent, check_port_stats

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
SEC = 10**9
BOTTLENECK_DPID, OTHER_DPID = 196608, 196864      # dte00 (the server h000's edge), dte10
RATE_BYTES = 1_250_000                            # per 1 s interval: 10 Mbit/s


def _counters(tx_bytes, tx_dropped=0):
    return {"rx_packets": 7, "tx_packets": tx_bytes // 1000, "rx_bytes": 700,
            "tx_bytes": tx_bytes, "rx_dropped": 0, "tx_dropped": tx_dropped, "tx_errors": 0}


def _port_stats(arms, seeds=(1,)) -> list[str]:
    lines, tx = [], 0
    for arm, seed in ((a, s) for s in seeds for a in arms):
        for k in range(ROUNDS + 1):
            t = round_start(arm, 0, seed) + k * SEC
            if arm == "dblp" and k == 6 and seed == 1:
                tx = 0                            # the switch reconnected: counters restart
            else:
                tx += RATE_BYTES
            drops = 3 if (arm == "static" and k >= 4) else 0
            lines.append(json.dumps({"event": "port_stats", "t_ns": t, "switch": "dte00",
                                     "dpid": BOTTLENECK_DPID,
                                     "ports": {"1": _counters(tx, drops), "2": _counters(5)}}))
            lines.append(json.dumps({"event": "port_stats", "t_ns": t + 1, "switch": "dte10",
                                     "dpid": OTHER_DPID, "ports": {"1": _counters(99)}}))
    lines.insert(3, json.dumps({"event": "port_stats", "t_ns": "later", "switch": "dte00",
                                "dpid": BOTTLENECK_DPID, "ports": {}}))
    return lines


QUEUE_MS, LIMIT = 10, 100


def _burst_windows(run, arm, seed=1) -> list[tuple[int, int, str]]:
    lines = [json.loads(x) for x in (unit_raw(run, arm, seed) / "bursts.jsonl").read_text().splitlines()]
    return [(b["actual_start_ns"], b["actual_end_ns"], b["id"]) for b in lines]


def _queue_samples(run, arm, seed=1) -> list[str]:
    lines, dropped = [], 0
    windows = _burst_windows(run, arm, seed)
    for k in range(ROUNDS * 1000 // QUEUE_MS + 1):
        t = round_start(arm, 0, seed) + k * QUEUE_MS * 10**6 + 7
        hit = any(s <= t <= e for s, e, _ in windows)
        dropped = 0 if (arm == "dblp" and k == 500) else dropped + 2 * hit
        lines.append(json.dumps({"event": "queue", "arm": arm, "t_ns": t,
                                 "interface": "dte00-eth1", "backlog_bytes": 1500 * (
                                     LIMIT if hit else 3), "backlog_packets": LIMIT if hit else 3,
                                 "dropped": dropped, "limit_packets": LIMIT}))
    return lines


def make_notebook_run(run, arms=("gloo", "static", "dblp"), seeds=(1,)):
    """`make_run` with captures, port statistics, queue samples and a placement, built."""
    write_captures(make_run(run, arms=arms, seeds=seeds), seeds)
    (run / "raw" / "port_stats.jsonl").write_text("\n".join(_port_stats(arms, seeds)) + "\n")
    for arm in arms:
        for seed in seeds:
            (unit_raw(run, arm, seed) / "queue.jsonl").write_text(
                "\n".join(_queue_samples(run, arm, seed)) + "\n")
    man = json.loads((run / "manifest.json").read_text())
    man["placement"] = {"server": "h000", "workers": ["h100", "h200", "h300"]}
    for u in man["units"]:   # each unit's window holds its port-statistics samples
        u.update(started_ns=round_start(u["arm"], 0, u["seed"]),
                 ended_ns=round_start(u["arm"], ROUNDS, u["seed"]))
    (run / "manifest.json").write_text(json.dumps(man))
    build_outputs(run)
    return run


@pytest.fixture(scope="module")
def built_notebook_run(tmp_path_factory):
    """Built once for the module (3 s): the tests read it, or change their own copy."""
    return make_notebook_run(tmp_path_factory.mktemp("notebook") / "run")


@pytest.fixture
def notebook_run(built_notebook_run, tmp_path):
    """A copy of the built run directory, this test's own to change."""
    return pathlib.Path(shutil.copytree(built_notebook_run, tmp_path / "run"))


def test_load_run_returns_the_declared_frames(notebook_run):
    run = load_run(notebook_run)
    for name, table in datasets.TABLES.items():
        df = getattr(run, name)
        assert list(df.columns[:len(table.columns)]) == table.names(), name
        for col in df.columns:
            want = {"int": "Int64", "float": "float64", "str": "string", "bool": "bool"}
            assert str(df[col].dtype) == want[table.kind_of(col)], (name, col)
    assert [c for c in run.rounds.columns if c.startswith("stats_")] == [
        "stats_bytes_sent", "stats_chunks_sent", "stats_probe_rounds", "stats_retransmitted"]
    assert len(run.rounds) == 3 * ROUNDS and run.rounds["in_burst"].sum() == 6
    # Timestamps stay exact integers (a float64 loses nanoseconds at 10^18).
    r = run.rounds.set_index(["arm", "round"])
    assert r.loc[("gloo", 0), "t_start_ns"] == T0["gloo"] and r.loc[("gloo", 3), "in_burst"]
    b = run.bursts.set_index("id")
    assert b.loc["gloo-b1", "actual_start_ns"] == T0["gloo"] + 3 * PERIOD + 11_000_000
    # Every captured packet: the dblp server and worker0 captures, gloo's worker0 capture.
    srv, w0 = rounds_packets()
    assert len(run.packets) == len(srv) + len(w0) + len(gloo_capture())
    dblp = run.packets[run.packets["arm"] == "dblp"]
    assert set(dblp["round"].dropna()) == {2, 3}                # header counter offset undone
    assert (dblp[(dblp["kind"] == "data") & (dblp["pass_no"] == 1)]["seq"] == 1).all()
    assert run.flows["sent_packets"].dtype == "Int64"
    assert run.summary["schema"] == formats.SUMMARY_SCHEMA and run.manifest["placement"]["server"] == "h000"
    assert run.spec["topology"]["bw_mbps"] == 20.0
    assert len(run.evals) == 6 and run.evals["test_accuracy"].max() == pytest.approx(0.97)


def test_bottleneck_table_is_the_servers_downlink_counters(notebook_run):
    b = load_run(notebook_run).bottleneck
    assert set(b["switch"]) == {"dte00"} and set(b["port"]) == {1}   # other ports/switches left out
    assert b.groupby("arm").size().to_dict() == {"dblp": 11, "gloo": 11, "static": 11}
    g = b[b["arm"] == "gloo"]
    assert g["tx_mbps"].iloc[1:].tolist() == pytest.approx([10.0] * 10)
    assert pd.isna(g["tx_mbps"].iloc[0])                    # no sample before the first
    d = b[b["arm"] == "dblp"].reset_index(drop=True)
    assert pd.isna(d.loc[6, "tx_mbps"]) and pd.isna(d.loc[6, "d_tx_bytes"])   # reset: no rate
    assert d.loc[7, "tx_mbps"] == pytest.approx(10.0)
    s = b[b["arm"] == "static"].reset_index(drop=True)
    assert s["d_tx_dropped"].tolist()[3:6] == [0, 3, 0]
    assert (b["shaped_mbps"] == 20.0).all()
    summary = json.loads((notebook_run / "summary.json").read_text())
    assert any(w.startswith("raw/port_stats.jsonl:4: port_stats line: field 't_ns' must be int")
               for w in summary["warnings"])


def test_parquet_round_trips_equal_to_the_csvs(notebook_run):
    for table in datasets.TABLES.values():
        if table.csv:
            pd.testing.assert_frame_equal(datasets.read_csv(notebook_run, table),
                                          datasets.read(notebook_run, table), obj=table.name)
    assert not (notebook_run / "packets.csv").exists()       # per packet: Parquet only


def test_figures_are_svg_beside_print_resolution_png(notebook_run):
    from testbed.analysis.plots import PRINT_DPI

    assert PRINT_DPI >= 300
    pngs = sorted((notebook_run / "plots").glob("*.png"))
    assert [p.stem for p in pngs] == ["bottleneck_over_time", "bound_missing", "burst_rounds",
                                      "bytes_per_round", "compute_exchange", "curves",
                                      "intervals", "latency_cdf", "latency_over_time",
                                      "phase_timeline", "queue_over_time"]
    for png in pngs:
        dpi = Image.open(png).info["dpi"]
        assert min(dpi) == pytest.approx(PRINT_DPI, abs=0.01), png.name
        svg = png.with_suffix(".svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg, png.name
        assert "<dc:date>" not in svg                         # rebuilds stay identical


def test_bottleneck_plot_says_what_it_measures(notebook_run, monkeypatch, tmp_path):
    from testbed.analysis import plots

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    run = load_run(notebook_run)
    plots.bottleneck_over_time(run.bottleneck, run.rounds, run.bursts, ["gloo", "dblp"],
                               tmp_path / "b.png")
    titles = [ax.get_title() for ax in figs[0].axes]
    assert all("Queue occupancy: queue_over_time" in t for t in titles)
    assert titles[0].startswith("gloo: bottleneck dte00 port 1, mean tx rate per 1 s sample")
    assert len(figs[0].axes[0].patches) == 2                 # the arm's two burst windows
    empty = run.bottleneck.iloc[:0]
    plots.bottleneck_over_time(empty, run.rounds, run.bursts, ["gloo"], tmp_path / "c.png")
    assert "no port statistics of the bottleneck" in figs[1].axes[0].get_title()


def test_queue_table_is_the_sampled_occupancy_joined_to_the_bursts(notebook_run):
    q = load_run(notebook_run).queue
    assert q.groupby("arm").size().to_dict() == {a: ROUNDS * 100 + 1 for a in ("dblp", "gloo",
                                                                              "static")}
    assert q["t_ns"].dtype == "Int64" and set(q["interface"]) == {"dte00-eth1"}
    assert (q["limit_packets"] == LIMIT).all()
    for arm in ("gloo", "static", "dblp"):
        a = q[q["arm"] == arm].reset_index(drop=True)
        assert a["t_ns"].iloc[0] == T0[arm] + 7                   # nanoseconds stay exact
        for start, end, bid in _burst_windows(notebook_run, arm):
            inside = a[(a["t_ns"] >= start) & (a["t_ns"] <= end)]
            assert len(inside) >= 4 and (inside["burst_id"] == bid).all()
            assert (inside["backlog_packets"] == LIMIT).all()
            assert (inside["d_dropped"] == 2).all()
        assert (a[a["burst_id"].isna()]["backlog_packets"] == 3).all()
        assert pd.isna(a.loc[0, "d_dropped"])                     # no sample before the first
    d = q[q["arm"] == "dblp"].reset_index(drop=True)
    assert pd.isna(d.loc[500, "d_dropped"]) and d.loc[501, "d_dropped"] == 0   # reset: none
    assert q[q["arm"] == "static"]["d_dropped"].sum() == q[q["arm"] == "static"][
        "burst_id"].notna().sum() * 2


def test_queue_plot_shows_occupancy_limit_and_burst_windows(notebook_run, monkeypatch, tmp_path):
    from testbed.analysis import plots

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
    run = load_run(notebook_run)
    plots.queue_over_time(run.queue, run.rounds, run.bursts, ["gloo", "dblp"], tmp_path / "q.png")
    ax = figs[0].axes[0]
    assert ax.get_title().startswith("gloo: bottleneck dte00-eth1 queue occupancy, sampled every "
                                     "10 ms")
    assert len(ax.patches) == 2                              # the arm's two burst windows
    by_label = {ln.get_label(): ln for ln in ax.lines}
    step = by_label["packets queued, per seed"]  # one line per seed, this run has one
    limit, drops = by_label["queue limit"], by_label["tail drops since the previous sample"]
    assert max(step.get_ydata()) == LIMIT and list(limit.get_ydata()) == [LIMIT, LIMIT]
    assert len(drops.get_xdata()) == (run.queue[run.queue["arm"] == "gloo"]["d_dropped"] > 0).sum()
    plots.queue_over_time(run.queue.iloc[:0], run.rounds, run.bursts, ["gloo"], tmp_path / "e.png")
    assert "no queue samples of the bottleneck" in figs[1].axes[0].get_title()


def _set_table_schema(path: pathlib.Path, value):
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    if value is None:
        del meta[datasets.META_KEY]
    else:
        meta[datasets.META_KEY] = json.dumps({"table": path.stem, "schema": value}).encode()
    pq.write_table(t.replace_schema_metadata(meta), path)


@pytest.mark.parametrize("table,value,needle", [
    ("rounds", 99, "table schema version 99 is unknown"),
    ("bursts", 2, "table schema version 2 is from before repeated seeds"),
    ("evals", 1, "cannot re-analyse that run directory"),
    ("packets", None, "no dblp-testbed 'packets' table metadata"),
])
def test_load_run_refuses_an_unknown_table_version(notebook_run, table, value, needle):
    _set_table_schema(notebook_run / f"{table}.parquet", value)
    with pytest.raises(InputError) as exc:
        load_run(notebook_run)
    msg = str(exc.value)
    assert needle in msg and f"{table}.parquet" in msg and "\n" not in msg


def test_load_run_refuses_an_unversioned_manifest_and_a_missing_table(notebook_run):
    man = json.loads((notebook_run / "manifest.json").read_text())
    del man["schema"]                        # as the runs before the formats were declared
    (notebook_run / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(InputError, match="field 'schema' missing"):
        load_run(notebook_run)
    man["schema"] = MANIFEST_SCHEMA
    (notebook_run / "manifest.json").write_text(json.dumps(man))
    (notebook_run / "evals.parquet").unlink()
    with pytest.raises(InputError, match=r"evals.parquet: not found \(run `dblp-testbed report"):
        load_run(notebook_run)


def test_a_table_off_its_declaration_is_a_bug(tmp_path):
    df = pd.DataFrame({c: [] for c in datasets.EVALS.names()})
    with pytest.raises(ValueError, match="undeclared column"):
        datasets.write(tmp_path, datasets.EVALS, df.assign(extra=[]))
    with pytest.raises(ValueError, match="column.*test_loss missing"):
        datasets.write(tmp_path, datasets.EVALS, df.drop(columns="test_loss"))


def test_rebuild_removes_the_retired_packets_csv(notebook_run):
    (notebook_run / "packets.csv").write_text("arm,round\n")    # per-flow counts, old name
    build_outputs(notebook_run, figures=False)
    assert not (notebook_run / "packets.csv").exists()


def test_port_stats_line_declaration():
    # A line as the controller writes it (copied from a real run's raw/port_stats.jsonl).
    line = ('{"event": "port_stats", "t_ns": 1796092565715467091, "switch": "dte10", '
            '"dpid": 196864, "ports": {"4": {"rx_packets": 7, "tx_packets": 7, "rx_bytes": 586, '
            '"tx_bytes": 586, "rx_dropped": 0, "tx_dropped": 0, "tx_errors": 0}}}')
    assert check_port_stats(json.loads(line))["dpid"] == 196864
    bad = json.loads(line)
    bad["ports"]["4"]["queue_len"] = 3
    with pytest.raises(MalformedEvent, match="undeclared field"):
        check_port_stats(bad)
    bad = json.loads(line)
    bad["ports"] = {"eth4": bad["ports"]["4"]}
    with pytest.raises(MalformedEvent, match="not a port number"):
        check_port_stats(bad)


def readme_notebook_block() -> list[str]:
    """The Notebooks block of docs/outputs.md (the README links there)."""
    text = (ROOT / "docs" / "outputs.md").read_text()
    sec = text.split("\n## Notebooks\n", 1)[1].split("\n#", 1)[0]
    return [line[4:] for line in sec.splitlines() if line.startswith("    ") and line.strip()]


def test_readme_notebook_example_runs(notebook_run):
    block = readme_notebook_block()
    assert block and block[0] == "from testbed.analysis import load_run"
    # The run's path becomes the built run; the committed reference's is read as it is.
    ref = str(ROOT / "results" / "reference" / "default")
    code = "\n".join(re.sub(r'load_run\("(?!results/reference/)[^"]*"\)',
                            f"load_run({str(notebook_run)!r})", line)
                     .replace('"results/reference/default"', repr(ref))
                     for line in block)
    exec(compile(code, "docs/outputs.md", "exec"), {})
    # The docstring's example is the page's.
    from testbed.analysis import load
    doc = [line.strip() for line in load.__doc__.splitlines() if line.startswith("    ")]
    assert doc == [line.strip() for line in block]


def test_burst_timestamps_stay_exact_when_one_is_missing(tmp_path):
    """One burst without an end used to turn the column into float64 (128 ns steps at 10^18)."""
    run = make_run(tmp_path / "run")
    f = unit_raw(run, "static") / "bursts.jsonl"
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    lines[1]["actual_end_ns"] = None                       # the burst's end was never logged
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    build_outputs(run, figures=False)
    b = load_run(run).bursts.set_index("id")
    assert b.loc["static-b1", "actual_end_ns"] == lines[0]["actual_end_ns"]
    assert b.loc["static-b1", "actual_start_ns"] == T0["static"] + 3 * PERIOD + 11_000_000
    assert pd.isna(b.loc["static-b2", "actual_end_ns"])
    assert pd.read_csv(run / "bursts.csv")["actual_start_ns"].astype(str).str.isdigit().all()


def test_every_table_has_the_seed_of_each_unit(tmp_path):
    """Two arms x two seeds: every row says which unit (arm, seed) it comes from."""
    run = load_run(make_notebook_run(tmp_path / "run", arms=("gloo", "dblp"), seeds=(1, 2)))
    for name, table in datasets.TABLES.items():
        df = getattr(run, name)
        assert table.names()[:2] == ["arm", "seed"], name
        assert str(df["seed"].dtype) == "Int64", name
        units = set(zip(df["arm"].dropna(), df["seed"].dropna(), strict=True))
        want = {("dblp", 1), ("dblp", 2)} if name == "packets" or name == "flows" else \
            {(a, s) for a in ("gloo", "dblp") for s in (1, 2)}
        if name in ("packets", "flows"):   # both arms were captured
            want |= {("gloo", 1), ("gloo", 2)}
        assert units == want, (name, units)
    r = run.rounds
    assert r.groupby(["arm", "seed"]).size().tolist() == [ROUNDS] * 4
    # Each unit's rounds are joined to its own bursts only.
    hit = r[r["in_burst"]].groupby(["arm", "seed"])["burst_id"].apply(list).to_dict()
    assert hit[("dblp", 2)] == ["dblp-b1", "dblp-b2"] == hit[("dblp", 1)]
    b = run.bursts.set_index(["arm", "seed", "id"])
    assert b.loc[("dblp", 2, "dblp-b1"), "rounds_hit"] == 1
    assert b.loc[("dblp", 2, "dblp-b1"), "actual_start_ns"] == round_start("dblp", 3, 2) + 11_000_000
    # Packets take their rounds from their unit's rounds (seed 2's clock is 1000 s later).
    pk = run.packets[run.packets["arm"] == "dblp"]
    assert set(pk[pk["seed"] == 2]["round"].dropna()) == {2, 3}
    assert len(run.flows[(run.flows["arm"] == "dblp") & (run.flows["seed"] == 2)]) == \
        len(run.flows[(run.flows["arm"] == "dblp") & (run.flows["seed"] == 1)])
    # Port statistics and queue samples fall in the unit whose manifest window holds them.
    assert run.bottleneck.groupby(["arm", "seed"]).size().tolist() == [ROUNDS + 1] * 4
    q = run.queue
    assert q.groupby(["arm", "seed"]).size().nunique() == 1
    assert set(q[(q["seed"] == 2) & q["burst_id"].notna()]["burst_id"]) == {"dblp-b1", "dblp-b2",
                                                                            "gloo-b1", "gloo-b2"}
    # An evaluation's time counts from its own unit's first round: round 4's end + 1 ms,
    # 4 s + 13 ms + the round's latency (dblp 24 ms, gloo 40 ms; seed 2's are 1.5x).
    e = run.evals.groupby(["arm", "seed"])["t_s"].min()
    assert e.round(3).to_dict() == {("dblp", 1): 4.037, ("dblp", 2): 4.049, ("gloo", 1): 4.053,
                                    ("gloo", 2): 4.073}
