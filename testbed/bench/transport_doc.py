"""The `bench transport` document: which rows it has, the figures of a row, and the text table.

A row is one ``Config`` (a transport, its bound, control path, mode and
whether the job has a secret) at one loss; ``bench_row`` turns its round trips
into the figures the JSON document keeps (median round trip, the physical
bound ``bound_s``, passes against the ideal, CPU per GB); ``bench_doc``
declares the document around the rows and ``format_table`` prints it.
The ideal passes are `testbed.physics.passes`, the same formula the
run's bounds use.

A DBLP row runs with this transport's costs ("ours") or with the authors'
prototype's (``costs = "prototype"``): the prototype-mode settings of
``dblp.TransportConfig`` as the first step of the README's cost table
(`testbed.references.PROTOTYPE_COSTS`) has them, read from that step's
preset and overrides by `prototype_costs`, so the bench and the fabric run
the same costs and no value is typed twice.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

from testbed.physics import passes

#: The two agents of a row by namespace: a = PS worker / sharded rank 0 / gloo rank 0,
#: b = aggregator / sharded rank 1 / gloo rank 1. Each sends and receives the gradient
#: once per round trip (push + pull, or the two halves of a ring all-reduce each way),
#: so each moves ``2 x bytes`` of payload: the denominator of ``cpu_s_per_gb_*``.
SIDES = ("worker", "server")


@dataclasses.dataclass(frozen=True)
class Config:
    impl: str  # "dblp" | "gloo"
    policy: str  # reliable | static
    bound: float
    control: str  # udp | tcp
    mode: str = "ps"  # dblp: "ps" (worker + aggregator) or "sharded" (two peers)
    auth: bool = False  # dblp: the job has a secret (every message carries a MAC)
    costs: str = "ours"  # dblp: this transport's costs, or the prototype's (`COSTS`)

    @property
    def label(self) -> str:
        if self.impl == "gloo":
            return "gloo all_reduce"
        return (f"{self.policy} P={self.bound:.1%} {self.control} {self.mode}"
                + (" auth" if self.auth else "")
                + (" prototype costs" if self.costs == "prototype" else ""))


#: What a DBLP row's passes cost: this transport's own settings, or the prototype's.
COSTS = ("ours", "prototype")

#: The prototype-mode settings of ``dblp.TransportConfig`` (its class docstring): the
#: six the `paper-prototype` preset sets beyond `paper`'s transport.
PROTOTYPE_MODE = ("chunk_bytes", "chunk_order", "probe_wait", "nagle", "bucket_s",
                  "no_progress_probes")


def prototype_costs() -> dict:
    """The prototype's costs as the first step of the cost table runs them on the fabric.

    Returns ``{"reference", "adds", "settings"}``: the step's run reference,
    what the step says it adds, and the ``dblp.TransportConfig`` settings
    (of `PROTOTYPE_MODE`) that differ from the transport's own, resolved from
    the reference's preset and its ``--set`` overrides through the spec's one
    mapping to transport settings (`testbed.config.spec.transport_config`).
    Why the first step: it is the one that keeps this transport's sender and
    chunks (its later steps add the 100 ms bucket, the no-progress rule and
    8 KB chunks), so a bench row differs from its "ours" twin by the costs of
    a pass alone (fixed chunk order, the 1 s probe wait, Nagle on TCP control).
    """
    from dblp.config import default_of
    from testbed.config import spec as specmod
    from testbed.config.arms import ARMS
    from testbed.config.presets import PRESETS
    from testbed.references import PROTOTYPE_COSTS, REFERENCES, RunReference

    step = PROTOTYPE_COSTS[0]
    ref = REFERENCES[step.reference]
    if not isinstance(ref, RunReference):
        raise TypeError(f"the cost table's first step {step.reference!r} is no run reference")
    transport = specmod.load(None, PRESETS[ref.preset], list(ref.overrides))["transport"]
    # The bound the arm brings is the bench row's own; only the prototype-mode settings count.
    cfg = specmod.transport_config(transport, ARMS["static"])
    settings = {name: getattr(cfg, name) for name in PROTOTYPE_MODE
                if getattr(cfg, name) != default_of(name)}
    return {"reference": step.reference, "adds": step.adds, "settings": settings}


def default_configs(bounds=(0.0, 0.008, 0.408), controls=("udp", "tcp"), gloo=True,
                    sharded=True, auth=(False, True), costs=("ours",)):
    """Every bound x control (and sharded UDP), once per ``auth`` and ``costs`` setting, side
    by side (gloo's row has no costs of ours to change)."""
    cfgs = []
    for control in controls:
        for b in bounds:
            for a in auth:
                for c in costs:
                    cfgs.append(Config("dblp", "reliable" if b == 0 else "static", b, control,
                                       auth=a, costs=c))
    if sharded:  # like gloo: both hosts send at once (UDP control; TCP is PS-only)
        for b in bounds:
            for a in auth:
                for c in costs:
                    cfgs.append(Config("dblp", "reliable" if b == 0 else "static", b, "udp",
                                       "sharded", auth=a, costs=c))
    if gloo:
        cfgs.append(Config("gloo", "reliable", 0.0, "tcp"))
    return cfgs


def reliable_target(chunks: int) -> float:
    """The missing fraction a reliable round (bound 0) stops at: under half a chunk of ``chunks``.

    Under Bernoulli loss a reliable transport needs infinitely many passes in
    the limit; a round of ``chunks`` chunks ends when none is missing, which
    the ideal pass count reaches once fewer than half a chunk is expected to be.
    """
    return 0.5 / chunks


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


#: The veths' offloads as a bench document states them (``NetnsPair._set_offloads``).
_GRO_ROWS = "; GRO on in loss-free rows (row 'gro')"
OFFLOADS = "TX checksum on, every segmentation offload off (TSO, GSO, UDP)" + _GRO_ROWS
OFFLOADS_SOFTWARE = "TX checksum and every segmentation offload off (the kernel did not keep " \
    "checksum offload on with UDP segmentation off)" + _GRO_ROWS

#: How the rows' round trips were ordered (``run_bench``); documents without it ran each row whole.
ORDER = "interleaved: repetition k of every row of a loss before repetition k+1 of any"


#: What "loss p" takes, per ``--loss-on`` (``controllers.traffic.TRAFFIC``).
LOSS_APPLIES_TO = {
    "all": "every UDP and TCP packet, both directions (nftables numgen)",
    "data": "the transport's DATA datagrams only, both directions (nftables numgen); "
            "its control path and gloo's TCP meet no loss",
    "control": "the transport's control path only (its non-DATA datagrams and every TCP "
               "packet, gloo's included), both directions (nftables numgen)",
}


def bench_doc(losses, reps: int, numel: int, rate_bps: float, rows: list[dict],
              traffic: str = "all", prototype: dict | None = None) -> dict:
    """The bench's JSON document around ``rows`` (all of them, or those a failed bench finished).

    ``prototype`` (`prototype_costs`), where any row ran with the prototype's
    costs: which step of the cost table they are and the settings they ran with.
    """
    from dblp.wire import CHUNK_ELEMS
    nbytes = numel * 4
    doc = {"floor_s": nbytes * 8 / rate_bps, "bytes": nbytes, "rate_bps": rate_bps,
           "chunks": -(-numel // CHUNK_ELEMS), "reps": reps, "losses": list(losses),
           "rows": rows, "loss_on": traffic, "loss_applies_to": LOSS_APPLIES_TO[traffic],
           "offloads": OFFLOADS, "order": ORDER}
    if prototype is not None:
        doc["prototype_costs"] = prototype
    return doc


def _cpu_per_gb(cpu: dict[str, list[float]] | None, moved_bytes: int | None) -> dict:
    """Median CPU seconds per GB of payload each side moved (sent + received), by side.

    Why per GB: CPU per round grows with the gradient, CPU per byte is what says whether
    a data path can keep up with a faster link on this machine.
    """
    out = {}
    for side in SIDES:
        xs = (cpu or {}).get(side) or []
        out[f"cpu_s_per_gb_{side}"] = (statistics.median(xs) / (moved_bytes / 1e9)
                                       if xs and moved_bytes else None)
    return out


def bench_row(cfg: Config, loss: float, stats: list[dict], errors: list[str], timeouts: int,
         floor_s: float, chunks: int, reps: int, round_timeout: float, *,
         cpu: dict[str, list[float]] | None = None, moved_bytes: int | None = None) -> dict:
    p = loss
    if cfg.impl == "gloo":
        need = 1.0 / (1 - p)  # 2-rank ring: each rank sends the tensor once, both ways at once
    elif cfg.mode == "sharded":
        need = (1 - cfg.bound) / (1 - p)  # each direction: half pushed + half pulled
    else:
        need = 2 * (1 - cfg.bound) / (1 - p)  # push + pull, same bound on both
    if cfg.impl == "gloo":
        made = ideal = None
    else:
        made = _median([max(s["passes_push"], s["passes_pull"]) for s in stats])
        ideal = int(passes(cfg.bound or reliable_target(chunks), p))
    lat = sorted([s["latency_s"] for s in stats] + [math.inf] * timeouts)
    rt = statistics.median(lat) if lat else math.inf
    rt = None if math.isinf(rt) else rt
    bound_s = floor_s * need
    row = {"impl": cfg.impl, "policy": cfg.policy, "bound": cfg.bound, "control": cfg.control,
           "mode": cfg.mode if cfg.impl == "dblp" else "allreduce", "auth": cfg.auth,
           "costs": cfg.costs if cfg.impl == "dblp" else None,
           "loss": loss, "round_trip_s": rt, "bound_s": bound_s,
           "ratio": (rt / bound_s) if rt else None, "passes": made, "ideal_passes": ideal,
           "reps": len(stats), "timeouts": timeouts, "round_timeout_s": round_timeout,
           "spread_s": [lat[0], lat[-1]] if lat and not math.isinf(lat[0]) else None,
           **_cpu_per_gb(cpu, moved_bytes)}
    if row["spread_s"] and math.isinf(row["spread_s"][1]):
        row["spread_s"][1] = None
    if cfg.impl == "dblp" and stats:
        row["passes_push"] = _median([s["passes_push"] for s in stats])
        row["passes_pull"] = _median([s["passes_pull"] for s in stats])
        row["probe_rounds"] = _median([s["probe_rounds"] for s in stats])
        row["missing_at_stop"] = _median([s["missing_at_stop"] for s in stats])
        row["pull_missing"] = _median([s["pull_missing"] for s in stats])
        row["rtt_ms"] = _median([(s["rtt_s"] or 0) * 1e3 for s in stats])
    if errors:
        row["errors"] = sorted(set(e[:300] for e in errors))
    return row


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


HEADER = (f"{'impl':7} {'policy':8} {'bound':>6} {'ctrl':4} {'auth':4} {'loss':>5} "
          f"{'round_trip_s':>12} {'bound_s':>8} {'ratio':>6} {'passes':>6} {'ideal':>5} "
          f"{'cpu_s/GB w':>10} {'cpu_s/GB s':>10} {'steal':>5}")


def format_row(r: dict) -> str:
    impl = r["impl"] + ("/sh" if r.get("mode") == "sharded" else "")
    auth = "yes" if r.get("auth") else "no"
    s = (f"{impl:7} {r['policy']:8} {r['bound']:6.1%} {r['control']:4} {auth:4} {r['loss']:5.0%} "
         f"{_fmt(r['round_trip_s'], '12.3f')} {r['bound_s']:8.3f} {_fmt(r['ratio'], '6.2f')} "
         f"{_fmt(r['passes'], '6.0f')} {_fmt(r['ideal_passes'], '5d')} "
         f"{_fmt(r.get('cpu_s_per_gb_worker'), '10.2f')} "
         f"{_fmt(r.get('cpu_s_per_gb_server'), '10.2f')} "
         f"{_fmt(r.get('cpu_steal_frac'), '5.1%')}")
    if r.get("costs") == "prototype":
        s += "  prototype costs"
    if r.get("tcp"):
        s += f"  tcp RTOs {r['tcp']['TcpExtTCPTimeouts']}"
    if r.get("timeouts"):
        s += (f"  ({r['timeouts']} of {r['reps'] + r['timeouts']} missed the "
              f"{r['round_timeout_s']:g} s deadline)")
    return s


def format_table(doc: dict) -> str:
    lines = [f"floor_s = {doc['floor_s']:.3f} s ({doc['bytes']} B at {doc['rate_bps'] / 1e6:g} "
             f"Mbit/s), medians of {doc['reps']} round trips; cpu_s/GB: CPU seconds per GB "
             "each side moved (w = worker / rank 0, s = aggregator / rank 1); steal: CPU "
             "time the hypervisor gave other guests during the row", HEADER]
    lines += [format_row(r) for r in doc["rows"]]
    lines += ["", "cost of authentication (round trip with a secret / without, same row):"]
    for r in doc["rows"]:
        twin = _auth_twin(doc, r)
        if r.get("auth") and twin and r["round_trip_s"] and twin["round_trip_s"]:
            tag = " (prototype costs)" if r.get("costs") == "prototype" else ""
            lines.append(f"  {r['policy']:8} {r['bound']:6.1%} {r['control']} {r['mode']:7} "
                         f"loss {r['loss']:4.0%}: {r['round_trip_s'] / twin['round_trip_s']:.3f}x"
                         + tag)
    lines += ["", "speedup of the 40.8 % bound over static 0.8 % (same control):"]
    # The rows without a secret where there are any (the auth section above compares them).
    auth = not any(r["impl"] == "dblp" and not r.get("auth") for r in doc["rows"])
    for costs in COSTS:
        tag = " (prototype costs)" if costs == "prototype" else ""
        for control in ("udp", "tcp"):
            for loss in doc["losses"]:
                a = _find(doc, "static", 0.008, control, loss, auth, costs)
                b = _find(doc, "static", 0.408, control, loss, auth, costs)
                if not (a and b and b["round_trip_s"]):
                    continue
                if a["round_trip_s"]:
                    lines.append(f"  {control} loss {loss:4.0%}: "
                                 f"{a['round_trip_s'] / b['round_trip_s']:.2f}x{tag}")
                else:
                    lines.append(f"  {control} loss {loss:4.0%}: > "
                                 f"{a['round_timeout_s'] / b['round_trip_s']:.1f}x (static 0.8 % "
                                 f"missed the deadline){tag}")
    return "\n".join(lines)


def _find(doc, policy, bound, control, loss, auth=False, costs="ours"):
    for r in doc["rows"]:
        if r["impl"] == "dblp" and r.get("mode", "ps") == "ps" and r["policy"] == policy \
                and abs(r["bound"] - bound) < 1e-9 and r.get("costs", "ours") == costs \
                and r["control"] == control and r["loss"] == loss and r.get("auth", False) == auth:
            return r
    return None


def _auth_twin(doc, row):
    """The row measured under the same conditions without authentication."""
    for r in doc["rows"]:
        if r is not row and r["impl"] == row["impl"] == "dblp" and not r.get("auth") \
                and r.get("costs", "ours") == row.get("costs", "ours") \
                and (r["policy"], r["bound"], r["control"], r["mode"], r["loss"]) == \
                (row["policy"], row["bound"], row["control"], row["mode"], row["loss"]):
            return r
    return None

