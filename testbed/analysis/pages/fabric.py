"""The tables of the fabric's command references: fat-tree sizes, TCP goodput, and bursts.

Each renders the JSON a command wrote with ``--json FILE`` (`net check`
per fabric size or per shaping rate, `bench bursts`), one file per run of
the command, so a page shows what the emulator itself can carry and do
before any transport is judged on it.
"""
from __future__ import annotations

import pathlib

from testbed.analysis.pages.cells import num
from testbed.analysis.pages.files import read_json, read_jsons
from testbed.analysis.pages.registry import register


def _core(doc: dict) -> str:
    return f"{doc['core_switches_used']}/{doc['core_switches']}"


def fat_trees_table(ref_dir: pathlib.Path) -> str:
    """`net check --k K`: one column per fat-tree size (its own JSON file)."""
    docs = sorted(read_jsons(ref_dir, "net-check-k*.json"), key=lambda d: d["hosts"])
    flows = docs[0].get("core_flows")
    spread = f"core switches used by {flows} UDP flows" if flows else "core switches used by UDP flows"
    lines = [("process start to routed", lambda d: f"{d['startup_s']:.1f} s"),
             ("switches, hosts", lambda d: f"{d['switches']}, {d['hosts']}"),
             ("host pairs reachable (first, cold probe)",
              lambda d: f"{d['pairs_ok']}/{d['pairs']} ({d['pairs_ok_cold']})"),
             (spread, _core),
             ("one cross-pod TCP flow", lambda d: num(d.get("tcp_goodput_mbps"), "{:.1f} Mbit/s")
              + f" of {d['shaped_mbps']:g}"),
             ("datapath", lambda d: str(d.get("datapath")))]
    out = ["| | " + " | ".join(d["topology"] for d in docs) + " |",
           "|---" * (len(docs) + 1) + "|"]
    out += [f"| {label} | " + " | ".join(cell(d) for d in docs) + " |" for label, cell in lines]
    return "\n".join(out) + "\n"


def goodput_table(ref_dir: pathlib.Path) -> str:
    """`net check --bw B --flows F`: TCP goodput per shaping rate, one flow and several at once."""
    docs = read_jsons(ref_dir, "net-check-bw*.json")
    by = {(d["shaped_mbps"], len(d.get("tcp_flows") or [])): d for d in docs}
    many = max(f for _, f in by)
    rates = sorted({b for b, _ in by})

    def each(d):
        if d is None:
            return "–"
        f = d["tcp_flows"]
        return f"{d['tcp_goodput_mbps']:.1f} ({min(f):.1f}-{max(f):.1f})"

    out = [f"| shaping Mbit/s | 1 flow | {many} flows, each (range) | {many} flows, total |",
           "|---|---|---|---|"]
    for b in rates:
        one, m = by.get((b, 1)), by.get((b, many))
        out.append(f"| {b:g} | {num(one and one['tcp_goodput_mbps'], '{:.1f}')} | {each(m)} "
                   f"| {num(m and m['tcp_goodput_total_mbps'], '{:.0f}')} |")
    top = max(docs, key=lambda d: d["tcp_goodput_total_mbps"])
    return ("\n".join(out) + f"\n\nThe most the emulator carried in total: "
            f"{top['tcp_goodput_total_mbps']:.0f} Mbit/s ({len(top['tcp_flows'])} flows at "
            f"{top['shaped_mbps']:g} Mbit/s per link).\n")


def _ms(x) -> str:
    return num(x, "{:.1f} ms")


def _burst_row(r: dict) -> str:
    from controllers.bursts import HIT_COVER

    if r["kind"] == "loss-round-trigger":
        return (f"| round-triggered | starts in its round, covers >= {100 * HIT_COVER:.0f} % of it "
                f"| {r['hits']}/{r['tries']} | | {_ms(r['start_lag_ms'])} | |")
    params = r.get("params", {})
    if r["kind"] == "loss":
        label, asked = f"loss p={params['p']:g}", f"{r['requested']:.3f}"
    elif r["kind"] == "police":
        offered = params["rate_mbps"] / (1 - r["requested"])
        label = f"police {params['rate_mbps']:g} Mbit/s on {offered:.1f} Mbit/s"
        asked = f"{r['requested']:.3f} (1 - rate/offered)"
    elif r["kind"] == "congest":
        label = f"congest, {params['rate_mbps']:g} Mbit/s cross traffic"
        asked = f"{r['requested']:.3f} ({r.get('requested_basis', 'estimate')})"
    else:
        label, asked = r["kind"], num(r.get("requested"), "{:.3f}")
    return (f"| {label} | {asked} | {num(r['measured_in_window'], '{:.3f}')} "
            f"| {num(r.get('measured_outside'), '{:.3f}')} | {_ms(r['start_lag_ms'])} "
            f"| {_ms(r.get('mechanism_lag_ms'))} |")


def bursts_table(ref_dir: pathlib.Path) -> str:
    """`bench bursts`: requested against measured loss, and start lags, per burst kind."""
    doc = read_json(ref_dir / "bench-bursts.json")
    windows = sorted({r["duration_ms"] for r in doc["rows"] if "duration_ms" in r})
    out = [f"{doc['topology']}, {doc['bw_mbps']:g} Mbit/s links, {doc['queue_pkts']}-packet "
           f"queues, {' / '.join(f'{w:g}' for w in windows)} ms windows:", "",
           "| kind | requested | measured in window | outside | start lag | of which the mechanism |",
           "|---|---|---|---|---|---|"]
    out += [_burst_row(r) for r in doc["rows"]]
    return "\n".join(out) + "\n"


register("fat-trees", fat_trees_table)
register("goodput", goodput_table)
register("bursts", bursts_table)
