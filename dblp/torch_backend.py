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
* ``all_reduce`` of floating tensors with SUM or AVG (DDP's gradient buckets):
  the configured loss bound and policy. One DBLP stream (its own
  ``TransportGroup``: one UDP socket per rank, its own policy state and round
  counter) per distinct element count, so each DDP bucket keeps its size and
  its own phase detection, and nothing is padded; DDP's buckets are a handful
  of fixed sizes (they change once, after the first iteration). SUM is the
  transport's mean times the world size.
* ``broadcast``, ``all_gather`` (and ``all_gather_into_tensor``), ``barrier``,
  and ``all_reduce`` of anything else (integers, MIN/MAX/PRODUCT/bitwise
  ops): exact, over reliable (bound 0) streams of the same transport. The
  bytes of the tensors travel as 16-bit integers held in float32 (exact
  through the transport's sum and its division by N), one rank's slot filled
  and the others zero; all_reduce of these kinds is an all_gather then the
  same reduction, in rank order, on every rank. These streams are keyed by
  size rounded up to a power of two, so arbitrary sizes cost a few sockets.
* Everything else (reduce, gather, scatter, reduce_scatter, all_to_all,
  send/recv) raises ``NotImplementedError`` naming the operation.

Joining a stream: rank 0 binds an ephemeral UDP port and publishes it in the
process group's store (torchrun's TCPStore); every rank then meets at a store
barrier, so all members are known alive when the UDP join starts. A member
whose aggregator does not answer within ``hello_timeout`` (5 s by default)
after that raises ``TransportError`` naming the address it tried.

Timeouts: ``round_timeout`` (30 s by default) bounds how long a rank waits
inside a collective, including for a peer that is still computing; raise it
in the options if ranks may drift apart longer (e.g. rank-0-only evaluation
between steps).

Collectives run in order on one worker thread per process group and return a
Work whose future completes when the round does, so DDP overlaps a bucket's
round with the rest of backward. A failed round fails every later collective
of the group (the streams' round counters no longer agree across ranks).
``DblpProcessGroup.stats()`` returns every stream's ``RoundStats``.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .config import SECRET_ENV, TransportConfig
from .errors import TransportError
from .group import TransportGroup
from .stats import RoundStats

#: The name ``init_process_group`` takes.
BACKEND = "dblp"
#: Store keys of this backend live under this prefix (the store is already per group).
_KEY = "dblp"
#: Smallest exact stream (halfwords): small collectives share one stream.
_MIN_EXACT = 64

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

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None) -> bool:
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
            try:
                fn()
            except BaseException as exc:  # handed to whoever waits on the Work
                self._failed = exc
                fut.set_exception(exc)
                continue
            fut.set_result(result)

    def _submit(self, fn: Callable[[], None], result: Any):
        if self._closed:
            raise TransportError("dblp backend: the process group is shut down")
        fut: torch.futures.Future = torch.futures.Future()
        work = DblpWork(fut)
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
        cfg = dataclasses.replace(cfg, join_timeout=cfg.hello_timeout)
        name = f"{_KEY}/{kind}/{numel}"
        store, rank, size = self._store, self._rank, self._size
        if rank == 0:
            g = TransportGroup(0, size, self._host, 0, config=cfg)
            store.set(f"{name}/addr", f"{self._host}:{g.master_port}")
        if store.add(f"{name}/arrived", 1) == size:
            store.set(f"{name}/ready", "1")
        store.wait([f"{name}/ready", f"{name}/addr"], self._timeout)
        if rank != 0:
            host, port = store.get(f"{name}/addr").decode().rsplit(":", 1)
            g = TransportGroup(rank, size, host, int(port), config=cfg)
        assert g is not None
        self._streams[key] = g
        return g

    def _round(self, kind: str, flat: np.ndarray) -> None:
        """One DBLP round of ``flat`` (float32) on its stream: ``flat`` becomes the mean."""
        g = self._stream(kind, int(flat.size))
        self._last = g
        try:
            g.allreduce_(flat)
        except TransportError as exc:
            if g.numel is None:  # the join failed, not a round
                where = f"{g.master_ip}:{g.master_port}"
                raise TransportError(
                    f"dblp backend: rank {self._rank} cannot reach its aggregator (rank 0) "
                    f"at {where} (UDP) for stream {kind}/{flat.size}: {exc}") from exc
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
    def allreduce(self, tensors, opts=None):
        tensors = _tensor_list(tensors, "all_reduce")
        op = _reduce_op_name(opts) if opts is not None else "SUM"
        for t in tensors:  # refused here, before anything runs: the group stays usable
            floating = t.is_floating_point()
            if op not in _EXACT_OPS or (op in _INT_OPS and floating) \
                    or (op == "AVG" and not floating):
                raise NotImplementedError(f"dblp backend: all_reduce with op {op} on {t.dtype}")
        if op in _LOSSY_OPS and all(t.dtype in _FLOAT_DTYPES for t in tensors):
            return self._submit(lambda: self._lossy_allreduce(tensors, op), tensors)
        return self._submit(lambda: self._exact_allreduce(tensors, op), tensors)

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
        return self._submit(run, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = _tensor_list(input_tensors, "all_gather")
        if len(inputs) != 1 or len(output_tensors) != 1:
            raise NotImplementedError("dblp backend: all_gather takes one input tensor "
                                      "(one device) per call")
        outs = list(output_tensors[0])
        if len(outs) != self._size:
            raise ValueError(f"all_gather needs {self._size} output tensors, got {len(outs)}")

        def run() -> None:
            for o, p in zip(outs, self._gather_bytes(_as_bytes(inputs[0])), strict=True):
                _write_bytes(o, p)
        return self._submit(run, output_tensors)

    def _allgather_base(self, output, input, opts=None):
        chunks = list(output.reshape(-1).chunk(self._size))
        work = self.allgather([[c.view(input.shape) for c in chunks]], [input], opts)
        return work

    def barrier(self, opts=None):
        def run() -> None:
            self._exact_sum(np.zeros(1, np.uint16))
        return self._submit(run, [])

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
            f"dblp backend: {name} is not supported (this backend implements all_reduce, "
            "broadcast, all_gather and barrier: what DistributedDataParallel needs); "
            f"create a gloo group for {name}: dist.new_group(backend='gloo')")
    refuse.__name__ = method
    return refuse


# c10d method -> the torch.distributed call a user made
for _method, _name in (("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
                       ("reduce_scatter", "reduce_scatter"),
                       ("_reduce_scatter_base", "reduce_scatter_tensor"),
                       ("alltoall", "all_to_all"), ("alltoall_base", "all_to_all_single"),
                       ("send", "send"), ("recv", "recv"), ("recv_anysource", "recv")):
    setattr(DblpProcessGroup, _method, _unsupported(_method, _name))


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


def _advertised_host(store) -> str:
    """The address members reach rank 0 at: MASTER_ADDR, else the store's host."""
    host = os.environ.get("MASTER_ADDR")
    s = store
    for _ in range(8):
        if host:
            break
        host = getattr(s, "host", None)
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    host = host or "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ValueError(f"dblp backend: MASTER_ADDR {host!r} does not resolve") from None


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
