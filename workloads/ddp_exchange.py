"""The ``ddp`` integration: unmodified DistributedDataParallel over ``init_process_group("dblp")``.

This is the path a PyTorch user takes with the transport: no hook, no flat
buffer, DDP's own buckets all-reduced during backward by the ``dblp``
torch.distributed backend (``dblp.torch_backend``). The backend always
runs the transport's sharded mode with the UDP control path (torchrun
starts no parameter server), so the ``ddp`` arm mirrors ``dblp-sharded``:
same policy, control path, mode, settings file and pacing rate; what
differs is who cuts and schedules the gradient.

Its rounds in the round log, so that every table reads them as it reads a
flat arm's:

* ``comm_s``: the seconds the backend spent in this step's gradient rounds
  (the sum of their ``latency_s``). DDP starts a bucket's round while
  backward still computes the next one, so part of it overlaps compute;
  ``compute_s`` is the rest of the step.
* ``comm_cpu_s``: the CPU seconds of every thread but the training thread
  since the last step (the backend's round thread and the transport's).
* ``stats``: the step's bucket rounds merged (`merge_round_stats`);
  ``bound`` and ``phase`` are those of the bucket carrying most of the
  gradient. Each bucket size is a stream of its own with its own policy
  state, so the phase detector of each bucket sees only its bucket.

DDP's defaults are kept (bucket sizes, ``broadcast_buffers``): that is what
users get. The models the presets train have no buffers; the BatchNorm
model would have its buffers broadcast by rank 0 before every forward over
the backend's exact (bound 0) streams, which the flat arms do not do.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from datetime import timedelta
from typing import Any, ClassVar

#: Backend stream keys of the gradient rounds (``DblpProcessGroup.stats``); the others
#: (``exact/...``) carry DDP's parameter broadcast and shape checks, bit for bit.
GRAD_STREAM = "grad/"
#: Per-round figures that add up over a step's buckets (counts, bytes, seconds spent).
SUMMED = ("latency_s", "chunks", "bytes_sent", "chunks_sent", "retransmitted", "probe_rounds",
          "pace_late_s", "pace_busy_s")
#: Per-round figures of which a step's buckets report the worst.
MAXED = ("passes_push", "passes_pull")
#: Fractions of a bucket's chunks: weighted by chunks over the step's buckets.
WEIGHTED = ("missing_at_stop", "pull_missing")


def merge_round_stats(rounds: list[dict]) -> dict:
    """One step's bucket rounds (``RoundStats.as_dict()`` each) as one round's stats.

    Counts and seconds add up (`SUMMED`, and the anomaly counters), passes
    take the worst bucket (`MAXED`), missing fractions are weighted by the
    buckets' chunks (`WEIGHTED`), the gradient's norm is the norm over every
    bucket (None when a bucket has none), and everything else (bound, phase,
    next bound, timings within a round, identity) is the bulk bucket's: the
    one with the most chunks. ``buckets`` says how many rounds were merged.
    """
    if not rounds:
        return {}
    bulk = max(rounds, key=lambda r: r.get("chunks") or 0)
    out = dict(bulk)
    for k in SUMMED:
        out[k] = sum(r.get(k) or 0 for r in rounds)
    for k in MAXED:
        out[k] = max(r.get(k) or 0 for r in rounds)
    chunks = out["chunks"]
    for k in WEIGHTED:
        out[k] = (sum((r.get(k) or 0.0) * (r.get("chunks") or 0) for r in rounds) / chunks
                  if chunks else 0.0)
    norms = [r.get("grad_norm") for r in rounds]
    out["grad_norm"] = (math.sqrt(sum(n * n for n in norms))
                        if all(isinstance(n, (int, float)) for n in norms) else None)
    counters: dict[str, int] = {}
    for r in rounds:
        for k, v in (r.get("counters") or {}).items():
            counters[k] = counters.get(k, 0) + v
    out["counters"] = counters
    out["buckets"] = len(rounds)
    return out


class DdpIntegration:
    """The model in DistributedDataParallel over the ``dblp`` process group (module docstring)."""

    name: ClassVar[str] = "ddp"

    @classmethod
    def refuses(cls, transport: str, control: str | None, mode: str | None) -> str | None:
        from .exchange import dblp_transports, uses_dblp

        if not uses_dblp(transport):
            return (f"DDP runs here over the dblp torch.distributed backend, which carries the "
                    f"dblp transport's policies ({', '.join(dblp_transports())}), not "
                    f"{transport!r}")
        if (control, mode) != ("udp", "sharded"):
            return ("the dblp torch.distributed backend runs control 'udp' in mode 'sharded' "
                    f"only (torchrun starts no parameter server), not {control!r}/{mode!r}")
        return None

    def __init__(self, args, model):
        import torch
        import torch.distributed as dist

        import dblp.torch_backend as backend

        cfg = args.transport
        # conv1's weight (one input channel) has ambiguous strides; DDP warns on every backend.
        warnings.filterwarnings("ignore", message="Grad strides do not match")
        # The backend advertises rank 0's streams at MASTER_ADDR: the worker's own
        # address for rank 0, whichever way it was given.
        os.environ["MASTER_ADDR"] = args.master_addr
        dist.init_process_group(backend.BACKEND,
                                init_method=f"tcp://{args.master_addr}:{args.master_port}",
                                rank=args.rank, world_size=args.world_size,
                                timeout=timedelta(seconds=cfg.round_timeout), pg_options=cfg)
        self.group = _dblp_group(dist, backend, torch)
        self.module: Any = torch.nn.parallel.DistributedDataParallel(model)
        self._seen: dict[str, int] = {}
        self._cpu = (time.process_time(), time.thread_time())

    def step_rounds(self) -> list[dict]:
        """The gradient rounds the backend finished since the last call, as dicts."""
        out = []
        for key, history in self.group.stats().items():
            if not key.startswith(GRAD_STREAM):
                continue
            seen = self._seen.get(key, 0)
            out += [st.as_dict() for st in history[seen:]]
            self._seen[key] = len(history)
        return out

    def sync(self):
        """After backward: DDP has waited for every bucket, so the step's rounds are all done."""
        from .exchange import ExchangeResult, Synced

        proc, main = time.process_time(), time.thread_time()
        comm_cpu = (proc - self._cpu[0]) - (main - self._cpu[1])
        self._cpu = (proc, main)
        stats = merge_round_stats(self.step_rounds())
        return Synced(ExchangeResult(stats, stats.get("bound"), stats.get("phase") or None),
                      float(stats.get("latency_s", 0.0)), max(0.0, comm_cpu))

    def close(self) -> None:
        import torch.distributed as dist

        # DDP's reducer holds the group: release it before the group is destroyed.
        self.module = None
        if dist.is_initialized():
            dist.destroy_process_group()


def _dblp_group(dist, backend, torch):
    """The default group's ``DblpProcessGroup`` (c10d may wrap a registered backend)."""
    pg = dist.group.WORLD
    if isinstance(pg, backend.DblpProcessGroup):
        return pg
    get = getattr(pg, "_get_backend", None)
    found = get(torch.device("cpu")) if get is not None else None
    if isinstance(found, backend.DblpProcessGroup):
        return found
    raise RuntimeError(f"init_process_group({backend.BACKEND!r}) made {type(pg).__name__}, "
                       "not a dblp process group")
