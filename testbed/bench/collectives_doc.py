"""The `bench collectives` document: the size sweep, nccl-tests' bandwidths, a row and the text.

nccl-tests' conventions, so that a reader can line these numbers up with
theirs (nccl-tests' doc/PERFORMANCE.md): a collective's size ``S`` is the
bytes of the whole array (all_reduce: the tensor; all_gather: the output,
every rank's input concatenated; reduce_scatter: the input, every rank's
shard concatenated), its count the elements of that array (float32 here);
``algbw = S / t`` and ``busbw = algbw x`` the collective's factor,
``2(n-1)/n`` for all_reduce and ``(n-1)/n`` for all_gather and
reduce_scatter, which makes busbw comparable to the link's own rate
whatever the number of ranks: no algorithm can beat it, so a busbw above
the link's (``link_GBps``) would be a measuring error. The sweep is
nccl-tests' ``-b``/``-e``/``-f``: sizes from ``begin`` multiplied by
``factor`` while at most ``end``, written as bytes with K, M or G
(1024-based) as theirs are.

A row is one transport (DBLP at one bound, or gloo) running one collective
at one size under one loss; its time is the median over repetitions of the
mean over the ranks of each rank's time in the call (nccl-tests' default
``-a 1`` averages over ranks too), and ``wrong`` counts the output elements
(summed over ranks) that differ from the exact result, as nccl-tests'
``#wrong`` does: a bounded DBLP row may deliver a round with chunks missing,
which its missing-chunk policy fills with zeros.
"""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Callable
from typing import Any

#: Ranks of every row: the two namespaces of the veth pair (`testbed.emulation.netns.NetnsPair`).
WORLD_SIZE = 2
#: Bytes of one element: every collective runs on float32, nccl-tests' "float".
ELEMENT_BYTES = 4
DTYPE = "float"
#: Version of the document (`bench_doc`); a reader refuses another.
SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class Collective:
    """A collective the bench runs: its name in torch.distributed, its reduction, its bus factor."""

    name: str
    redop: str  # as nccl-tests prints it: "sum", or "none" for a collective without one
    bus_factor: Callable[[int], float]  # n ranks -> busbw / algbw (nccl-tests' correction)
    scatters: bool = False  # each rank's output is its 1/n of the array, not all of it

    def outputs(self, size: int, world: int) -> int:
        """Output elements over every rank: what ``wrong`` counts among."""
        return count(size) * (1 if self.scatters else world)


#: The collectives by name, in the order the bench runs them.
COLLECTIVES: dict[str, Collective] = {
    c.name: c for c in (
        Collective("all_reduce", "sum", lambda n: 2 * (n - 1) / n),
        Collective("all_gather", "none", lambda n: (n - 1) / n),
        Collective("reduce_scatter", "sum", lambda n: (n - 1) / n, scatters=True),
    )}


@dataclasses.dataclass(frozen=True)
class Transport:
    """What carries a row's collectives: DBLP's torch backend at one loss bound, or gloo."""

    impl: str  # "dblp" | "gloo"
    bound: float = 0.0  # dblp: the static loss bound; 0 runs the reliable policy
    auth: bool = False  # dblp: the job has a secret (every message carries a MAC)

    @property
    def policy(self) -> str:
        return "reliable" if self.bound == 0 else "static"

    @property
    def label(self) -> str:
        if self.impl == "gloo":
            return "gloo"
        text = "dblp reliable" if self.bound == 0 else f"dblp P={100 * self.bound:g}%"
        return text + (" auth" if self.auth else "")


def transports(bounds=(0.0,), gloo: bool = True, auth: bool = False) -> list[Transport]:
    """One DBLP transport per bound, then gloo: the rows of every point of the sweep."""
    return [Transport("dblp", b, auth) for b in bounds] + ([Transport("gloo")] if gloo else [])


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.I)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of ``text`` as nccl-tests' ``-b``/``-e`` read it: ``8``, ``256K``, ``1M``, ``2G``.

    K, M and G are 1024-based (``1M`` = 1048576), and ``KiB``/``MB`` spellings
    read alike; anything else is a ValueError naming the text.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with K, M or G "
                         "(1024-based), e.g. 1M")
    return int(m[1]) * _UNITS[m[2].lower()]


def sweep(begin: int, end: int, factor: int, world: int = WORLD_SIZE) -> list[int]:
    """nccl-tests' ``-b begin -e end -f factor``: begin, begin x factor, ... while at most end.

    Every size must split into whole float32 elements per rank (a multiple of
    ``4 x world`` bytes), so all_gather and reduce_scatter run on the very
    array all_reduce does; nccl-tests rounds such a size down, this refuses it.
    """
    unit = ELEMENT_BYTES * world
    if begin < unit or begin % unit:
        raise ValueError(f"the first size, {begin} B, is not a multiple of {unit} B "
                         f"(a float32 element per rank, {world} ranks)")
    if end < begin:
        raise ValueError(f"the last size, {end} B, is below the first, {begin} B")
    if factor < 2:
        raise ValueError(f"the factor must be at least 2, got {factor}")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        size *= factor
    return sizes


def count(size: int) -> int:
    """Elements of a ``size``-byte float32 array: nccl-tests' count column."""
    return size // ELEMENT_BYTES


def algbw(size: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth in GB/s (10^9 bytes): the array's bytes over the time."""
    return size / seconds / 1e9


def busbw(collective: str, size: int, seconds: float, world: int = WORLD_SIZE) -> float:
    """nccl-tests' bus bandwidth in GB/s: algbw times the collective's factor for ``world`` ranks."""
    return algbw(size, seconds) * COLLECTIVES[collective].bus_factor(world)


def ideal_sent(collective: str, size: int, world: int = WORLD_SIZE) -> float:
    """Bytes each rank sends in the best algorithm (a ring): busbw's factor times the array.

    A DBLP row's ``wire_factor`` is its ranks' payload bytes over this: what its
    algorithm moves beyond the least any algorithm can.
    """
    return COLLECTIVES[collective].bus_factor(world) * size


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def bench_row(t: Transport, collective: str, size: int, loss: float, reps: list[list[dict]],
              timeouts: int, errors: list[str], round_timeout: float,
              world: int = WORLD_SIZE) -> dict:
    """One row's figures from its repetitions: ``reps`` holds each good repetition's per-rank
    stats (``latency_s``, ``wrong``; DBLP's ``bytes_sent`` and ``passes``), ``timeouts``
    the repetitions that failed or missed the deadline, which count as infinitely slow."""
    outputs = COLLECTIVES[collective].outputs(size, world)
    wrong = _median([sum(s["wrong"] for s in rep) for rep in reps])
    times = sorted([statistics.fmean(s["latency_s"] for s in rep) for rep in reps]
                   + [math.inf] * timeouts)
    median = statistics.median(times) if times else math.inf
    t_s = None if math.isinf(median) else median
    row: dict[str, Any] = {"collective": collective, "transport": t.label, "impl": t.impl,
           "policy": t.policy if t.impl == "dblp" else None,
           "bound": t.bound if t.impl == "dblp" else None,
           "auth": t.auth, "loss": loss, "size": size, "count": count(size), "type": DTYPE,
           "redop": COLLECTIVES[collective].redop,
           "time_us": None if t_s is None else t_s * 1e6,
           "algbw_GBps": None if t_s is None else algbw(size, t_s),
           "busbw_GBps": None if t_s is None else busbw(collective, size, t_s, world),
           "wrong": wrong, "outputs": outputs,
           "wrong_frac": None if wrong is None else wrong / outputs,
           "spread_us": ([times[0] * 1e6, None if math.isinf(times[-1]) else times[-1] * 1e6]
                         if times and not math.isinf(times[0]) else None),
           "reps": len(reps), "timeouts": timeouts, "round_timeout_s": round_timeout,
           # DBLP's all_gather travels exact streams (bound 0): its bound does not apply
           "exact": t.impl == "dblp" and collective == "all_gather"}
    if t.impl == "dblp" and reps:
        sent = _median([statistics.fmean(s["bytes_sent"] for s in rep) for rep in reps])
        row["sent_bytes"] = sent
        row["wire_factor"] = None if sent is None else sent / ideal_sent(collective, size, world)
        row["passes"] = _median([max(s["passes"] for s in rep) for rep in reps])
    if errors:
        row["errors"] = sorted({e[:300] for e in errors})
    return row


#: How a row's time is taken, as the document states it.
TIME = ("median over the repetitions of the mean over the ranks of each rank's time in the "
        "call (warm-up calls untimed, on a loss-free link)")
#: Which mode DBLP runs in, as the document states it.
DBLP_MODE = ("sharded: dblp.torch_backend, every rank aggregating 1/n of each tensor; "
             "all_gather exact over reliable streams (16-bit words in float32), reduce_scatter "
             "an all_reduce of the whole input of which each rank keeps its shard")
#: How the rows' repetitions were ordered (`testbed.bench.collectives.run_bench`).
ORDER = ("interleaved: at each loss, size and collective, repetition k of every transport "
         "before repetition k+1 of any")


def bench_doc(sizes: list[int], factor: int, collectives, transports_, losses, reps: int,
              warmup: int, rate_bps: float, rows: list[dict], loss_applies_to: str,
              offloads: str) -> dict:
    """The bench's JSON document around ``rows`` (all of them, or those a failed bench finished)."""
    return {"schema": SCHEMA, "world_size": WORLD_SIZE, "rate_bps": rate_bps,
            "link_GBps": rate_bps / 8 / 1e9, "sizes": list(sizes), "factor": factor,
            "collectives": list(collectives), "transports": [t.label for t in transports_],
            "losses": list(losses), "reps": reps, "warmup": warmup, "time": TIME,
            "dblp_mode": DBLP_MODE, "order": ORDER, "loss_applies_to": loss_applies_to,
            "offloads": offloads, "rows": rows}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


#: nccl-tests' columns (their header's two lines), without their in-place half.
COLUMNS = (f"{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>11} {'algbw':>8} "
           f"{'busbw':>8} {'#wrong':>8}",
           f"{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>11} {'(GB/s)':>8} "
           f"{'(GB/s)':>8} {'':>8}")
_WHO = f"{'collective':14} {'transport':18} {'loss':>5} "
#: The streamed rows' header: which collective, transport and loss, then nccl-tests' columns.
HEADER = "# " + _WHO + COLUMNS[0] + "\n# " + " " * len(_WHO) + COLUMNS[1]


def columns(r: dict) -> str:
    """A row in nccl-tests' columns; a row past its deadline shows it instead of a time."""
    time = (f"> {r['round_timeout_s']:g} s" if r["time_us"] is None
            else format(r["time_us"], ".1f"))
    return (f"{r['size']:>12d} {r['count']:>12d} {r['type']:>6} {r['redop']:>6} {time:>11} "
            f"{_fmt(r['algbw_GBps'], '8.4f'):>8} {_fmt(r['busbw_GBps'], '8.4f'):>8} "
            f"{_fmt(r['wrong'], '8.0f'):>8}")


def format_row(r: dict) -> str:
    """A row as the bench streams it: collective, transport and loss, then nccl-tests' columns."""
    loss = f"{100 * r['loss']:g}%"
    s = f"  {r['collective']:14} {r['transport']:18} {loss:>5} " + columns(r)
    if r.get("timeouts"):
        s += (f"  ({r['timeouts']} of {r['reps'] + r['timeouts']} failed or missed the "
              f"{r['round_timeout_s']:g} s deadline)")
    return s


def format_table(doc: dict) -> str:
    """The document as nccl-tests prints a run: one block per collective, transport and loss."""
    lines = [f"# {doc['world_size']} ranks on a {doc['rate_bps'] / 1e6:g} Mbit/s veth pair "
             f"(busbw's ceiling {doc['link_GBps']:.4f} GB/s); time: {doc['time']}, "
             f"{doc['reps']} repetitions; #wrong: output elements that differ from the exact "
             f"result, summed over the ranks; DBLP mode: {doc['dblp_mode']}"]
    blocks: dict[tuple, list[dict]] = {}
    for r in doc["rows"]:
        blocks.setdefault((r["collective"], r["transport"], r["loss"]), []).append(r)
    for (collective, transport, loss), rows in blocks.items():
        lines += ["#", f"# {collective} over {transport}, loss {100 * loss:g} %",
                  "# " + COLUMNS[0], "# " + COLUMNS[1]]
        lines += ["  " + columns(r) for r in sorted(rows, key=lambda r: r["size"])]
    return "\n".join(lines)


def row_order(doc_collectives, doc_transports) -> Callable[[dict], tuple]:
    """The finished document's row order: collective, transport, loss, size (nccl-tests' blocks)."""
    cs, ts = list(doc_collectives), list(doc_transports)
    return lambda r: (cs.index(r["collective"]), ts.index(r["transport"]), r["loss"], r["size"])
