"""The table of a `bench collectives` reference: nccl-tests' bus bandwidth per collective and size.

The bench (`testbed.bench.collectives`) sweeps sizes as nccl-tests does and
keeps nccl-tests' figures per row (time, algbw, busbw, #wrong), so that a
reader who knows those tables can line DBLP and gloo up against them. This
module reads its document only (the bench sits a floor above the analysis),
and every sentence after the table is read from the rows: how near each
transport came to the link at the largest size, how many bytes DBLP's
algorithms put on the wire beside a ring's, which rows delivered wrong
elements, and which missed their deadline.
"""
from __future__ import annotations

import pathlib
import statistics

from testbed.analysis.pages.cells import pct
from testbed.analysis.pages.files import read_json
from testbed.analysis.pages.registry import register
from testbed.cpustat import STEAL_FLAG
from testbed.errors import InputError

#: The document's version this page reads (`testbed.bench.collectives_doc.SCHEMA`).
SCHEMA = 1
#: The file a `bench collectives` reference keeps.
FILE = "bench-collectives.json"


def _size(size: int) -> str:
    """Bytes as nccl-tests' -b/-e write them: 256K, 1M, 2G (1024-based)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def cell(row: dict | None) -> str:
    """A row's busbw in GB/s and its time; its missed deadline; a dash where it did not run."""
    if row is None:
        return "–"
    if row.get("time_us") is None:
        return f"> {row['round_timeout_s']:g} s"
    return f"{row['busbw_GBps']:.3f} ({row['time_us'] / 1e3:.1f} ms)"


def _read(ref_dir: pathlib.Path) -> dict:
    doc = read_json(ref_dir / FILE)
    if doc.get("schema") != SCHEMA:
        raise InputError(f"{ref_dir / FILE}: schema {doc.get('schema')!r}, this page reads "
                         f"{SCHEMA}; run `dblp-testbed reproduce {ref_dir.name}`")
    return doc


def _where(doc: dict) -> dict[tuple, dict]:
    return {(r["collective"], r["transport"], r["loss"], r["size"]): r for r in doc["rows"]}


def _table(doc: dict, rows: dict[tuple, dict]) -> list[str]:
    cols = [(t, x) for x in doc["losses"] for t in doc["transports"]]
    head = ["collective", "size"] + [f"{t}, {pct(x)}" for t, x in cols]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in doc["collectives"]:
        for s in doc["sizes"]:
            cells = [cell(rows.get((c, t, x, s))) for t, x in cols]
            out.append(f"| {c} | {_size(s)} | " + " | ".join(cells) + " |")
    return out


def _method(doc: dict) -> str:
    sizes = doc["sizes"]
    return (f"`bench collectives` on a {doc['rate_bps'] / 1e9:g} Gbit/s veth pair, "
            f"{doc['world_size']} ranks, arrays of {_size(sizes[0])} to {_size(sizes[-1])} "
            f"(x{doc['factor']}); a cell is nccl-tests' bus bandwidth in GB/s, which no "
            f"algorithm can raise above the link's {doc['link_GBps']:.3f} GB/s, and the time: "
            f"the {doc['time']}, {doc['reps']} repetitions, {doc['warmup']} warm-up call(s). "
            f"DBLP runs its torch backend's sharded mode. ")


def _at_largest(doc: dict, rows: dict[tuple, dict]) -> str:
    """Each transport's busbw as a share of the link at the largest size, per collective."""
    top, parts = doc["sizes"][-1], []
    for c in doc["collectives"]:
        for x in doc["losses"]:
            shares = [f"{t} {pct(r['busbw_GBps'] / doc['link_GBps'])}"
                      for t in doc["transports"]
                      if (r := rows.get((c, t, x, top))) and r.get("busbw_GBps") is not None]
            if shares:
                parts.append(f"{c} at {pct(x)} loss: {', '.join(shares)}")
    return (f"At {_size(top)}, busbw as a share of the link: {'; '.join(parts)}. "
            if parts else "")


def _wire(doc: dict) -> str:
    """DBLP's payload bytes per rank over a ring's, per collective (range over its rows)."""
    parts = []
    for c in doc["collectives"]:
        xs = [r["wire_factor"] for r in doc["rows"] if r["collective"] == c
              and r.get("wire_factor") is not None]
        if xs:
            lo, hi = f"{min(xs):.2f}", f"{max(xs):.2f}"
            parts.append(f"{c} {lo if lo == hi else f'{lo}-{hi}'}x")
    if not parts:
        return ""
    return ("DBLP's payload bytes per rank over the least a ring sends (the bus factor times "
            f"the array), over its rows: {', '.join(parts)}. ")


def _wrong(doc: dict) -> str:
    """Which rows delivered wrong elements (a bounded round's zero-filled chunks), and how many."""
    bad = [r for r in doc["rows"] if r.get("wrong")]
    if not bad:
        return "Every row's output was exact in every repetition (#wrong 0). "
    by: dict[tuple, list[float]] = {}
    for r in bad:
        by.setdefault((r["transport"], r["collective"]), []).append(r["wrong_frac"])
    parts = [f"{t} {c} {_pct_range(v)} of the output elements ({len(v)} "
             f"row{'s' if len(v) > 1 else ''})" for (t, c), v in by.items()]
    exact = len([r for r in doc["rows"] if r.get("wrong") == 0])
    return (f"Rows with wrong elements (the median over repetitions, summed over the ranks): "
            f"{'; '.join(parts)}; the other {exact} rows were exact. ")


def _pct_range(v: list[float]) -> str:
    """``12.3-45.6 %``, or one percentage where both ends read alike."""
    lo, hi = pct(min(v)), pct(max(v))
    return lo if lo == hi else f"{lo.removesuffix(' %')}-{hi}"


def _late(doc: dict) -> str:
    late = [f"{r['transport']} {r['collective']} {_size(r['size'])} at {pct(r['loss'])}"
            for r in doc["rows"] if r.get("time_us") is None]
    deadline = doc["rows"][0]["round_timeout_s"] if doc["rows"] else 0
    return (f"Missed the {deadline:g} s deadline: {', '.join(late)}. " if late
            else f"No row missed its {deadline:g} s deadline. ")


def _steal(doc: dict) -> str:
    steals = [r["cpu_steal_frac"] for r in doc["rows"] if r.get("cpu_steal_frac") is not None]
    if not steals:
        return ""
    flagged = sum(s >= STEAL_FLAG for s in steals)
    return (f"CPU steal over the rows: median {pct(statistics.median(steals))}, highest "
            f"{pct(max(steals))}; {flagged} of {len(steals)} rows ran with {pct(STEAL_FLAG)} or "
            f"more, whose time a neighbour may have set.")


def collectives_table(ref_dir: pathlib.Path) -> str:
    """`bench collectives`: one row per collective and size, one column per transport and loss.

    Each cell is nccl-tests' busbw in GB/s and the median time in ms (a missed
    deadline shows as "> N s"). After the table: the method, each transport's
    share of the link at the largest size, DBLP's bytes beside a ring's, the
    rows whose outputs had wrong elements, missed deadlines and CPU steal.
    """
    doc = _read(ref_dir)
    rows = _where(doc)
    text = "\n".join(_table(doc, rows)) + "\n\n"
    text += _method(doc) + _at_largest(doc, rows) + _wire(doc) + _wrong(doc) + _late(doc)
    text += _steal(doc)
    return text.rstrip() + "\n"


register("collectives", collectives_table)
