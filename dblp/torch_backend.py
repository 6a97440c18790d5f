"""DBLP as a torch.distributed backend: ``dist.init_process_group("dblp")``.

    import dblp.torch_backend                      # registers the backend "dblp"
    dist.init_process_group("dblp", pg_options=dblp.torch_backend.options(policy="static",
                                                                          p=0.01))
    model = torch.nn.parallel.DistributedDataParallel(model)   # unchanged: no hook, no gloo

Launch with plain ``torchrun``: no other process. The backend always runs
DBLP's sharded mode (every rank aggregates 1/N of each tensor, rank 0 also
hosts the join), because torchrun starts no parameter server; a
``TransportConfig`` with ``mode="ps"`` or ``control="tcp"`` is refused with a
ValueError saying so. Without ``pg_options`` the settings come from
``TransportConfig.from_env`` (``DBLP_*``, ``$DBLP_SECRET``) with
``mode="sharded"`` as the default. A custom-backend group is CPU only.

What runs over which stream
---------------------------
``SUPPORTED`` and ``REFUSED`` below are the one list of what the backend
does (docs/transport.md shows them and a test holds the page to them).

* ``all_reduce`` of floating tensors with SUM or AVG (DDP's gradient buckets):
  the configured loss bound and policy. One DBLP stream (its own
  ``TransportGroup``: one UDP socket per rank, its own policy state and round
  counter) per distinct element count, so each DDP bucket keeps its size and
  its own phase detection, and nothing is padded; DDP's buckets are a handful
  of fixed sizes (they change once, after the first iteration). SUM is the
  transport's mean times the world size.
* ``reduce_scatter`` and ``reduce_scatter_tensor`` (FSDP's sharded
  gradients): the all_reduce above of the whole input (all N shards,
  concatenated), after which each rank keeps its own shard. This is not a
  true reduce-scatter: every rank receives the whole reduced vector, not only
  its shard, so the pull half of the round (the aggregated shards travelling
  back) is extra: about twice the bytes per rank of a ring reduce-scatter,
  and the latency of a full DBLP round. In exchange the shard is exactly what
  an all_reduce gives: under a loss bound the chunks the round gave up are
  zero-filled or rescaled by the ``missing`` policy as in all_reduce, and every
  rank's shard comes from the same reduced vector. SUM and AVG of floating
  tensors use the loss bound; the exact ops below are exact here too;
  PREMUL_SUM (and anything else) raises ``NotImplementedError`` naming the op.
* ``broadcast``, ``all_gather`` (and ``all_gather_into_tensor``), ``barrier``,
  and ``all_reduce`` of anything else (integers, MIN/MAX/PRODUCT/bitwise
  ops): exact, over reliable (bound 0) streams of the same transport. The
  bytes of the tensors travel as 16-bit integers held in float32 (exact
  through the transport's sum and its division by N), one rank's slot filled
  and the others zero; all_reduce of these kinds is an all_gather then the
  same reduction, in rank order, on every rank. These streams are keyed by
  size rounded up to a power of two, so arbitrary sizes cost a few sockets.
* Everything else (reduce, gather, scatter, all_to_all, send/recv) raises
  ``NotImplementedError`` naming the operation and the alternative (a gloo group).

Joining a stream: rank 0 binds an ephemeral UDP port and publishes it in the
process group's store (torchrun's TCPStore); every rank then meets at a store
barrier, so all members are known alive when the UDP join starts. A member
whose aggregator does not answer within ``hello_timeout`` (5 s by default)
after that raises ``TransportError`` naming the address it tried.

Timeouts, as in gloo: the ``timeout`` given to ``init_process_group`` (or
``new_group``; torch's default is 30 minutes) is the deadline of every
collective, counted from when the collective starts running (after the ones
queued before it). A collective that cannot complete in that time (a rank
never calls it, a peer died) raises ``TransportError`` naming the timeout,
whether it was waiting at a new stream's store barrier or inside a round.
The transport's own ``round_timeout`` is not used by the backend (a warning
says so if it was set). ``Work.wait(timeout)`` raises after ``timeout`` if the
collective has not completed by then; the collective itself keeps running and
completes or fails at the group's deadline.

Collectives run in order on one worker thread per process group and return a
Work whose future completes when the round does, so DDP overlaps a bucket's
round with the rest of backward. A failed round fails every later collective
of the group (the streams' round counters no longer agree across ranks).
``DblpProcessGroup.stats()`` returns every stream's ``RoundStats``.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .config import SECRET_ENV, TransportConfig
from .errors import PeerTimeout, TransportError
from .group import TransportGroup
from .stats import RoundStats

#: The name ``init_process_group`` takes.
BACKEND = "dblp"
#: Store keys of this backend live under this prefix (the store is already per group).
_KEY = "dblp"
#: Smallest exact stream (halfwords): small collectives share one stream.
_MIN_EXACT = 64
#: The longest deadline a stream's rounds take (TransportConfig.round_timeout's upper limit).
_MAX_DEADLINE_S = 86400.0

log = logging.getLogger("dblp")

#: What the backend does: the torch.distributed call -> how it travels. docs/transport.md
#: lists exactly these (a test holds it to them).
SUPPORTED = {
    "all_reduce": "floating SUM/AVG: the loss bound; other ops and dtypes: exact",
    "all_reduce_coalesced": "as all_reduce, the tensors in one round",
    "reduce_scatter": "all_reduce of the whole input, each rank keeps its shard",
    "reduce_scatter_tensor": "all_reduce of the whole input, each rank keeps its shard",
    "broadcast": "exact",
    "all_gather": "exact",
    "all_gather_into_tensor": "exact",
    "barrier": "exact",
}
#: c10d method -> the torch.distributed call a user made; each raises NotImplementedError.
REFUSED = {
    "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "alltoall": "all_to_all", "all_to_all_single": "all_to_all_single",
    "alltoall_base": "all_to_all_single", "allgather_coalesced": "all_gather_coalesced",
    "send": "send", "recv": "recv", "recv_anysource": "recv",
}

# c10d's stubs type the Python-facing overloads of ProcessGroup's methods
# (``allreduce(tensor, op)``...), not the ``(tensors, opts)`` form its C++
# trampoline calls a Python subclass with; and they omit the helper that wraps
# ``Work`` for a Python subclass. Both are used as c10d's Python process groups use them.
_ProcessGroup: Any = dist.ProcessGroup
_WorkBase: Any = torch._C._distributed_c10d.Work

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_LOSSY_OPS = ("SUM", "AVG")  # on floating tensors: the configured bound
_INT_OPS = ("BAND", "BOR", "BXOR")  # integer and bool tensors only
_EXACT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG") + _INT_OPS


def options(**settings) -> TransportConfig:
    """A ``TransportConfig`` for the backend: ``mode="sharded"`` plus ``settings``.

    The job's secret comes from ``$DBLP_SECRET`` unless ``secret`` is given: it
    is the one way to hand every rank the key without sending it anywhere.
    """
    env_secret = os.environ.get(SECRET_ENV)
    if "secret" not in settings and env_secret:
        settings["secret"] = env_secret
    return TransportConfig(**{"mode": "sharded", **settings})


def _check_config(cfg: TransportConfig) -> TransportConfig:
    if not isinstance(cfg, TransportConfig):
        raise ValueError(f"pg_options of the dblp backend must be a dblp.TransportConfig, got "
                         f"{type(cfg).__name__}")
    if cfg.mode != "sharded":
        raise ValueError("the dblp torch.distributed backend runs mode='sharded' (every rank "
                         "aggregates a shard; torchrun starts no parameter server): pass "
                         "dblp.torch_backend.options(...) or TransportConfig(mode='sharded', ...)")
    if cfg.control != "udp":
        raise ValueError("the dblp torch.distributed backend supports control='udp' only "
                         "(control='tcp' needs parameter-server mode)")
    return cfg


def _reduce_op_name(opts) -> str:
    op = getattr(opts, "reduceOp", opts)
    op = getattr(op, "op", op)  # a ReduceOp wraps a RedOpType
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    return str(name).upper()


# -- exact transport of bytes --------------------------------------------------------------
def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of ``t`` (a copy, C order)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def _write_bytes(t: torch.Tensor, raw: np.ndarray) -> None:
    src = torch.from_numpy(np.ascontiguousarray(raw)).view(t.dtype).reshape(t.shape)
    with torch.no_grad():
        t.copy_(src)


def _halves(nbytes: int) -> int:
    return (nbytes + 1) // 2


def _exact_size(halves: int) -> int:
    return max(_MIN_EXACT, 1 << max(0, halves - 1).bit_length())


class DblpWork(_WorkBase):
    """A collective in flight: ``wait()`` blocks until its round is done and raises its error.

    (c10d's wrapper of a bare Future waits but swallows the error, so a failed
    synchronous ``dist.all_reduce`` would return as if it had worked.) DDP
    takes ``get_future()`` and reads the reduced bucket from its value.
    """

    def __init__(self, fut: torch.futures.Future, what: str, group_timeout_s: float):
        super().__init__()
        self._fut = fut
        self._what = what
        self._group_timeout_s = group_timeout_s
        self._done = threading.Event()
        done = self._done
        fut.add_done_callback(lambda _f: done.set())

    def wait(self, timeout=None) -> bool:
        """Block until the collective is done; raise its error, or ``TransportError`` at ``timeout``.

        ``timeout``: a ``timedelta`` or seconds; None or zero (c10d's "no
        timeout") waits as long as the collective runs (at most the group's timeout).
        """
        seconds = _seconds(timeout)
        if seconds > 0 and not self._done.wait(seconds):
            raise TransportError(
                f"dblp backend: Work.wait(timeout={seconds:g} s) timed out: the {self._what} "
                f"has not completed (it keeps running, and fails at the process group's "
                f"timeout of {self._group_timeout_s:g} s if it cannot complete)")
        self._fut.wait()  # raises the collective's exception
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()


class DblpProcessGroup(_ProcessGroup):
    """A torch.distributed process group whose collectives run over DBLP streams.

    Built by ``init_process_group("dblp")`` (through ``_create``); its
    arguments are what c10d hands a backend: the group's store, rank, size,
    the collective timeout, and the ``TransportConfig``.
    """

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 config: TransportConfig, host: str):
        super().__init__(rank, size)
        self.config = _check_config(config)
        # Exact streams: bound 0 whatever the user's policy, plain zero-fill (nothing is
        # missing at bound 0), no residuals.
        self.exact_config = dataclasses.replace(config, policy="reliable", missing="zero")
        self._store = store
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._host = host
        #: Every collective's deadline in seconds: init_process_group's timeout, as in gloo.
        self.timeout_s = min(max(_seconds(timeout), 1e-3), _MAX_DEADLINE_S)
        self._deadline = 0.0  # monotonic deadline of the collective running now
        default_round = next(f.default for f in dataclasses.fields(TransportConfig)
                             if f.name == "round_timeout")
        if rank == 0 and config.round_timeout not in (default_round, self.timeout_s):
            log.warning("dblp backend: round_timeout=%g in the transport settings is not used; "
                        "collectives end at the timeout given to init_process_group (%g s)",
                        config.round_timeout, self.timeout_s)
        self._streams: dict[tuple[str, int], TransportGroup] = {}
        self._last: TransportGroup | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name=f"dblp-pg-rank{rank}",
                                        daemon=True)
        self._thread.start()

    def getBackendName(self) -> str:
        return BACKEND

    # c10d names every group (``pg._set_group_name``), but a ProcessGroup subclass
    # keeps the name on its registered backends, and this group registers none: without
    # these two, ``pg.group_name`` raises "ProcessGroup name not set" and DeviceMesh
    # (hence FSDP2's ``fully_shard``) cannot use the group.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def __repr__(self) -> str:
        return f"DblpProcessGroup(rank={self._rank}, size={self._size}, {self.config!r})"

    # -- the worker thread: one collective at a time, in call order -----------------------
    def _worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut, result, _work = job
            if self._failed is not None:
                fut.set_exception(TransportError(
                    f"dblp backend: an earlier collective failed ({self._failed}); the group "
                    "cannot continue"))
                continue
            self._deadline = time.monotonic() + self.timeout_s
            try:
                fn()
            except BaseException as exc:  # handed to whoever waits on the Work
                self._failed = exc
                fut.set_exception(exc)
                continue
            fut.set_result(result)

    def _submit(self, fn: Callable[[], None], result: Any, what: str):
        if self._closed:
            raise TransportError("dblp backend: the process group is shut down")
        fut: torch.futures.Future = torch.futures.Future()
        work = DblpWork(fut, what, self.timeout_s)
        self._jobs.put((fn, fut, result, work))  # the job keeps the Python Work alive
        return work

    # -- streams ----------------------------------------------------------------------------
    def _stream(self, kind: str, numel: int) -> TransportGroup:
        """The stream for (kind, numel), joining it first if this is its first use."""
        key = (kind, numel)
        g = self._streams.get(key)
        if g is not None:
            return g
        cfg = self.config if kind == "grad" else self.exact_config
        # Every member is alive once the store barrier below passes, so the UDP join
        # itself only needs a few round trips: silence beyond hello_timeout means the
        # aggregator's address does not work.
        cfg = dataclasses.replace(cfg, join_timeout=cfg.hello_timeout,
                                  round_timeout=self.timeout_s)
        name = f"{_KEY}/{kind}/{numel}"
        store, rank, size = self._store, self._rank, self._size
        if rank == 0:
            # Every stream of the group shares its session and secret and counts rounds
            # from 0: its own number in the key derivation (wire version 5) keeps one
            # stream's datagram from verifying in another. Rank 0 numbers them as it
            # makes them and publishes the number before the address the others wait for.
            stream = len(self._streams) + 1
            cfg = dataclasses.replace(cfg, stream=stream)
            g = TransportGroup(0, size, self._host, 0, config=cfg)
            store.set(f"{name}/stream", str(stream))
            store.set(f"{name}/addr", f"{self._host}:{g.master_port}")
        arrived = store.add(f"{name}/arrived", 1)
        if arrived == size:
            store.set(f"{name}/ready", "1")
        left = max(1e-3, self._deadline - time.monotonic())
        try:
            store.wait([f"{name}/ready", f"{name}/addr"], datetime.timedelta(seconds=left))
        except Exception as exc:  # the store's timeout (DistStoreError), or the store is gone
            if rank == 0:
                assert g is not None
                g.engine.close()
            try:
                arrived = store.add(f"{name}/arrived", 0)
            except Exception:  # the store is gone: the count at our arrival will do
                pass
            raise TransportError(
                f"dblp backend: rank {rank}: the collective did not complete within the "
                f"process group's timeout of {self.timeout_s:g} s (init_process_group's "
                f"timeout): {arrived} of {size} ranks reached stream {kind}/{numel} "
                f"(did a rank not call the same collective?): {exc}") from exc
        if rank != 0:
            host, port = store.get(f"{name}/addr").decode().rsplit(":", 1)
            cfg = dataclasses.replace(cfg, stream=int(store.get(f"{name}/stream")))
            g = TransportGroup(rank, size, host, int(port), config=cfg)
        assert g is not None
        self._streams[key] = g
        return g

    def _round(self, kind: str, flat: np.ndarray) -> None:
        """One DBLP round of ``flat`` (float32) on its stream: ``flat`` becomes the mean."""
        g = self._stream(kind, int(flat.size))
        self._last = g
        # The round gets what is left of the collective's deadline.
        g.round_timeout = max(1e-3, self._deadline - time.monotonic())
        try:
            g.allreduce_(flat)
        except TransportError as exc:
            if g.numel is None:  # the join failed, not a round
                where = f"{g.master_ip}:{g.master_port}"
                raise TransportError(
                    f"dblp backend: rank {self._rank} cannot reach its aggregator (rank 0) "
                    f"at {where} (UDP) for stream {kind}/{flat.size}: {exc}") from exc
            if isinstance(exc, PeerTimeout):
                raise TransportError(
                    f"dblp backend: rank {self._rank}: the collective did not complete within "
                    f"the process group's timeout of {self.timeout_s:g} s (init_process_group's "
                    f"timeout): {exc}") from exc
            raise

    def _exact_sum(self, data: np.ndarray) -> np.ndarray:
        """Sum over ranks of ``data`` (uint16 halfwords, at most one rank nonzero per slot)."""
        n = int(data.size)
        buf = np.zeros(_exact_size(n), np.float32)
        buf[:n] = data
        self._round("exact", buf)
        buf *= np.float32(self._size)
        return np.rint(buf[:n]).astype(np.uint16)

    def _gather_bytes(self, raw: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``raw`` (same length everywhere), exactly, in rank order."""
        h = _halves(raw.size)
        slots = np.zeros(h * self._size, np.uint16)
        padded = np.zeros(2 * h, np.uint8)
        padded[:raw.size] = raw
        slots[self._rank * h:(self._rank + 1) * h] = padded.view(np.uint16)
        out = self._exact_sum(slots)
        return [out[r * h:(r + 1) * h].view(np.uint8)[:raw.size] for r in range(self._size)]

    # -- collectives --------------------------------------------------------------------------
    def _reduce_in_place(self, tensors: list[torch.Tensor], op: str) -> None:
        """All-reduce ``tensors`` with ``op`` (checked by ``_check_reduce``), on this thread."""
        if op in _LOSSY_OPS and all(t.dtype in _FLOAT_DTYPES for t in tensors):
            self._lossy_allreduce(tensors, op)
        else:
            self._exact_allreduce(tensors, op)

    def allreduce(self, tensors, opts=None):
        tensors = _tensor_list(tensors, "all_reduce")
        op = _reduce_op_name(opts) if opts is not None else "SUM"
        _check_reduce(tensors, op, "all_reduce")  # before anything runs: the group stays usable
        return self._submit(lambda: self._reduce_in_place(tensors, op), tensors, "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _lossy_allreduce(self, tensors: list[torch.Tensor], op: str) -> None:
        # A lone contiguous float32 tensor (a DDP bucket) is reduced in place; anything
        # else goes through one flat float32 copy.
        flats = [t.detach().reshape(-1).to(torch.float32) for t in tensors]
        flat = flats[0].contiguous() if len(flats) == 1 else torch.cat(flats)
        if flat.numel() == 0:
            return
        arr = flat.numpy()
        self._round("grad", arr)
        if op == "SUM":
            arr *= np.float32(self._size)
        if len(tensors) > 1 or flat.data_ptr() != tensors[0].data_ptr():
            _scatter_back(tensors, flat)

    def _exact_allreduce(self, tensors: list[torch.Tensor], op: str) -> None:
        for t in tensors:
            parts = self._gather_bytes(_as_bytes(t))
            stack = torch.stack([torch.from_numpy(np.ascontiguousarray(p)).view(t.dtype)
                                 .reshape(t.shape) for p in parts])
            with torch.no_grad():
                t.copy_(_reduce_stack(stack, op))

    def _reduce_scatter_job(self, pairs: list[tuple[torch.Tensor, list[torch.Tensor]]],
                            op: str) -> Callable[[], None]:
        """Each (output, the N input shards): all_reduce of the shards, keep this rank's."""
        def run() -> None:
            for out, shards in pairs:
                whole = torch.cat([x.detach().reshape(-1) for x in shards])
                self._reduce_in_place([whole], op)
                n = out.numel()
                with torch.no_grad():
                    out.copy_(whole[self._rank * n:(self._rank + 1) * n].view(out.shape))
        return run

    def _shards(self, out: torch.Tensor, shards: list[torch.Tensor], what: str) -> None:
        if len(shards) != self._size or any(x.numel() != out.numel() for x in shards):
            raise ValueError(f"dblp backend: {what} needs {self._size} input shards of "
                             f"{out.numel()} elements (the output's size), got "
                             f"{[x.numel() for x in shards]}")
        if any(x.dtype != out.dtype for x in shards):
            raise ValueError(f"dblp backend: {what}: input and output dtypes differ")

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        outs = _tensor_list(output_tensors, "reduce_scatter")
        if len(outs) != 1 or len(input_tensors) != 1:
            raise NotImplementedError("dblp backend: reduce_scatter takes one output tensor "
                                      "(one device) per call")
        shards = _tensor_list(input_tensors[0], "reduce_scatter")
        self._shards(outs[0], shards, "reduce_scatter")
        op = _reduce_op_name(opts) if opts is not None else "SUM"
        _check_reduce(shards, op, "reduce_scatter")
        return self._submit(self._reduce_scatter_job([(outs[0], shards)], op), outs,
                            "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``: ``input`` is the N shards concatenated (or stacked)."""
        pairs = self._single_pairs([output], [input], "reduce_scatter_tensor")
        op = _reduce_op_name(opts) if opts is not None else "SUM"
        _check_reduce([input], op, "reduce_scatter_tensor")
        return self._submit(self._reduce_scatter_job(pairs, op), [output],
                            "reduce_scatter_tensor")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        pairs = self._single_pairs(outputs, inputs, "reduce_scatter_tensor")
        op = _reduce_op_name(opts) if opts is not None else "SUM"
        _check_reduce(list(inputs), op, "reduce_scatter_tensor")
        return self._submit(self._reduce_scatter_job(pairs, op), list(outputs),
                            "reduce_scatter_tensor (coalesced)")

    _reduce_scatter_base = reduce_scatter_single  # the names of older torch versions
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _single_pairs(self, outputs, inputs, what: str
                      ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        outputs, inputs = _tensor_list(outputs, what), _tensor_list(inputs, what)
        if len(outputs) != len(inputs):
            raise ValueError(f"dblp backend: {what}: {len(outputs)} outputs, {len(inputs)} inputs")
        pairs = []
        for out, inp in zip(outputs, inputs, strict=True):
            if inp.numel() != out.numel() * self._size:
                raise ValueError(f"dblp backend: {what}: input of {inp.numel()} elements is "
                                 f"not {self._size} x the output's {out.numel()}")
            if out.numel():  # nothing to reduce for an empty shard
                shards = list(inp.reshape(-1).chunk(self._size))
                self._shards(out, shards, what)
                pairs.append((out, shards))
        return pairs

    def broadcast(self, tensors, opts=None):
        tensors = _tensor_list(tensors, "broadcast")
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        if not 0 <= root < self._size:
            raise ValueError(f"broadcast root {root} is not a rank of a group of {self._size}")

        def run() -> None:
            raws = [_as_bytes(t) for t in tensors]
            sizes = [r.size for r in raws]
            raw = np.concatenate(raws) if raws else np.zeros(0, np.uint8)
            h = _halves(raw.size)
            data = np.zeros(h, np.uint16)
            if self._rank == root:
                padded = np.zeros(2 * h, np.uint8)
                padded[:raw.size] = raw
                data = padded.view(np.uint16).copy()
            if h:
                data = self._exact_sum(data)
            out = data.view(np.uint8)
            off = 0
            for t, n in zip(tensors, sizes, strict=True):
                _write_bytes(t, out[off:off + n])
                off += n
        return self._submit(run, tensors, "broadcast")

    def _allgather_job(self, pairs: list[tuple[list[torch.Tensor], torch.Tensor]]
                       ) -> Callable[[], None]:
        def run() -> None:
            for outs, inp in pairs:
                for o, p in zip(outs, self._gather_bytes(_as_bytes(inp)), strict=True):
                    _write_bytes(o, p)
        return run

    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = _tensor_list(input_tensors, "all_gather")
        if len(inputs) != 1 or len(output_tensors) != 1:
            raise NotImplementedError("dblp backend: all_gather takes one input tensor "
                                      "(one device) per call")
        outs = _tensor_list(output_tensors[0], "all_gather")
        if len(outs) != self._size:
            raise ValueError(f"all_gather needs {self._size} output tensors, got {len(outs)}")
        return self._submit(self._allgather_job([(outs, inputs[0])]), output_tensors,
                            "all_gather")

    def _gather_pairs(self, outputs, inputs, what: str
                      ) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        outputs, inputs = _tensor_list(outputs, what), _tensor_list(inputs, what)
        if len(outputs) != len(inputs):
            raise ValueError(f"dblp backend: {what}: {len(outputs)} outputs, {len(inputs)} inputs")
        pairs = []
        for out, inp in zip(outputs, inputs, strict=True):
            if out.numel() != inp.numel() * self._size or out.dtype != inp.dtype:
                raise ValueError(f"dblp backend: {what}: output of {out.numel()} {out.dtype} "
                                 f"is not {self._size} x the input's {inp.numel()} {inp.dtype}")
            if not out.is_contiguous():
                raise ValueError(f"dblp backend: {what}: the output must be contiguous")
            if inp.numel():  # nothing to gather from empty inputs
                pairs.append(([c.view(inp.shape) for c in out.view(-1).chunk(self._size)], inp))
        return pairs

    def all_gather_single(self, output, input, opts=None):
        """``all_gather_into_tensor``: the N inputs concatenated (or stacked) into ``output``."""
        return self._submit(self._allgather_job(self._gather_pairs(
            [output], [input], "all_gather_into_tensor")), [output], "all_gather_into_tensor")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._submit(self._allgather_job(self._gather_pairs(
            outputs, inputs, "all_gather_into_tensor")), list(outputs),
            "all_gather_into_tensor (coalesced)")

    _allgather_base = all_gather_single  # the names of older torch versions
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def barrier(self, opts=None):
        def run() -> None:
            self._exact_sum(np.zeros(1, np.uint16))
        return self._submit(run, [], "barrier")

    # -- introspection and teardown ---------------------------------------------------------
    def stats(self) -> dict[str, list[RoundStats]]:
        """Every stream's per-round statistics, keyed ``"grad/<numel>"`` or ``"exact/<n>"``."""
        return {f"{k}/{n}": list(g.history) for (k, n), g in self._streams.items()}

    def shutdown(self) -> None:
        """Finish queued collectives, answer stragglers of the last stream, close sockets."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join()
        for g in self._streams.values():
            if g is self._last:
                g.close()  # lingers briefly: a peer may still want our DONE
            else:
                g.engine.close()
        self._streams.clear()

    def abort(self) -> None:
        self.shutdown()


def _unsupported(method: str, name: str):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError(
            f"dblp backend: {name} is not supported (this backend implements "
            f"{', '.join(SUPPORTED)}: what DistributedDataParallel and FSDP need); "
            f"create a gloo group for {name}: dist.new_group(backend='gloo')")
    refuse.__name__ = method
    return refuse


for _method, _name in REFUSED.items():
    setattr(DblpProcessGroup, _method, _unsupported(_method, _name))


def _check_reduce(tensors: list[torch.Tensor], op: str, what: str) -> None:
    """Refuse an op the backend cannot do, naming it, before anything is queued."""
    for t in tensors:
        floating = t.is_floating_point()
        if op not in _EXACT_OPS or (op in _INT_OPS and floating) \
                or (op == "AVG" and not floating):
            raise NotImplementedError(f"dblp backend: {what} with op {op} on {t.dtype} "
                                      f"(supported: SUM and AVG of floating tensors over the "
                                      f"loss bound; SUM, PRODUCT, MIN, MAX exactly; bitwise "
                                      f"ops on integers)")


def _seconds(timeout) -> float:
    """A c10d timeout (``timedelta``, seconds, or None) in seconds; 0 means none."""
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _tensor_list(tensors, what: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected tensors, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"dblp backend: {what} of a {t.device.type} tensor; the backend "
                             "is CPU only")
        if t.is_complex():
            raise NotImplementedError(f"dblp backend: {what} of complex tensors")
    return tensors


def _scatter_back(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[off:off + n].view(t.shape).to(t.dtype))
            off += n


def _reduce_stack(stack: torch.Tensor, op: str) -> torch.Tensor:
    """``op`` over the ranks (dim 0), the same arithmetic in the same order on every rank."""
    if op == "SUM":
        return stack.sum(0, dtype=stack.dtype)
    if op == "PRODUCT":
        return stack.prod(0, dtype=stack.dtype)
    if op == "MIN":
        return stack.min(0).values
    if op == "MAX":
        return stack.max(0).values
    if op == "AVG":  # floating only (checked by allreduce)
        return stack.mean(0)
    fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    out = stack[0]
    for x in stack[1:]:
        out = fn(out, x)
    return out


def _store_host(store) -> str:
    """The store's host: MASTER_ADDR, else the host of the (wrapped) TCPStore, else loopback."""
    host = os.environ.get("MASTER_ADDR")
    s = store
    for _ in range(8):
        if host:
            break
        host = getattr(s, "host", None)
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    return host or "127.0.0.1"


def _advertised_host(store) -> str:
    """The address a group's rank 0 tells its members to join at: its own, not the store's.

    Every group of a job shares one store (the world's rank 0's host), but a subgroup
    such as ``new_group([1, 2])`` is led by its own rank 0, which may sit on another
    host. Its address on the path to the store's host is the one the others reach it
    at: a UDP socket ``connect()``-ed there (no packet is sent) names it in
    ``getsockname()``. With the store on loopback that is 127.0.0.1; on the store's
    own host, the store's address.
    """
    host = _store_host(store)
    try:
        store_ip = socket.gethostbyname(host)
    except OSError:
        raise ValueError(f"dblp backend: MASTER_ADDR {host!r} does not resolve") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((store_ip, 9))
            own = s.getsockname()[0]
        except OSError:  # no route to the store's host: the members could not reach us anyway
            return store_ip
    return store_ip if own == "0.0.0.0" else own


def _create(backend_opts, pg_options) -> DblpProcessGroup:
    """c10d's creator (extended API): ``backend_opts`` has store, rank, size, timeout."""
    if pg_options is None:
        env = os.environ
        overrides = {} if "DBLP_MODE" in env else {"mode": "sharded"}
        pg_options = TransportConfig.from_env(env, **overrides)
    store = backend_opts.store
    return DblpProcessGroup(store, backend_opts.group_rank, backend_opts.group_size,
                            backend_opts.timeout, pg_options, _advertised_host(store))


def register() -> None:
    """Register the backend name with torch.distributed (done on import; idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


register()
