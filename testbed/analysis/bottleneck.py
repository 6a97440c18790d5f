"""The bottleneck link over time, from the controller's port statistics.

The bottleneck is the server's downlink: every worker's push crosses it and
the loss bursts target it. Its queue is the HTB qdisc on the switch port
facing the server; the runner names that port from the spec's topology and
the manifest's placement (`TopoGraph.host_switch`), and so does this module,
so nothing is inferred from the data.

What is measured there, twice:

* the controller samples OpenFlow port counters
  (`workloads.runlog.PORT_STATS_FIELDS`) every few seconds into
  raw/port_stats.jsonl. Cumulative packet and byte counters give the mean
  transmit rate towards the server per sampling interval, and the switch's
  own transmit drops: the `bottleneck` table. They hold no occupancy.
* the runner's bottleneck monitor samples the queue itself (`tc -s qdisc`:
  backlog, cumulative tail drops, limit) every 50 ms into
  raw/<arm>/seed-<seed>/queue.jsonl (the ``queue`` event): the `queue` table, each
  sample tagged with the burst windows that hold it.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pandas as pd

from testbed.analysis.datasets import BOTTLENECK, QUEUE
from testbed.config.spec import Spec, build_topology
from testbed.rundir import unit_records
from workloads.runlog import PORT_COUNTER_FIELDS, MalformedEvent, check_port_stats

COUNTERS = [f.name for f in PORT_COUNTER_FIELDS]


def bottleneck_port(spec: Spec, manifest: dict) -> tuple[str, int, int] | None:
    """(switch, dpid, port) facing the server, from the spec and the manifest's placement."""
    from topologies import TOPOLOGIES

    server = (manifest.get("placement") or {}).get("server")
    if not server:
        return None
    topo = build_topology(spec["topology"], TOPOLOGIES, spec["placement"]["workers"])
    try:
        sw, port = topo.host_switch(server)
    except (KeyError, ValueError):
        return None
    return sw, topo.switch_info[sw].dpid, port


def read_port_stats(run_dir, notes: list[str]) -> list[dict]:
    """The lines of raw/port_stats.jsonl, each checked; a bad line is skipped and said."""
    path = pathlib.Path(run_dir) / "raw" / "port_stats.jsonl"
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(check_port_stats(json.loads(line)))
            except json.JSONDecodeError:
                notes.append(f"raw/port_stats.jsonl:{n}: not a JSON line, skipped")
            except MalformedEvent as exc:
                notes.append(f"raw/port_stats.jsonl:{n}: {exc}, skipped")
    return out


def _unit_at(t_ns: int, windows: list[tuple[str, int, int, int]]) -> tuple[str | None, int | None]:
    """(arm, seed) of the unit whose manifest window holds t_ns; (None, None) between units."""
    for arm, seed, start, end in windows:
        if start <= t_ns <= end:
            return arm, seed
    return None, None


def bottleneck_table(run_dir, spec: Spec, manifest: dict, notes: list[str]) -> pd.DataFrame:
    """One row per sample of the bottleneck port, with per-interval deltas and rate.

    A delta needs two samples of the same port, so the first sample has
    none; a counter that went backwards (the switch reconnected and its
    counters restarted) gives no delta either, rather than a negative rate.
    """
    cols = BOTTLENECK.names()
    where = bottleneck_port(spec, manifest)
    lines = read_port_stats(run_dir, notes)
    if where is None or not lines:
        return pd.DataFrame(columns=cols)
    sw, dpid, port = where
    windows = [(u["arm"], u["seed"], u["started_ns"], u["ended_ns"]) for u in unit_records(manifest)
               if "started_ns" in u and "ended_ns" in u]
    rows = []
    for line in sorted(lines, key=lambda e: e["t_ns"]):
        c = line["ports"].get(str(port))
        if line["dpid"] != dpid or c is None:
            continue
        arm, seed = _unit_at(line["t_ns"], windows)
        rows.append({"arm": arm, "seed": seed, "t_ns": line["t_ns"], "switch": sw,
                     "dpid": dpid, "port": port, **{k: c[k] for k in COUNTERS}})
    if not rows:
        notes.append(f"raw/port_stats.jsonl: no sample of the bottleneck port ({sw} port {port})")
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    dt = df["t_ns"].diff()
    df["interval_s"] = dt / 1e9
    for k in ("tx_packets", "tx_bytes", "tx_dropped"):
        d = df[k].diff()
        df[f"d_{k}"] = d.where((d >= 0) & (dt > 0))
    df["tx_mbps"] = df["d_tx_bytes"] * 8 / df["interval_s"] / 1e6
    df["shaped_mbps"] = float(spec["topology"]["bw_mbps"])
    df["tx_mbps"] = df["tx_mbps"].replace([np.inf, -np.inf], np.nan)
    return df[cols]


def queue_table(queue: dict[str, list[dict]], bursts: pd.DataFrame) -> pd.DataFrame:
    """One row per queue sample (RawRun.queue), in time order per unit (arm, seed).

    `d_dropped` is the tail drops since the previous sample of the unit; a
    counter that went backwards (the queue was set up again) gives none. A
    sample is tagged with every burst of its unit whose actual window holds
    it: the same clock on both sides, so the join is exact.
    """
    rows = [{k: e[k] for k in ("arm", "seed", "t_ns", "interface", "backlog_packets",
                               "backlog_bytes", "limit_packets", "dropped")}
            for arm in queue for e in sorted(queue[arm], key=lambda e: (e["seed"], e["t_ns"]))]
    if not rows:
        return pd.DataFrame(columns=QUEUE.names())
    df = pd.DataFrame(rows)
    d = df.groupby(["arm", "seed"], sort=False)["dropped"].diff()
    df["d_dropped"] = d.where(d >= 0).astype("Int64")
    windows = [(b.arm, b.seed, b.actual_start_ns, b.actual_end_ns, b.id)
               for b in bursts.itertuples(index=False)
               if pd.notna(b.actual_start_ns) and pd.notna(b.actual_end_ns)] if len(bursts) else []
    df["burst_id"] = [";".join(i for a, sd, s, e, i in windows if (a, sd) == (arm, seed) and s <= t <= e)
                      for arm, seed, t in zip(df["arm"], df["seed"], df["t_ns"], strict=True)]
    return df[QUEUE.names()]
