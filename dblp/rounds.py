"""One aggregation round: who pushes which part to whom, aggregation, pull, FINAL.

The gradient (a flat float32 vector) is cut into chunks of the job's
``chunk_bytes`` (``CHUNK_ELEMS`` floats unless configured otherwise) and the
chunks into parts of at most ``MAX_PART_CHUNKS`` (one bitmap datagram).
Every part has an owner that aggregates it: the server in parameter-server
mode, rank ``s`` for shard ``s`` in sharded mode. A round:

1. every member that is not the owner pushes its part (bounded loss, the
   owner's receiver STOPs as soon as the part misses at most P);
2. the owner aggregates (``missing`` = "zero": plain mean over all members,
   the paper; "mean": each chunk divided by the members that delivered it;
   "error_feedback": zero-fill plus residuals carried into the next round);
3. the owner pulls the aggregate to every member with the same bound;
4. identical replicas: each member answers STOP with its bitmap; the owner
   takes the union U of chunks some member lacks, repairs (resends chunks
   missed by the fewest members) until |U| <= P x chunks, and sends FINAL(U).
   Every replica, the owner's own included, zero-fills exactly U, so every
   replica applies a bit-identical aggregate.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from . import batch, wire
from .engine import Engine
from .streams import DONE, PULL, PUSH, InTransfer, OutTransfer, pack_bitmap
from .wire import CHUNK_BYTES, Flag, MsgType

PART_CHUNKS = wire.MAX_PART_CHUNKS  # chunks per part (a bitmap fits one datagram)
#: FINAL transmissions an owner makes before it returns without the member's DONE.
SETTLE_TRIES = 6


@dataclasses.dataclass(frozen=True)
class Part:
    """A range of the gradient, its owner, and the chunk size it is cut in.

    The part carries its chunk size so every mask over its chunks (zero-fill,
    error feedback, the detector) expands with the size its streams used.
    """

    index: int
    start: int  # first element
    stop: int  # one past the last element
    owner: int
    chunk_elems: int = CHUNK_BYTES // 4  # floats per data chunk (TransportConfig.chunk_bytes / 4)

    @property
    def chunks(self) -> int:
        return max(1, -(-(self.stop - self.start) // self.chunk_elems))

    def expand(self, mask: np.ndarray) -> np.ndarray:
        """A mask over this part's chunks as a mask over its elements."""
        return _chunk_mask_to_elems(mask, self.stop - self.start, self.chunk_elems)


def make_layout(numel: int, mode: str, world_size: int, max_part_chunks: int | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> list[Part]:
    """Cut ``numel`` floats into parts; PS parts belong to rank ``world_size`` (the server).

    ``chunk_bytes`` must be the job's (``TransportConfig.chunk_bytes``): the
    streams cut each part with the same size.
    """
    max_part_chunks = max_part_chunks or PART_CHUNKS
    if not 1 <= max_part_chunks <= wire.MAX_PART_CHUNKS:
        raise ValueError(f"max_part_chunks must be in [1, {wire.MAX_PART_CHUNKS}]")
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    if chunk_bytes < 4 or chunk_bytes % 4:
        raise ValueError(f"chunk_bytes must be a positive multiple of 4, got {chunk_bytes}")
    elems = chunk_bytes // 4
    total_chunks = -(-numel // elems)
    if mode == "ps":
        ranges = [(0, total_chunks, world_size)]
    elif mode == "sharded":
        ranges = []
        for s in range(world_size):
            a, b = s * total_chunks // world_size, (s + 1) * total_chunks // world_size
            if b > a:
                ranges.append((a, b, s))
    else:
        raise ValueError(f"mode must be 'ps' or 'sharded', got {mode!r}")
    parts: list[Part] = []
    for a, b, owner in ranges:
        for c in range(a, b, max_part_chunks):
            e0, e1 = c * elems, min(min(c + max_part_chunks, b) * elems, numel)
            parts.append(Part(len(parts), e0, e1, owner, elems))
    return parts


class PullGroup:
    """The owner's pull of one aggregated part to every other member, up to FINAL."""

    def __init__(self, eng: Engine, part: Part, members: list[int], data: np.ndarray,
                 bound_ppm: int, pushed: dict[int, np.ndarray]):
        self.eng, self.part = eng, part
        self.pushed = pushed  # member -> chunks of its push the aggregate took (told in FINAL)
        self.data = data
        self.count = part.chunks
        self.allowed = wire.allowed_missing(self.count, bound_ppm)
        self.senders = {}
        for m in members:
            s = OutTransfer(eng, PULL, part.index, m, data, bound_ppm)
            self.senders[m] = s
            eng.add_sender(s)
        self.dropped: np.ndarray | None = None if self.senders else np.zeros(self.count, bool)
        self.repairs = 0

    def poll(self) -> bool:
        """True once U (the union of chunks some member lacks) is within the bound."""
        if self.dropped is not None:
            return True
        if any(s.state != DONE for s in self.senders.values()):
            return False
        lacking = np.zeros(self.count, np.int32)
        for s in self.senders.values():
            lacking += ~s.held_mask
        union = lacking > 0
        excess = int(union.sum()) - self.allowed
        if excess <= 0:
            self.dropped = union
            return True
        # Repair the chunks the fewest members lack until |U| fits the bound.
        idx = np.flatnonzero(union)
        fix = np.zeros(self.count, bool)
        fix[idx[np.argsort(lacking[idx], kind="stable")[:excess]]] = True
        self.repairs += 1
        for s in self.senders.values():
            need = fix & ~s.held_mask
            if need.any():
                s.repair(need)
        return False

    def send_final(self, next_bound_ppm: int, critical: bool,
                   figures: tuple[float, int] = (0.0, 0)) -> None:
        """FINAL to every member: U, what it pushed that was taken, the part's norm figures."""
        eng = self.eng
        assert self.dropped is not None, "send_final before poll() settled the dropped set"
        dropped = pack_bitmap(self.dropped)
        flags = Flag.PULL | (Flag.CRITICAL if critical else 0)
        for m in self.senders:
            taken = self.pushed.get(m)
            payload = wire.final_payload(
                dropped, pack_bitmap(np.ones(self.count, bool) if taken is None else taken),
                *figures)
            copies = eng.copies(m)
            msg = wire.pack_header(MsgType.FINAL, src=eng.rank, part=self.part.index,
                                   session=eng.session, round=eng.round, count=self.count,
                                   length=len(payload), bound=self.senders[m].bound_ppm,
                                   aux=next_bound_ppm, flags=flags, copies=copies) + payload
            eng.add_final(m, self.part.index, msg, copies)


def _chunk_mask_to_elems(mask: np.ndarray, n: int, chunk_elems: int) -> np.ndarray:
    return np.repeat(mask, chunk_elems)[:n]


@dataclasses.dataclass
class RoundResult:
    push_senders: list
    pull_receivers: list
    push_receivers: list
    pull_groups: list
    dropped_chunks: int = 0
    total_chunks: int = 0
    grad_norm: float | None = None
    next_bound_ppm: int | None = None
    critical: bool | None = None
    detector_norm: float | None = None  # the phase detector's signal (``signal`` given)


def run_round(eng: Engine, parts: list[Part], members: list[int], contribution: np.ndarray | None,
              result: np.ndarray, bound_ppm: int, missing: str, round_timeout: float,
              first_wait: float | None = None, owner_residual: dict | None = None,
              decide=None, settle: bool = False, signal: str | None = None) -> RoundResult:
    """Run round ``eng.round`` for this participant; the aggregate lands in ``result``.

    ``contribution`` is this rank's (error-compensated) gradient, None for a
    pure server. ``decide(result, detector_norm) -> (next_bound_ppm, critical)``
    is called by a single-owner aggregator (PS server) once the applied
    aggregate is known; its answer travels in FINAL. ``signal`` (a
    ``dblp.config.SIGNALS`` name) selects the detector norm handed to
    ``decide``, or, without ``decide``, stored in ``detector_norm`` of the result.

    ``settle=True`` (members that own parts, i.e. sharded mode): return only once
    every member acknowledged our FINALs (DONE), or after ``SETTLE_TRIES``
    transmissions of each. The caller may block outside the transport between
    rounds; a FINAL lost then would leave its member waiting until the deadline.
    (The parameter server needs no settling: it stays in its loop, where the
    FINAL timers keep running, until its last round is acknowledged.)
    """
    me = eng.rank
    n_members = len(members)
    if any(p.chunk_elems * 4 != eng.chunk_bytes for p in parts):
        raise ValueError(f"the layout's chunks differ from the engine's chunk_bytes="
                         f"{eng.chunk_bytes}: build it with make_layout(..., chunk_bytes=...)")
    if result.dtype != np.float32 or not result.flags.c_contiguous:
        raise ValueError("result must be a contiguous float32 array: the parts this rank owns "
                         "are summed in it")
    push_senders, pull_receivers, push_receivers = [], [], []
    owned: dict[int, dict[str, Any]] = {}
    for part in parts:
        sl = slice(part.start, part.stop)
        if part.owner == me:
            # The part is summed where its aggregate ends up, in ``result``: no
            # accumulator to zero, fill and copy back on the way from push to pull
            # (at 10 Gbit/s those were two 32 MiB passes between the two).
            acc = result[sl]
            counts = np.zeros(part.chunks, np.int32)
            if contribution is not None and me in members:
                np.copyto(acc, contribution[sl])
                counts += 1
            else:
                acc.fill(0)
            recvs = []
            for m in members:
                if m == me:
                    continue
                r = InTransfer(eng, PUSH, part.index, m, acc, bound_ppm, add=True, freeze=True)
                eng.add_receiver(r)
                recvs.append(r)
            push_receivers += recvs
            owned[part.index] = {"part": part, "acc": acc, "counts": counts, "recvs": recvs,
                                 "pull": None}
        elif me in members:
            assert contribution is not None, "a member must contribute"
            s = OutTransfer(eng, PUSH, part.index, part.owner, contribution[sl], bound_ppm)
            eng.add_sender(s)
            push_senders.append(s)
            r = InTransfer(eng, PULL, part.index, part.owner, result[sl], bound_ppm,
                           add=False, freeze=False)
            eng.add_receiver(r)
            pull_receivers.append(r)
    eng.replay_early()
    if first_wait is not None:
        eng.run_until(lambda: eng.seen_round, time.monotonic() + first_wait,
                      lambda: f"rank {me}: no member started round {eng.round} within "
                              f"{first_wait} s")
    deadline = time.monotonic() + round_timeout
    finals_sent = not owned
    state: dict[str, Any] = {"finals_sent": finals_sent, "decided": None}

    def advance() -> bool:
        pending = False
        for info in owned.values():
            if info["pull"] is None:
                if not all(r.stopped for r in info["recvs"]):
                    pending = True
                    continue
                part = info["part"]
                counts = info["counts"]
                for r in info["recvs"]:
                    counts += r.have
                acc = info["acc"]
                if missing == "mean":
                    div = part.expand(np.maximum(counts, 1)).astype(np.float32)
                    np.divide(acc, div, out=acc)
                else:
                    acc /= np.float32(n_members)
                if owner_residual is not None:
                    res = owner_residual.get(part.index)
                    if res is not None:
                        acc += res
                info["pull"] = PullGroup(eng, part, [m for m in members if m != me],
                                         result[part.start:part.stop], bound_ppm,
                                         {r.peer: r.have.copy() for r in info["recvs"]})
            if not info["pull"].poll():
                pending = True
        return not pending

    def all_done() -> bool:
        if not state["finals_sent"] and advance():
            # Every owned part has its dropped set U: zero it on our replica,
            # keep it as residual if asked, decide, then FINAL.
            for info in owned.values():
                part, dropped = info["part"], info["pull"].dropped
                if owner_residual is None and not dropped.any():
                    continue  # nothing to zero: skip the element-wide mask (64 MiB: ~10 ms)
                view = result[part.start:part.stop]
                mask = part.expand(dropped)
                if owner_residual is not None:
                    owner_residual[part.index] = np.where(mask, view, np.float32(0))
                view[mask] = 0
            if signal == "rescaled":
                # Each owner holds its parts' delivery counts; the figures travel in FINAL.
                for info in owned.values():
                    info["figures"] = part_figures(result, info["part"], info["pull"].dropped,
                                                   info["counts"], n_members, missing)
            nb, crit = (0, False)
            if decide is not None:
                # The single owner holds every part: the full estimate.
                if signal == "rescaled":
                    state["norm"] = norm_of_figures([owned[p.index]["figures"] for p in parts],
                                                    sum(p.stop - p.start for p in parts))
                else:
                    state["norm"] = grad_norm(result)
                nb, crit = decide(result, state["norm"])
                state["decided"] = (nb, crit)
            for info in owned.values():
                info["pull"].send_final(nb, crit, info.get("figures", (0.0, 0)))
            state["finals_sent"] = True
        if not state["finals_sent"]:
            return False
        return all(s.state == DONE for s in push_senders) and \
            all(r.final is not None for r in pull_receivers)

    def describe() -> str:
        waiting = [s.describe() for s in push_senders if s.state != DONE]
        waiting += [r.describe() for r in pull_receivers if r.final is None]
        waiting += [r.describe() for r in push_receivers if not r.stopped]
        for info in owned.values():
            if info["pull"] is not None:
                waiting += [s.describe() for s in info["pull"].senders.values() if s.state != DONE]
        return (f"rank {me}, round {eng.round}: no completion before the round deadline; "
                f"still waiting for: " + "; ".join(waiting[:6]) + (" ..." if len(waiting) > 6 else ""))

    def needs() -> set:
        peers = {s.peer for s in push_senders if s.state != DONE}
        peers |= {r.peer for r in pull_receivers if r.final is None}
        peers |= {r.peer for r in push_receivers if not r.stopped}
        for info in owned.values():
            if info["pull"] is not None:
                peers |= {m for m, s in info["pull"].senders.items() if s.state != DONE}
        return peers

    eng.run_until(all_done, deadline, describe, needs)
    if settle and owned:
        rnd = eng.round

        def settled() -> bool:
            return all(e.id >= SETTLE_TRIES for k, e in eng.finals.pending.items() if k[2] == rnd)

        def unsettled() -> str:
            return (f"rank {me}, round {rnd}: FINAL not acknowledged by ranks "
                    f"{sorted(k[0] for k in eng.finals.pending if k[2] == rnd)}")
        eng.run_until(settled, deadline, unsettled)
    res = RoundResult(push_senders, pull_receivers, push_receivers,
                      [i["pull"] for i in owned.values()])
    res.total_chunks = sum(p.chunks for p in parts)
    res.dropped_chunks = sum(_count(r.final) for r in pull_receivers) \
        + sum(_count(g.dropped) for g in res.pull_groups)
    if decide is not None:
        res.detector_norm = state.get("norm")
    elif signal == "rescaled":
        # Sharded replicas: a part's push counts live with its owner, which sent its
        # figures in FINAL; every replica adds the same figures in part order, so all
        # decide alike, on the estimate a single owner of every part would make.
        figures = {i: info["figures"] for i, info in owned.items()}
        for r in pull_receivers:
            figures[r.part] = r.final_figures
        res.detector_norm = norm_of_figures([figures[p.index] for p in parts],
                                            sum(p.stop - p.start for p in parts))
    elif signal is not None:
        res.detector_norm = detector_norm(result, parts, {}, signal)  # the zero-filled norm
    if state["decided"] is not None:
        res.next_bound_ppm, res.critical = state["decided"]
    elif pull_receivers:
        r = pull_receivers[0]
        res.next_bound_ppm = r.final_next_bound
        res.critical = bool(r.final_flags & Flag.CRITICAL)
    return res


def _count(mask: np.ndarray | None) -> int:
    return 0 if mask is None else int(mask.sum())


def max_passes(transfers) -> int:
    return max((t.passes for t in transfers), default=0)


#: Above this many elements ``grad_norm`` sums without a float64 copy of the tensor.
NORM_COPY_LIMIT = 1 << 16
#: Elements the numpy ``sum_squares`` casts to float64 at a time (a multiple of 8).
_SUMSQ_BLOCK = 1 << 16


def sum_squares(x: np.ndarray) -> float:
    """The float64 sum of squares of a flat float32 array, in the C core's fixed order.

    Element i goes to lane i % 8, each lane adds in order, and the lanes are
    combined as ((0+1)+(2+3))+((4+5)+(6+7)). The C core (``batch.NATIVE``)
    does it in one pass; this numpy version reproduces the same bits a block
    at a time (a reduction over the rows of an (n, 8) array adds row after
    row), so ranks with and without the core decide their phase alike.
    """
    x = np.ascontiguousarray(x, np.float32).ravel()
    if batch.NATIVE is not None:
        return float(batch.NATIVE.sum_squares(x))
    n = x.size
    whole = n - n % 8
    lanes = np.zeros(8)
    for lo in range(0, whole, _SUMSQ_BLOCK):
        sq = x[lo:min(lo + _SUMSQ_BLOCK, whole)].reshape(-1, 8).astype(np.float64)
        sq *= sq
        sq[0] += lanes  # lanes + row 0, then + row 1, ...: the C core's order
        lanes = np.add.reduce(sq, axis=0)
    acc = [float(v) for v in lanes]
    for j in range(n - whole):
        d = float(x[whole + j])
        acc[j] += d * d
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


def grad_norm(x: np.ndarray) -> float:
    """The L2 norm, accumulated in float64.

    Why two ways: a float64 copy of a 64 MiB gradient is 128 MB of fresh pages,
    ~0.1 s on a small machine, and the aggregator computes the norm inside the
    round. Up to ``NORM_COPY_LIMIT`` elements the value is the float64 dot
    product's, as it always was; above, ``sum_squares`` (the same sum up to the
    rounding of its order; in the C core 1.3 ms for 8 M elements, against
    einsum's 13.7 ms; a sharded round waits for it at its end, a PS round at
    its worker and its aggregator).
    """
    x = x.ravel()
    if x.size <= NORM_COPY_LIMIT:
        y = x.astype(np.float64)
        return float(math.sqrt(float(np.dot(y, y))))
    return math.sqrt(sum_squares(x))


def part_figures(result: np.ndarray, part: Part, zeroed: np.ndarray | None,
                 counts: np.ndarray | None = None, n_members: int = 0,
                 missing: str = "zero") -> tuple[float, int]:
    """One part's share of the drop-corrected norm: (sum of squares kept, elements kept).

    Chunks in ``zeroed`` (the set U every replica zero-fills) are left out;
    with ``counts`` (contributions per chunk, known to the part's owner), a
    chunk nobody delivered is left out too and one that k of the
    ``n_members`` delivered is scaled by n/k (the mean of what arrived;
    "mean" already divided by k). The owner computes them and sends them in
    its FINAL (``wire.FINAL_NORM``), so a sharded job's replicas, which hold
    no other part's counts, add up the same figures the owner of every part
    would.
    """
    view = result[part.start:part.stop].astype(np.float64)
    keep = np.ones(part.chunks, bool) if zeroed is None else ~np.asarray(zeroed, bool)
    if counts is not None:
        keep &= counts > 0
        if missing != "mean":
            view *= part.expand(n_members / np.maximum(counts, 1))
    mask = part.expand(keep)
    vals = view[mask]
    return float(np.dot(vals, vals)), int(mask.sum())


def norm_of_figures(figures: list[tuple[float, int]], total: int) -> float:
    """The whole gradient's norm from its parts' figures, in part order (every replica alike).

    The sum of squares over the F kept elements of ``total`` is scaled by
    total/F, i.e. the norm by 1/sqrt(F/total): a squared norm is a sum over
    elements, so a subset that the drops pick independently of the values
    carries F/total of it in expectation. NaN if nothing was kept (the policy
    skips a non-finite norm).
    """
    sumsq, kept = 0.0, 0
    for part_sumsq, part_kept in figures:
        sumsq += part_sumsq
        kept += part_kept
    return math.sqrt(sumsq * total / kept) if kept else math.nan


def detector_norm(result: np.ndarray, parts: list[Part], zeroed: dict, signal: str,
                  n_members: int = 0, counts: dict | None = None, missing: str = "zero") -> float:
    """The gradient norm the phase detector sees for one round's applied aggregate.

    ``signal="delivered"``: the norm of ``result`` as applied, zero-filled
    chunks included. The transport's own drops move it: at a 40 % bound about
    40 % of the chunks are zeroed and the pushes that STOPped early leave the
    rest at k/N of their value, so relaxing the bound cuts this norm by 40-50 %
    and can flip the phase by itself.

    ``signal="rescaled"``: the norm of what was actually delivered, brought
    back to the whole gradient (``part_figures`` per part, ``norm_of_figures``
    over them). ``zeroed``: part index -> chunk mask; ``counts``: part index
    -> contributions per chunk, known to an owner of every part. Sharded
    replicas use the figures their FINALs carry instead (``run_round``).
    """
    if signal == "delivered":
        return grad_norm(result)
    figures = [part_figures(result, part, zeroed.get(part.index),
                            None if counts is None else counts.get(part.index), n_members, missing)
               for part in parts]
    return norm_of_figures(figures, sum(part.stop - part.start for part in parts))
