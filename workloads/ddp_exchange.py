"""The ``ddp`` integration: unmodified DistributedDataParallel over a torch.distributed backend.

This is the path a PyTorch user takes: no hook of ours in the exchange, no
flat buffer, DDP's own buckets all-reduced during backward by the process
group ``init_process_group(BACKEND)`` made. Which backend is the arm's
(``testbed.config.arms.Arm.backend``, the worker's ``--backend``), and
`backend_for` says which one each transport is reached by:

* ``dblp`` (``dblp.torch_backend``) for the transport's policies. The
  backend always runs the sharded mode with the UDP control path (torchrun
  starts no parameter server), so the ``ddp`` arm mirrors ``dblp-sharded``:
  same policy, control path, mode, settings file and pacing rate; what
  differs is who cuts and schedules the gradient.
* ``gloo`` for the ``gloo`` transport: the ``ddp-gloo`` arm, what a PyTorch
  user runs today, and ``ddp``'s like-for-like baseline (the flat ``gloo``
  arm is one all-reduce after backward, nothing overlapped).
* any other registered c10d backend for the ``c10d`` transport
  (``workloads.exchange.C10D``): the arm names it, and a module the worker
  imports first (``--backend-module``) registers it
  (``torch.distributed.Backend.register_backend``), as a user's job would.

Its rounds in the round log, so that every table reads them as it reads a
flat arm's:

* ``comm_s``: the seconds this step's gradient buckets spent being averaged
  (the sum over buckets, each from DDP handing it over to its average being
  back). DDP starts a bucket's all-reduce while backward still computes the
  next one, so part of it overlaps compute; ``compute_s`` is the rest of the
  step.
* ``comm_cpu_s``: the CPU seconds of every thread but the training thread
  since the last step (the backend's threads: dblp's round and transport
  threads, gloo's workers).
* ``stats``: over dblp, the step's bucket rounds as the backend reported
  them, merged (`merge_round_stats`); ``bound`` and ``phase`` are those of
  the bucket carrying most of the gradient. Each bucket size is a stream of
  its own with its own policy state, so the phase detector of each bucket
  sees only its bucket. Over any other backend, which reports nothing,
  ``latency_s``, ``payload_bytes`` and ``buckets``, timed by a `BucketTimer`:
  DDP's communication hook set to torch's own ``allreduce_hook`` (which DDP
  documents as giving the results of no hook at all) with a clock around
  it. ``bound`` is 0 over gloo (every byte arrives), null over a backend the
  project does not know.

DDP's defaults are kept (bucket sizes, ``broadcast_buffers``): that is what
users get. The models the presets train have no buffers; the BatchNorm
model would have its buffers broadcast by rank 0 before every forward over
the backend's exact (bound 0) streams, which the flat arms do not do.
"""
from __future__ import annotations

import importlib
import math
import os
import threading
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


#: The backend the transport's policies are reached by (``dblp.torch_backend.BACKEND``,
#: copied so the harness asks without importing torch; pinned by a unit test).
DBLP_BACKEND = "dblp"
#: torch.distributed's gloo: the backend of the ``gloo`` transport.
GLOO_BACKEND = "gloo"


def backend_for(transport: str) -> str | None:
    """The torch.distributed backend DDP reaches ``transport`` by (None: the arm must name one).

    dblp's policies: the ``dblp`` backend; ``gloo``: gloo. The ``c10d``
    transport is any other backend, so it has no default.
    """
    from .exchange import uses_dblp

    if uses_dblp(transport):
        return DBLP_BACKEND
    return GLOO_BACKEND if transport == "gloo" else None


class BucketTimer:
    """DDP's communication hook for a backend that reports nothing: torch's ``allreduce_hook``
    (what DDP does without a hook), with a clock around each bucket.

    A bucket's time runs from DDP handing it over (its gradients are ready) to
    its average being back, as the dblp backend's ``latency_s`` does; the
    callback runs on the backend's thread, so the list is locked.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._rounds: list[dict] = []

    def hook(self, state, bucket):
        """The hook DDP calls with each bucket whose gradients are ready (a method: DDP
        logs its hook by ``__name__``)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        t0 = time.perf_counter()
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()

        def done(fut):
            with self._lock:
                self._rounds.append({"latency_s": time.perf_counter() - t0,
                                     "payload_bytes": nbytes})
            return fut.value()
        return default_hooks.allreduce_hook(state, bucket).then(done)

    def take(self) -> list[dict]:
        """The buckets averaged since the last call."""
        with self._lock:
            out, self._rounds = self._rounds, []
        return out


class DdpIntegration:
    """The model in DistributedDataParallel over the arm's backend (module docstring)."""

    name: ClassVar[str] = "ddp"

    @classmethod
    def refuses(cls, transport: str, control: str | None, mode: str | None,
                backend: str | None = None, module: str | None = None) -> str | None:
        from .exchange import C10D, dblp_transports, uses_dblp

        own = backend_for(transport)
        if backend is None:
            backend = own
        if uses_dblp(transport):
            if (control, mode) != ("udp", "sharded"):
                return ("the dblp torch.distributed backend runs control 'udp' in mode 'sharded' "
                        f"only (torchrun starts no parameter server), not {control!r}/{mode!r}")
        elif control is not None or mode is not None:
            return f"{transport} has no control path or mode"
        if transport == C10D:
            if backend is None:
                return (f"transport {C10D!r} is a torch.distributed backend the arm names; "
                        "name one (--backend, a spec's [ddp.NAME] backend)")
            if backend in (DBLP_BACKEND, GLOO_BACKEND):
                arm = "ddp" if backend == DBLP_BACKEND else "ddp-gloo"
                return (f"backend {backend!r} is the project's own, run by the built-in arm "
                        f"{arm!r} (with its settings); name another backend")
        elif own is None:
            return (f"DDP runs here over a torch.distributed backend: dblp's for the transport's "
                    f"policies ({', '.join(dblp_transports())}), gloo's for 'gloo', or one the "
                    f"arm names ({C10D!r}); {transport!r} has none")
        elif backend != own:
            return f"transport {transport!r} is reached by backend {own!r}, not {backend!r}"
        if module is not None and transport != C10D:
            return (f"only a {C10D!r} arm imports a module for its backend; {own!r} needs none")
        return None

    def __init__(self, args, model):
        import torch
        import torch.distributed as dist

        # The worker's resolve() named one for every arm it lets through.
        self.backend: str = args.backend or backend_for(args.arm) or ""
        # conv1's weight (one input channel) has ambiguous strides; DDP warns on every backend.
        warnings.filterwarnings("ignore", message="Grad strides do not match")
        init = f"tcp://{args.master_addr}:{args.master_port}"
        self.group: Any = None
        self.timer: BucketTimer | None = None
        if self.backend == DBLP_BACKEND:
            import dblp.torch_backend as backend

            cfg = args.transport
            # The backend advertises rank 0's streams at MASTER_ADDR: the worker's own
            # address for rank 0, whichever way it was given.
            os.environ["MASTER_ADDR"] = args.master_addr
            dist.init_process_group(backend.BACKEND, init_method=init, rank=args.rank,
                                    world_size=args.world_size,
                                    timeout=timedelta(seconds=cfg.round_timeout), pg_options=cfg)
            self.group = _dblp_group(dist, backend, torch)
            self.module: Any = torch.nn.parallel.DistributedDataParallel(model)
        else:
            if args.backend_module:
                try:
                    importlib.import_module(args.backend_module)
                except Exception as exc:   # the user's module: say which, in one line
                    raise RuntimeError(f"--backend-module {args.backend_module!r} (it registers "
                                       f"backend {self.backend!r}) failed to import: "
                                       f"{type(exc).__name__}: {exc}") from exc
            check_backend(dist, self.backend, args.backend_module)
            dist.init_process_group(self.backend, init_method=init, rank=args.rank,
                                    world_size=args.world_size,
                                    timeout=timedelta(seconds=args.timeout_s))
            self.module = torch.nn.parallel.DistributedDataParallel(model)
            self.timer = BucketTimer()
            self.module.register_comm_hook(None, self.timer.hook)
        self.exact = args.arm == "gloo"
        self._seen: dict[str, int] = {}
        self._cpu = (time.process_time(), time.thread_time())

    def step_rounds(self) -> list[dict]:
        """The gradient rounds the backend finished since the last call, as dicts."""
        if self.timer is not None:
            return self.timer.take()
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
        rounds = self.step_rounds()
        if self.timer is not None:
            stats = {"latency_s": sum(r["latency_s"] for r in rounds),
                     "payload_bytes": sum(r["payload_bytes"] for r in rounds),
                     "buckets": len(rounds)}
            result = ExchangeResult(stats, 0.0 if self.exact else None, None)
        else:
            stats = merge_round_stats(rounds)
            result = ExchangeResult(stats, stats.get("bound"), stats.get("phase") or None)
        return Synced(result, float(stats.get("latency_s", 0.0)), max(0.0, comm_cpu))

    def close(self) -> None:
        import torch.distributed as dist

        # DDP's reducer holds the group: release it before the group is destroyed.
        self.module = None
        if not dist.is_initialized():
            return
        if self.backend == DBLP_BACKEND:   # the project's own teardown: a failure shows
            dist.destroy_process_group()
            return
        try:
            dist.destroy_process_group()
        except Exception:  # a dead peer can make gloo's teardown fail; nothing left to save
            pass


def check_backend(dist, backend: str, module: str | None) -> None:
    """Refuse, in one line, a backend torch.distributed does not know after ``module`` ran.

    Why here: ``init_process_group`` would say only "Invalid backend", after
    the other ranks had started waiting at the rendezvous.
    """
    if backend.lower() in dist.Backend.backend_list:
        return
    known = ", ".join(b for b in dist.Backend.backend_list if b != "undefined")
    source = (f"module {module!r} did not register it" if module
              else "no --backend-module registered it")
    raise RuntimeError(f"torch.distributed has no backend {backend!r} ({source}; known: {known})")


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
