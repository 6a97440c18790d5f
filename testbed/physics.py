"""The physics of a bounded-loss round: the latency no transport with bound P can beat.

Why this exists: a speedup between two arms says nothing about whether either
arm is any good. With Bernoulli loss p at the bottleneck and loss bound P, a
round must deliver a fraction 1 - P of the bytes that cross the bottleneck, so
it transmits at least (1 - P)/(1 - p) times them, and sending in passes (send,
probe, resend the missing) it needs ceil(ln P / ln p) passes, each costing at
least one round-trip time of probing. The per-round bound is therefore

    bound_s = B_push * (1 - P)/(1 - p) * 8 / rate      (bytes through the burst)
            + B_pull * (1 - P) * 8 / rate              (the average going back,
                                                        not through the burst)
            + passes(P, p) * rtt                        (one probe per pass)

with B_push = flows x gradient bytes (every worker pushes through the server's
downlink in parameter-server mode) and B_pull the same bytes sent back on the
server's uplink. In sharded mode (no server; rank 0 sits where the server
would, and owns 1/N of the gradient) rank 0's downlink carries the other N-1
ranks' pushes of its shard and their averages of the N-1 shards it does not
own: B = 2 (N-1)/N x gradient bytes, all of it through the burst, and no
separate pull term. Gradient payload only: headers would only raise the floor,
so leaving them out keeps it a bound. A reliable transport (P = 0) needs
infinitely many passes under Bernoulli loss; it gets no bound (NaN).

A burst that covers only part of a round (a fixed-duration burst shorter
than the round, ``burst_s`` of it under loss) delivers (1 - p) x rate x
burst_s bits while it lasts and the line rate after it. If the round needs
more than that, its data take at least burst_s plus the rest at line rate,
and one clean pass after the burst is enough (one RTT); this also gives a
reliable transport (P = 0, gloo) a finite bound. If it needs less, the
whole-round formula above holds. The burst is taken to start with the round
(in the runs it starts 2-10 ms after the round's announcement, which makes
the bound a few milliseconds generous).

Bursts on the pull path (the server's uplink, `burst_on_pull`): in
parameter-server mode the push then crosses a clean link, and the pull,
which cannot start before the push ends, meets only what is left of a
fixed-duration burst by then (all of a round-locked one); the formula above
is applied to the pull with that remainder. Sharded mode and gloo's ring
send as much from rank 0 as they receive, so their bound is the same
either way.

Fragmented chunks (the prototype mode's ``transport.chunk_bytes`` = 8192):
the loss p above is per datagram, and a chunk of f IP fragments
(``dblp.wire.fragments``, 6 for 8 KB at a 1500-byte MTU) is lost when any
of its fragments is, so every formula takes the chunk loss 1 - (1 - p)^f
in place of p (``PhysicsInputs.chunk_loss``), for the bursts and the base
loss alike. `inputs_for_run` sets f from the spec only when every arm of
the run uses the dblp transport: gloo's TCP segments never fragment, and
the bound of a run is one for all its arms, so with a gloo arm f stays 1
(for the transport's arms that only loosens the bound, never breaks it).

The two speedup ratios below do not depend on p: DBLP's speedup over the
static bound sits between the bandwidth-bound ratio (1 - P_low)/(1 - P_high)
(big gradients, cheap probes) and the pass-bound ratio ln P_low / ln P_high
(per-pass overhead dominates).
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class PhysicsInputs:
    """What the bound needs about the network and the model.

    rate_bps: bottleneck line rate in bit/s (spec `topology.bw_mbps`, or
        `transport.rate_mbps` when the sender is paced below it).
    rtt_s: measured round-trip time between a worker and the server, seconds
        (manifest `rtt_ms`; the runner measures it).
    grad_bytes: gradient bytes one worker sends per round (the workers'
        `start` event, `grad_bytes`).
    flows: how many gradient copies cross the bottleneck per round
        (spec `placement.workers` for a burst on the server's downlink).
    base_loss: loss probability outside bursts (0 on a clean fabric).
    burst_loss: loss probability used for a burst when neither the burst's
        measured loss nor its requested `params.p` is known.
    include_pull: add the average's trip back (uplink, no burst) to the bound.
    burst_on_pull: the bursts act on the server's uplink (the pull path), not
        on its downlink: in parameter-server mode the push is clean and the
        burst meets the pull only for what is left of it when the push ends.
    fragments: IP fragments per data chunk (spec `transport.chunk_bytes`
        through ``dblp.wire.fragments``): a chunk is lost if any one is.
    """

    rate_bps: float
    rtt_s: float
    grad_bytes: float
    flows: int = 1
    base_loss: float = 0.0
    burst_loss: float | None = None
    include_pull: bool = True
    burst_on_pull: bool = False
    fragments: int = 1

    def __post_init__(self):
        for name in ("rate_bps", "grad_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"physics input '{name}' must be a positive number, got {v!r}")
        if not (isinstance(self.rtt_s, (int, float)) and math.isfinite(self.rtt_s)
                and self.rtt_s >= 0):
            raise ValueError(f"physics input 'rtt_s' must be >= 0 seconds, got {self.rtt_s!r}")
        for name in ("flows", "fragments"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"physics input '{name}' must be an integer >= 1, got {v!r}")
        for name in ("base_loss", "burst_loss"):
            v = getattr(self, name)
            if v is not None and not (0 <= v < 1):
                raise ValueError(f"physics input '{name}' must be a probability in [0, 1), got {v!r}")

    def chunk_loss(self, loss: float) -> float:
        """Loss of a whole chunk when each of its ``fragments`` datagrams is lost with ``loss``."""
        return 1.0 - (1.0 - loss) ** self.fragments

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PhysicsInputs:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"physics inputs: unknown field(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        return cls(**d)


def passes(bound: float, loss: float) -> float:
    """Ideal number of send/probe passes until at most `bound` is missing.

    After k passes a fraction loss**k is still missing; at least one pass
    always happens. NaN for a reliable transport (bound 0) under loss.
    """
    if not (0 <= bound < 1) or not (0 <= loss < 1):
        return math.nan
    if loss <= bound:
        return 1.0
    if bound == 0:
        return math.nan
    return float(max(1, math.ceil(math.log(bound) / math.log(loss) - 1e-12)))


def round_bound_s(bound: float, loss: float, inputs: PhysicsInputs, mode: str = "ps",
                  burst_s: float | None = None) -> float:
    """Lower bound on one round's communication time (see module docstring).

    ``mode``: "ps" (the workers push to a server: ``inputs.flows`` copies
    through the bottleneck, the average back on the other direction) or
    "sharded" (``inputs.flows`` ranks, each owning 1/flows of the gradient;
    also gloo's ring, whose rank 0 receives the same bytes). ``burst_s``:
    how long the loss lasted within the round (None: all of it).
    """
    if mode not in ("ps", "sharded"):
        raise ValueError(f"mode must be 'ps' or 'sharded', got {mode!r}")
    loss = inputs.chunk_loss(loss)
    base_loss = inputs.chunk_loss(inputs.base_loss)
    if mode == "sharded":
        bits = 2.0 * (inputs.flows - 1) / inputs.flows * inputs.grad_bytes * 8.0
        pull = 0.0
    else:
        bits = inputs.flows * inputs.grad_bytes * 8.0
        pull = bits * (1 - bound) / (1 - base_loss) / inputs.rate_bps if inputs.include_pull else 0.0
    need = bits * (1 - bound)
    if mode == "ps" and inputs.burst_on_pull and inputs.include_pull:
        return _pull_burst_bound_s(need, bound, loss, base_loss, inputs, burst_s)
    if burst_s is not None and need > (1 - loss) * inputs.rate_bps * burst_s:
        rest = need - (1 - loss) * inputs.rate_bps * burst_s
        return burst_s + rest / inputs.rate_bps + pull + inputs.rtt_s
    n = passes(bound, loss)
    if math.isnan(n):
        return math.nan
    return need / (1 - loss) / inputs.rate_bps + pull + n * inputs.rtt_s


def _pull_burst_bound_s(need: float, bound: float, loss: float, base_loss: float,
                        inputs: PhysicsInputs, burst_s: float | None) -> float:
    """The bound when the burst sits on the pull path (the server's uplink), parameter server.

    The push crosses a clean downlink; the pull cannot start before it ends,
    and meets only the part of the burst still left then (all of it for a
    burst as long as the round). Otherwise the formula is the push one's.
    """
    rate = inputs.rate_bps
    push = need / (1 - base_loss) / rate
    left = None if burst_s is None else max(0.0, burst_s - push)
    if left is not None and need > (1 - loss) * rate * left:
        return push + left + (need - (1 - loss) * rate * left) / rate + inputs.rtt_s
    n = passes(bound, loss)
    if math.isnan(n):
        return math.nan
    return push + need / (1 - loss) / rate + n * inputs.rtt_s


def bandwidth_ratio(p_low: float, p_high: float) -> float:
    """Speedup of P_high over P_low when bytes dominate: (1-P_low)/(1-P_high)."""
    return (1 - p_low) / (1 - p_high)


def pass_ratio(p_low: float, p_high: float) -> float:
    """Speedup of P_high over P_low when passes dominate: ln P_low / ln P_high."""
    if not (0 < p_low < 1 and 0 < p_high < 1) or p_high == 1:
        return math.nan
    return math.log(p_low) / math.log(p_high)


def place_speedup(speedup: float, p_low: float, p_high: float) -> dict:
    """Where a measured speedup falls relative to the two physical ratios."""
    lo, hi = bandwidth_ratio(p_low, p_high), pass_ratio(p_low, p_high)
    out = {"p_low": p_low, "p_high": p_high, "bandwidth_ratio": lo, "pass_ratio": hi,
           "speedup": speedup, "position": None, "fraction": None}
    if p_high <= p_low:
        # DBLP sat in its critical phase (P = P_low) in the burst rounds: the
        # bound gives it no advantage, both ratios are 1.
        out["position"] = "not applicable: DBLP used P_low in its burst rounds (critical phase)"
        return out
    if any(not math.isfinite(x) for x in (speedup, lo, hi)):
        return out
    if speedup < lo:
        out["position"] = "below the bandwidth-bound ratio"
    elif speedup > hi:
        out["position"] = "above the pass-bound ratio"
    else:
        out["position"] = "between the bandwidth-bound and pass-bound ratios"
    if hi > lo:
        out["fraction"] = (speedup - lo) / (hi - lo)
    return out


def inputs_for_run(spec, manifest: dict, grad_bytes: float | None,
                   override: dict | None = None) -> tuple[PhysicsInputs | None, list[str]]:
    """Collect the bound's inputs from the run's spec and manifest.

    Sources, later ones winning: the spec's `topology.bw_mbps` (or a lower
    `transport.rate_mbps`), `placement.workers` and, for loss bursts,
    `burst_every.p`, and the IP fragments of one `transport.chunk_bytes`
    chunk when every arm uses the transport (module docstring); the
    manifest's measured `rtt_ms`; then `override` (the
    `report` command's options). `grad_bytes` comes from the workers' start
    events. Returns (inputs or None, what is missing) so a report can say why
    no bound is shown instead of inventing one; an override the bound cannot
    use is an InputError.
    """
    from testbed.errors import InputError

    d: dict = {"flows": int(spec["placement"]["workers"])}
    rate = spec["topology"]["bw_mbps"]
    pace = spec["transport"]["rate_mbps"]
    if pace and pace < rate:
        rate = pace
    d["rate_bps"] = float(rate) * 1e6
    gen = spec["burst_every"]
    if gen["kind"] == "loss" and 0 <= gen["p"] < 1:
        d["burst_loss"] = float(gen["p"])
    # The bursts' link: only a generator's bursts all on the server's uplink
    # move the burst to the pull (scheduled bursts keep the downlink's bound,
    # which for a pull-path burst is the looser one only when it is shorter).
    scheduled = spec["bursts"]
    if gen["enabled"] and gen["target"] == "server-uplink" and not scheduled:
        d["burst_on_pull"] = True
    frags = _fragments_per_chunk(spec)
    if frags > 1:
        d["fragments"] = frags
    if manifest.get("rtt_ms") is not None:
        d["rtt_s"] = manifest["rtt_ms"] / 1000.0
    if grad_bytes:
        d["grad_bytes"] = float(grad_bytes)
    d.update(override or {})
    missing = [k for k in ("rate_bps", "rtt_s", "grad_bytes") if d.get(k) is None]
    if missing:
        return None, missing
    try:
        return PhysicsInputs.from_dict(d), []
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _fragments_per_chunk(spec) -> int:
    """IP fragments of one data chunk, or 1 when an arm does not use the transport."""
    from dblp import wire
    from testbed.config.arms import ARMS, BASELINE_TRANSPORTS

    chunk = spec["transport"].get("chunk_bytes", wire.CHUNK_BYTES)
    arms = [ARMS.get(name) for name in spec[""]["arms"]]
    if any(a is None or a.transport in BASELINE_TRANSPORTS for a in arms):
        return 1
    return wire.fragments(wire.datagram_size(chunk))
